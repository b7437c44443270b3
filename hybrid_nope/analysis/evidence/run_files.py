"""What a run directory holds, read as plain numbers (no model is run): records, the latest
extrapolation and init-null analyses, and the per-cluster sums that pair two steps of a run."""
from __future__ import annotations

import collections
import fnmatch
import glob
import json
import os
from typing import Sequence

import numpy as np

from hybrid_nope import sweep
from hybrid_nope.run import run_dir, storage
from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.run import checkpoints
from hybrid_nope.analysis.measure import records
from hybrid_nope.run.reader import RunReader, open_readonly


def read_jsonl(path: str) -> list[dict]:
  """A run's records (`storage.read_jsonl`: a live run's torn last line is dropped)."""
  if not storage.exists(path):
    raise checkpoints.WorkdirError(f"{path} does not exist (written by launch/train.py)")
  return storage.read_jsonl(path)


def latest_extrapolation(run: RunReader) -> dict | None:
  """The newest analysis/step_<N>/extrapolation.json (through storage: workdirs may be URLs)."""
  rd = run.layout
  for step in reversed(rd.analysis_steps()):
    path = storage.join(rd.analysis_dir(step), run_dir.EXTRAPOLATION_FILE)
    if storage.exists(path):
      return json.loads(storage.read_text(path))
  return None


def latest_init_null(run: RunReader) -> dict | None:
  """The summary moments of the newest analysis/step_<N>/init_null_T<T>.json at the training
  length, or None."""
  found = init_null_file(run)
  return found["summary"] if found else None


def init_null_file(run: RunReader) -> dict | None:
  """The whole newest analysis/step_<N>/init_null_T<T>.json (per-record moments and, since
  they were kept, each draw's value), or None."""
  rd = run.layout
  for step in reversed(rd.analysis_steps()):
    files = fnmatch.filter(storage.listdir(rd.analysis_dir(step)),
                           run_dir.wildcard(run_dir.INIT_NULL_FILE))
    if files:
      return json.loads(storage.read_text(storage.join(rd.analysis_dir(step), sorted(files)[0])))
  return None


def latest_ablation(run: RunReader) -> dict | None:
  """The newest analysis/step_<N>/ablation_T<T>.json (the causal test) at the smallest T
  there, or None (a run analysed without --ablate=local, or with no local mixer)."""
  rd = run.layout
  for step in reversed(rd.analysis_steps()):
    lengths = [t for name in storage.listdir(rd.analysis_dir(step))
               if (t := run_dir.number_in(run_dir.ABLATION_FILE, name)) is not None]
    if lengths:
      path = storage.join(rd.analysis_dir(step),
                          run_dir.ABLATION_FILE.format(seq_len=min(lengths)))
      return json.loads(storage.read_text(path))
  return None


def read_sums(run: RunReader, step: int) -> tuple[dict, tuple, int] | None:
  """The per-cluster sums of one measurement (recency_sums/step_<N>.npz), or None."""
  path = run.layout.recency_sums_file(step)
  if not storage.exists(path):
    return None
  return records.decode_sums(storage.read_bytes(path))


def summary_keys(step_records: Sequence[dict]) -> list[str]:
  """The sums keys of the boundaries the run summary averages (global layers' inputs)."""
  return [f"{r['layer']}/{r['module']}" for r in step_records
          if r["layer_type"] == "global" and r["module"] == report.SUMMARY_MODULE]


def since_init(run: RunReader, by_step_records: dict) -> dict:
  """The run gap's change from step 0 to the last step, with its SE paired over the probe's
  documents (both steps measure the same probe), from the two steps' per-cluster sums."""
  final = max(by_step_records)
  init, last = read_sums(run, 0), read_sums(run, final)
  if init is None or last is None or final == 0:
    return {"gap_since_init": None, "gap_since_init_stderr": None}
  keys = summary_keys(by_step_records[final])
  (s0, lags, far), (s1, _, _) = init, last
  terms = (records.mean_gap_terms(s1, keys, lags, far)
           + records.mean_gap_terms(s0, keys, lags, far, sign=-1.0))
  value = sum(a * np.sum(sc) / np.sum(nc) for a, sc, nc in terms)
  return {"gap_since_init": float(value),
          "gap_since_init_stderr": records.paired_stderr(terms)}


def unpack_all(records_dir: str, into: str) -> dict[str, dict[int, RunReader]]:
  """experiment -> seed -> the unpacked run directory's reader."""
  runs: dict[str, dict[int, RunReader]] = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(records_dir, "*", "seed*.tar.gz"))):
    experiment = os.path.basename(os.path.dirname(path))
    seed = int(os.path.basename(path)[len("seed"):-len(".tar.gz")])
    runs[experiment][seed] = open_readonly(sweep.unpack_records(
        path, os.path.join(into, experiment, f"seed{seed}")))
  return dict(runs)
