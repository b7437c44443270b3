"""A run's config and parameters, restored for analysis on whatever devices this machine has.

A workdir written by `launch/train.py` holds `config.json` (the run's full config) and
`checkpoints/<step>/` (orbax: item "state" = TrainState(step, params, opt_state), item "meta" =
JSON with a checksum of every state leaf). Only `state.params` is read, as a partial restore into
single-device arrays, so neither the training mesh nor the optimizer state is needed, and each
leaf read is checked against its checksum (hybrid_nope/run/checkpoint_integrity.py), as the trainer
checks a resume. Every failure names the path or step and says what was expected. A run still
training is read as it stands: only the steps orbax committed, the newest that reads and
verifies (`restore_params`).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from hybrid_nope.run import run_config, storage
from hybrid_nope.run.checkpoint_integrity import (COMMIT_MARKER, StepListing, being_written_message,
                                              corrupt_message, differing_leaves, list_steps,
                                              params_checksums, read_quietly,
                                              unreadable_message)
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import (CHECKPOINT_META, CHECKPOINT_STATE, CHECKPOINTS,
                                 CONFIG, RunDir)



class AnalysisError(UserError):
  """A workdir, step, checkpoint or data path that analysis cannot use."""


class WorkdirError(AnalysisError):
  pass


class StepNotFoundError(AnalysisError):
  pass


class IncompatibleCheckpointError(AnalysisError):
  pass


class DataPathError(AnalysisError):
  pass


class CorruptCheckpointError(AnalysisError):
  """A checkpoint step whose state is missing or unreadable, or whose params differ from the
  checksums saved with them."""


class NonFiniteParamsError(AnalysisError):
  """A checkpoint step whose params hold NaN or inf: the trainer never saves one (it stops
  first), so it was written otherwise, e.g. imported, and every loss and logit of it is NaN."""


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config in force now: WORKDIR/config.json (written by the training loop at
  start), or the last config a resume was allowed to change it to (`run_config`)."""
  if not storage.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} does not exist")
  path = RunDir(workdir).config
  if not storage.exists(path):
    if not storage.listdir(workdir):
      raise WorkdirError(f"workdir {workdir} is empty: expected {CONFIG} and {CHECKPOINTS}/ "
                         f"from `python launch/train.py --config=configs/NAME.py "
                         f"--workdir={workdir}`")
    raise WorkdirError(
        f"{path} does not exist: analysis rebuilds the model from the run's config, which "
        f"launch/train.py writes there at start. For a run trained before it did, write it "
        f"yourself, e.g. python -c \"from configs import demo; open('{path}', 'w')"
        f".write(demo.get_config().to_json_best_effort())\"")
  try:
    started_with = json.loads(storage.read_text(path))
  except json.JSONDecodeError as e:
    raise WorkdirError(f"{path} is not valid JSON: {e}") from None
  return ml_collections.ConfigDict(run_config.current(workdir, started_with))


def tokenizer_path(workdir: str, given: str | None = None) -> str | None:
  """`given` (a --tokenizer), else the tokenizer.json an imported model carries
  (run_dir.TOKENIZER), else None (the run's data tokenizer, data/tokenization/text_codec.py)."""
  carried = RunDir(workdir).tokenizer_file
  return given or (carried if storage.exists(carried) else None)


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Mapping[str, Any] | None) -> ml_collections.ConfigDict:
  """A copy of `config` with {"eval.path": "/x", ...} applied; an unknown key names itself."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in (overrides or {}).items():
    *parents, name = key.split(".")
    node = config
    for i, part in enumerate(parents):
      if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
        raise AnalysisError(f"config override {key}={value!r}: the run's config has no "
                            f"section {'.'.join(parents[:i + 1])}")
      node = node[part]
    if name not in node:
      raise AnalysisError(f"config override {key}={value!r}: the run's config has no key {key}")
    node[name] = value
  return config


def run_dir_of(workdir: str, config) -> RunDir:
  """The run directory with `config`'s checkpoint.directory (if set, e.g. gs://..., else
  WORKDIR/checkpoints; configs from before the key have none)."""
  return RunDir(workdir, config.get("checkpoint", {}).get("directory", ""))


def available_steps(workdir: str, config) -> list[int]:
  """Steps with a finished checkpoint (committed: `checkpoint_integrity.list_steps`); raises
  WorkdirError when there is none."""
  return list(_listing(workdir, config).finished)


def _listing(workdir: str, config) -> StepListing:
  """The checkpoint directory's steps; WorkdirError when none is finished."""
  directory = run_dir_of(workdir, config).checkpoints
  listing = list_steps(directory)
  if not listing.finished:
    writing = (f"step {listing.unfinished[-1]} is being written; rerun when it is finished"
               if listing.unfinished else
               f"the training loop saves one every checkpoint.every_steps="
               f"{config.checkpoint.every_steps} steps and at the end")
    raise WorkdirError(f"no checkpoints in {directory} (workdir {workdir}): {writing}")
  return listing


