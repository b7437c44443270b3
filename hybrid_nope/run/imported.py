"""A new workdir written from a model made elsewhere (export/import_workdir.py maps it): the
params as one checkpoint, by the trainer's own Checkpointer (a checksum of every leaf, which
every reader verifies), the tokenizer files it carries, and config.json, written last so a cut
import is no workdir a reader takes for whole."""
from __future__ import annotations

import os

import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.run.checkpoint import Checkpointer, TrainState
from hybrid_nope.run.run_dir import RunDir


def write_imported(out: str, config, params: dict, *, step: int, meta: dict,
                   tokenizer_files=()) -> list[str]:
  """Writes the workdir `out`: `params` as checkpoint `step` (no optimizer state: not a run to
  resume) with `meta`, `tokenizer_files` copied into its tokenizer/, and `config`; returns the
  paths written."""
  files = [_save(out, config, params, step, meta)]
  layout = RunDir(out)
  if tokenizer_files:
    storage.makedirs(layout.tokenizer)
    for path in tokenizer_files:
      files.append(storage.join(layout.tokenizer, os.path.basename(path)))
      with open(path, "rb") as f:
        storage.write_bytes(files[-1], f.read())
  storage.write_text(layout.config, config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  files.append(layout.config)
  return files


def _save(out: str, config, params: dict, step: int, meta: dict) -> str:
  # Host numpy leaves, saved as they are: no second copy, and no accelerator memory needed.
  state = TrainState(step=np.int32(step), params=params, opt_state=())
  ckpt = Checkpointer(out, keep=1, directory=config.checkpoint.directory)
  try:
    ckpt.save(step, state, meta)
    ckpt.wait()
  finally:
    ckpt.close()
  return ckpt.step_directory(step)
