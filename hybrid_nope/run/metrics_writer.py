"""Metrics to JSONL files in the workdir and to TensorBoard; only process 0 writes.

The workdir is a local path or a URL (`hybrid_nope.run.storage`: gs://, file://, memory://). A local
file is appended line by line, so it can be followed live. An object store cannot append, so
there the lines are kept in memory and each changed file is uploaded whole at `flush()`: the
loop flushes at every log step and checkpoint, so everything up to the last checkpoint is on
storage, and what a kill loses is what a resume would drop anyway. TensorBoard events are
written locally and uploaded under DIR/tensorboard/ at the same flushes. A memory:// workdir
lives in this process only: its records and events are gone when it exits.

Records are JSON lines through `storage.to_json`: a non-finite float is written as null (JSON
has no NaN), which `storage.read_jsonl` reads back as NaN. A write the disk refuses (full, or
read-only) stops the run with RecordsError, one line; what was cut is past the checkpoint the
rerun resumes from, and a resume drops it.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile

import jax
from absl import logging

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import METRICS, RunDir
from hybrid_nope.run import config_summary
from hybrid_nope.run.wandb_sink import rgb_array


class RecordsError(UserError):
  """A record, event file or side file the run could not write (a full disk, a permission)."""


def _cannot_write(path: str, error: OSError) -> RecordsError:
  return RecordsError(
      f"cannot write {path} ({error.strerror or error}): the run stops. Free space on that disk "
      "(or fix its permissions), then rerun the same command: it resumes from the newest "
      "checkpoint (with none saved yet, add --config.train.overwrite=True to start afresh)")


def _whole(method):
  """Runs a writer method inside `self.critical()`: a stop signal that cuts an eval or a hook
  short (train/preemption.py) waits until the write is done, so no file, TensorBoard queue or
  W&B call is left half-made for the save and the exit that follow."""
  @functools.wraps(method)
  def whole(self, *args, **kwargs):
    with self.critical():
      return method(self, *args, **kwargs)
  return whole


class MetricsWriter:
  """`write` puts scalars in DIR/metrics.jsonl and TensorBoard; `write_record` appends any JSON
  record to another DIR/<name>.jsonl (e.g. recency.jsonl). Names are `run_dir.py`'s."""

  def __init__(self, workdir: str, *, resume_step: int = 0, wandb=None):
    self.active = jax.process_index() == 0
    self.critical = contextlib.nullcontext  # The loop sets PreemptionWatcher.deferred.
    self._wandb = wandb  # A run.wandb_sink.WandbSink or None: W&B gets what TensorBoard gets.
    self.workdir = workdir
    self.run_dir = RunDir(workdir)
    self.resume_step = resume_step
    self._local = storage.local_path(workdir)
    self._lines: dict[str, list[str]] = {}  # name -> kept lines (the URL mode's whole file)
    self._dirty: set[str] = set()
    self._tb_uploaded: dict = {}  # Event files already on storage, by size and mtime.
    self._tb = self._tb_local = None
    self._failed = False  # A write failed and was raised: close() does not raise it again.
    if self.active:
      storage.makedirs(workdir)
      from tensorboardX import SummaryWriter  # Imported lazily: only process 0 needs it.
      self._tb_local = (storage.local_path(self.run_dir.tensorboard) if self._local is not None
                        else tempfile.mkdtemp(prefix="hybrid_nope_tensorboard_"))
      self._tb = SummaryWriter(self._tb_local)

  def _kept(self, name: str) -> list[str]:
    """The file's lines that survive the resume (read once per file)."""
    if name not in self._lines:
      self._lines[name] = self._records_through(self.run_dir.path(name), self.resume_step)
      if self._local is not None:  # Local files are rewritten now and appended to from here.
        self._replace(name, self._lines[name])
    return self._lines[name]

  def _records_through(self, path: str, last_step: int) -> list[str]:
    """Lines of `path` with step <= last_step. Records after the restored checkpoint belong
    to a run that did not survive; dropping them leaves the file one trajectory."""
    if not storage.exists(path):
      if self.resume_step > 0:
        logging.warning("%s is missing although the run resumes at step %d: its records up to "
                        "that step are lost; only the event files under %s, where they "
                        "survive, still hold the scalars up to that step", path,
                        self.resume_step, self.run_dir.tensorboard)
      return []
    return [storage.to_json(r) + "\n" for r in storage.read_jsonl(path)
            if r["step"] <= last_step]

  def _gone(self, name: str) -> UserError:
    return UserError(f"workdir {self.workdir} was deleted or moved while the run wrote to it "
                     f"({name} could not be written there): restore it and rerun to resume, or "
                     f"start over with a new --workdir")

  @contextlib.contextmanager
  def _writing(self, path: str):
    """A write to `path`: the disk's refusal as RecordsError (a vanished workdir: `_gone`)."""
    try:
      yield
    except FileNotFoundError:
      raise
    except OSError as e:
      self._failed = True
      raise _cannot_write(path, e) from None

  def _replace(self, name: str, lines: list[str]) -> None:
    """The whole file at once: a kill at any instant leaves the old or the new one."""
    if self._local is not None and not os.path.isdir(self._local):
      raise self._gone(name)  # Not recreated: the rest of the run's files went with it.
    with self._writing(self.run_dir.path(name)):
      storage.write_text(self.run_dir.path(name), "".join(lines))

  def _append(self, name: str, record: dict) -> None:
    line = storage.to_json(record) + "\n"
    self._kept(name).append(line)
    if self._local is None:
      self._dirty.add(name)
    else:
      try:
        with self._writing(self.run_dir.path(name)):
          with open(storage.local_path(self.run_dir.path(name)), "a") as f:
            f.write(line)
      except FileNotFoundError:
        raise self._gone(name) from None

  @_whole
  def write_file(self, path: str, data: bytes | str) -> None:
    """A side file of the run, whole (recency_probe.json, recency_sums/...; `run_dir.py`)."""
    if self.active:
      with self._writing(path):
        if isinstance(data, str):
          storage.write_text(path, data)
        else:
          storage.write_bytes(path, data)

  @_whole
  def drop_step(self, name: str, step: int) -> None:
    """Removes DIR/<name>'s records of `step` (the resume step), e.g. a hook's partial records
    from a run killed while the hook wrote them, before the hook runs again."""
    if self.active:
      kept = [l for l in self._kept(name) if json.loads(l)["step"] < step]
      self._lines[name] = kept
      self._replace(name, kept)

  def keys_at(self, step: int) -> set[str]:
    """The keys of every metrics.jsonl record at `step` (process 0; empty elsewhere)."""
    if not self.active:
      return set()
    keys = set()
    for line in self._kept(METRICS):
      record = json.loads(line)
      if record["step"] == step:
        keys.update(record)
    return keys

  def latest(self, key: str) -> float:
    """The newest value of `key` in metrics.jsonl up to the resume step, NaN where none is (or
    off process 0): a rerun of a finished run reports the loss it ended with."""
    for line in reversed(self._kept(METRICS) if self.active else []):
      record = json.loads(line)
      if record.get(key) is not None:
        return float(record[key])
    return float("nan")

  @_whole
  def write(self, step: int, metrics: dict) -> None:
    if not self.active:
      return
    self._append(METRICS, {"step": int(step), **{k: float(v) for k, v in metrics.items()}})
    self.write_scalars(step, metrics)

  @_whole
  def write_scalars(self, step: int, scalars: dict) -> None:
    """TensorBoard only."""
    if self.active:
      for tag, value in scalars.items():
        self._tb.add_scalar(tag, float(value), int(step))
      if self._wandb is not None:
        self._wandb.scalars(step, scalars)

  @_whole
  def write_table(self, name: str, step: int, records: list[dict]) -> None:
    """W&B only: one step's records (e.g. recency.jsonl's) as a table; write_record keeps them."""
    if self.active and self._wandb is not None:
      self._wandb.table(name, step, records)

  @_whole
  def write_images(self, step: int, images: dict) -> None:
    """TensorBoard and W&B images: name -> PNG bytes or an HxWx3 uint8 array."""
    if self.active:
      for tag, image in images.items():
        self._tb.add_image(tag, rgb_array(image), int(step), dataformats="HWC")
      if self._wandb is not None:
        self._wandb.images(step, images)

  @_whole
  def write_config(self, step: int, config) -> None:
    """TensorBoard: the config as a markdown table (Text) and its run-defining keys as the
    run's HParams session, with the eval loss as the metric (`run/config_summary.py`)."""
    if self.active:
      self._tb.add_text(config_summary.CONFIG_TAG, config_summary.markdown_table(config),
                        int(step))
      for summary in config_summary.hparams_summaries(config):
        self._tb.file_writer.add_summary(summary, int(step))

  @_whole
  def write_samples(self, step: int, samples: list[dict]) -> None:
    """Generated text, each sample {"prompt", "text"}: one metrics.jsonl record {"step",
    "samples"}, TensorBoard text (one tag per prompt) and a W&B table."""
    if self.active:
      self._append(METRICS, {"step": int(step), "samples": samples})
      for i, sample in enumerate(samples):
        # TensorBoard renders Markdown: a code block keeps the text as generated.
        self._tb.add_text(f"samples/{i}", f"```\n{sample['prompt']}{sample['text']}\n```",
                          int(step))
      if self._wandb is not None:
        self._wandb.samples(step, samples)

  @_whole
  def write_record(self, name: str, record: dict) -> None:
    if self.active:
      self._append(name, record)

  @_whole
  def flush(self) -> None:
    """Uploads what changed since the last flush (URL workdirs; local files are current)."""
    if not self.active or self._local is not None:
      return
    for name in sorted(self._dirty):
      self._replace(name, self._lines[name])
    self._dirty.clear()
    with self._writing(self.run_dir.tensorboard):
      self._tb.flush()
      storage.copy_tree(self._tb_local, self.run_dir.tensorboard, self._tb_uploaded)

  @_whole
  def close(self) -> None:
    reported = self._failed  # The run stops on that error: the same disk's again is no news.
    if self._tb is not None:
      try:
        self.flush()
        with self._writing(self.run_dir.tensorboard):
          self._tb.close()
          if self._local is None:
            storage.copy_tree(self._tb_local, self.run_dir.tensorboard, self._tb_uploaded)
      except RecordsError:
        if not reported:
          raise
    if self._wandb is not None:
      self._wandb.finish()