def resolve_step(workdir: str, config, step: int | None,
                 steps: list[int] | None = None) -> int:
  """`step`, checked against the checkpoints on disk (`steps`, if already listed); None = the
  latest."""
  steps = available_steps(workdir, config) if steps is None else steps
  if step is None:
    return steps[-1]
  if step not in steps:
    raise StepNotFoundError(f"step {step} has no checkpoint in "
                            f"{run_dir_of(workdir, config).checkpoints}; available steps: {steps}")
  return step


def _name(path) -> str:
  """"blocks/0/attn/wq_DNH": a leaf's name both in the config's params and in orbax's metadata
  (whose keys of a list are strings)."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _flat(tree) -> dict[str, Any]:
  return {_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_compatible(stored_params, wanted_params, where: str) -> None:
  """Raises IncompatibleCheckpointError naming the first parameter whose shape (or presence)
  differs between the checkpoint's metadata and the config's model."""
  stored, wanted = _flat(stored_params), _flat(wanted_params)
  missing = sorted(set(wanted) - set(stored))
  extra = sorted(set(stored) - set(wanted))
  if missing or extra:
    raise IncompatibleCheckpointError(
        f"checkpoint {where} does not match the config's model: parameters the config needs "
        f"but the checkpoint lacks: {missing[:5]}{' ...' if len(missing) > 5 else ''}; "
        f"parameters in the checkpoint the config does not build: "
        f"{extra[:5]}{' ...' if len(extra) > 5 else ''}")
  for name in sorted(wanted):
    a, b = tuple(stored[name].shape), tuple(wanted[name].shape)
    if a != b:
      raise IncompatibleCheckpointError(
          f"checkpoint {where} does not match the config's model: parameter params/{name} has "
          f"shape {a} in the checkpoint but {b} under the config (check model.* in "
          f"config.json and any --config.model.* override)")


def _other_steps(steps: list[int], step: int) -> str:
  others = [s for s in steps if s != step]
  return (f"other steps with a checkpoint: {others} (--step=N picks one)" if others else
          "no other step has a checkpoint")


def _saved_checksums(step: int, step_dir: str, where: str, others: str) -> dict | None:
  """meta's {leaf key: checksum} (meta in `where`); None where there is no meta (judged after
  the read, `_without_meta`). `others`: what to say about the other steps when meta cannot be
  used."""
  if not storage.exists(where):
    return None
  try:
    with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
      meta = checkpointer.restore(where)
  except Exception as e:  # orbax raises many kinds; the cause is in the text.
    raise CorruptCheckpointError(f"{unreadable_message(step, e, where)}; {others}") from None
  if not isinstance(meta, dict) or not isinstance(meta.get("checksums"), dict):
    raise CorruptCheckpointError(f"checkpoint step {step}: {where} holds no \"checksums\" "
                                 f"mapping (expected the JSON launch/train.py saves there); {others}")
  return meta["checksums"]


_ATTEMPTS = 5  # Reads of the newest step while a trainer saving every step removes it.


def restore_params(workdir: str, config, wanted, step: int | None = None) -> tuple[int, dict]:
  """(step, params) of checkpoint `step` (None = the newest finished one), shaped as `wanted`
  (the config's abstract params: run/ builds no model, `model/checkpointed.py` does), on the
  default device, each leaf verified against the checksum saved with it. Raises
  CorruptCheckpointError for a state that is missing, unreadable or differs from its
  checksums, NonFiniteParamsError for params that hold NaN or inf. A live trainer is
  tolerated: a step it is still writing is not read (one warning says which is read instead),
  and the newest step, when it fails while the trainer's checkpoint.keep deletes it or a newer
  one is committed meanwhile, gives way to the newest finished one."""
  listing = _listing(workdir, config)
  if step is not None:
    if step in listing.unfinished and step not in listing.finished:
      raise StepNotFoundError(
          f"step {step} is being written in {run_dir_of(workdir, config).checkpoints} (it has "
          f"no {COMMIT_MARKER} yet); rerun when it is finished, or pick a finished step: "
          f"{list(listing.finished)}")
    return _read_step(workdir, config, wanted, resolve_step(workdir, config, step,
                                                    list(listing.finished)), listing)
  chosen = listing.finished[-1]
  for attempt in range(_ATTEMPTS):
    note = being_written_message(listing, chosen)
    if note:
      logging.warning("%s", note)
    try:
      return _read_step(workdir, config, wanted, chosen, listing)
    except AnalysisError as e:
      now = list_steps(run_dir_of(workdir, config).checkpoints)
      if not now.finished or (chosen in now.finished and now.finished[-1] == chosen):
        raise  # Nothing changed under the read: the step itself is bad.
      if attempt + 1 == _ATTEMPTS:
        raise type(e)(
            f"{e}; the trainer replaced the newest step each of the {_ATTEMPTS} times it was "
            f"read: rerun, or let it save less often or keep more steps (checkpoint.every_steps"
            f"={config.checkpoint.every_steps}, checkpoint.keep={config.checkpoint.keep})"
        ) from None
      logging.warning("step %d was removed or replaced by the trainer while being read; "
                      "reading step %d", chosen, now.finished[-1])
      listing, chosen = now, now.finished[-1]
  raise AssertionError("unreachable")


def _read_step(workdir: str, config, wanted, step: int,
               listing: StepListing) -> tuple[int, dict]:
  """restore_params of the finished step `step`, with what orbax's threads print held back
  (`read_quietly`)."""
  others = _other_steps(list(listing.finished), step)
  where = run_dir_of(workdir, config).checkpoint_state(step)
  return read_quietly(
      lambda: _restore_step(workdir, config, wanted, step, others),
      lambda e: CorruptCheckpointError(f"{unreadable_message(step, e, where)}; {others}"))


def _restore_step(workdir: str, config, wanted, step: int, others: str) -> tuple[int, dict]:
  rd = run_dir_of(workdir, config)
  step_dir, state_dir = rd.checkpoint(step), rd.checkpoint_state(step)
  if not storage.exists(state_dir):
    raise CorruptCheckpointError(
        f"checkpoint step {step} has no {CHECKPOINT_STATE}/ in {step_dir}: expected the orbax "
        f"item {CHECKPOINT_STATE!r} (TrainState: step, params, opt_state) that launch/train.py "
        f"saves in every checkpoint; {others}")
  with ocp.PyTreeCheckpointer() as checkpointer:
    metadata = checkpointer.metadata(state_dir)
  stored = getattr(metadata, "item_metadata", metadata)
  if stored is None:
    raise CorruptCheckpointError(
        f"checkpoint step {step} cannot be read ({state_dir}: orbax reads no metadata of its "
        f"leaves there, where launch/train.py saves the TrainState); {others}")
  if "params" not in stored:
    raise IncompatibleCheckpointError(f"checkpoint {step_dir} has no state.params (keys: "
                                      f"{sorted(stored)})")
  check_compatible(stored["params"], wanted, step_dir)
  saved = _saved_checksums(step, step_dir, rd.checkpoint_meta(step), others)

  # Read as stored (a checksum is of the saved bits), then cast to the config's dtypes.
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  stored_flat = _flat(stored["params"])
  target = {"params": jax.tree_util.tree_map_with_path(
      lambda path, x: jax.ShapeDtypeStruct(x.shape, stored_flat[_name(path)].dtype,
                                           sharding=device), wanted)}
  with ocp.PyTreeCheckpointer() as checkpointer:
    restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True))
  params = restored["params"]
  if saved is None:
    _without_meta(rd, step, others)
  else:
    computed = jax.device_get(jax.jit(params_checksums)(params))
    differing = differing_leaves(saved, computed)
    if differing:
      raise CorruptCheckpointError(f"{corrupt_message(step, step_dir, differing)}; {others}")
  _check_finite(params, step, step_dir, others)
  params = jax.tree.map(lambda x, w: x if x.dtype == w.dtype else x.astype(w.dtype), params,
                        wanted)
  return step, params


def _without_meta(rd: RunDir, step: int, others: str) -> None:
  """A step read without meta/ predates checksums (a warning) only if it is still a finished
  step with its state after the read: the trainer's checkpoint.keep deletes a step file by file,
  meta/ among them, under a reader (which then reads the newest step, `restore_params`)."""
  if step in list_steps(rd.checkpoints).finished and storage.exists(rd.checkpoint_state(step)):
    logging.warning("checkpoint step %d predates checksums (%s has no %s/): its params are "
                    "restored without being verified", step, rd.checkpoint(step), CHECKPOINT_META)
    return
  raise CorruptCheckpointError(
      f"checkpoint step {step} was deleted while being read ({rd.checkpoint(step)} is no longer a "
      f"finished step: a trainer's checkpoint.keep removes old steps); {others}")


def _check_finite(params, step: int, step_dir: str, others: str) -> None:
  """NonFiniteParamsError naming the first parameter holding NaN or inf (one small program
  counts them all), so score, generate, analyze and export stop instead of printing NaN."""
  counts = _flat(jax.device_get(jax.jit(lambda p: jax.tree.map(
      lambda x: jnp.sum(~jnp.isfinite(x), dtype=jnp.int32), p))(params)))
  bad = [name for name, count in counts.items() if count]
  if bad:
    size = _flat(params)[bad[0]].size
    more = f" ({len(bad) - 1} more parameters hold some)" if len(bad) > 1 else ""
    raise NonFiniteParamsError(
        f"checkpoint step {step} ({step_dir}): parameter params/{bad[0]} holds "
        f"{int(counts[bad[0]])} non-finite values (NaN or inf) of {size}{more}; a model of "
        f"them computes NaN; {others}")
