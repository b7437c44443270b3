"""Metrics to JSONL files in the workdir and to TensorBoard; only process 0 writes."""
from __future__ import annotations

import json
import os

import jax
from absl import logging


class MetricsWriter:
  """`write` puts scalars in DIR/metrics.jsonl and TensorBoard; `write_record` appends any JSON
  record to another DIR/<name>.jsonl (e.g. recency.jsonl)."""

  def __init__(self, workdir: str, *, resume_step: int = 0):
    self.active = jax.process_index() == 0
    self.workdir = workdir
    self.resume_step = resume_step
    self._truncated: set[str] = set()
    self._tb = None
    if self.active:
      os.makedirs(workdir, exist_ok=True)
      from tensorboardX import SummaryWriter  # Imported lazily: only process 0 needs it.
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def _append(self, name: str, record: dict) -> None:
    path = os.path.join(self.workdir, name)
    if name not in self._truncated:
      self._truncated.add(name)
      self._drop_records_after_resume(path)
    with open(path, "a") as f:
      f.write(json.dumps(record) + "\n")

  def _drop_records_after_resume(self, path: str, *, before: int | None = None) -> None:
    """Records after the restored checkpoint belong to a run that did not survive; drop them so
    the file describes one trajectory (and, with `before`, also those from that step on). The
    kept lines go to a new file that replaces the old one atomically, so a kill at any instant
    leaves either file whole."""
    keep_through = self.resume_step if before is None else min(self.resume_step, before - 1)
    if not os.path.exists(path):
      if self.resume_step > 0:
        logging.warning("%s is missing although the run resumes at step %d: its records up to "
                        "that step are lost (TensorBoard keeps its own copy of the scalars)",
                        path, self.resume_step)
      return
    with open(path) as f:
      lines = f.readlines()
    kept = []
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        if number == len(lines):  # A kill mid-write tears only the last line.
          logging.warning("%s: dropped its torn last line %d (%r...)", path, number, line[:60])
          continue
        raise ValueError(f"{path} line {number} is not JSON ({e}); only a torn last line is "
                         f"dropped by itself: fix or remove that line") from None
      if record["step"] <= keep_through:
        kept.append(json.dumps(record) + "\n")
    staging = path + ".tmp"
    with open(staging, "w") as f:
      f.writelines(kept)
      f.flush()
      os.fsync(f.fileno())
    os.replace(staging, path)

  def drop_step(self, name: str, step: int) -> None:
    """Removes DIR/<name>'s records of `step` (the resume step), e.g. a hook's partial records
    from a run killed while the hook wrote them, before the hook runs again."""
    if self.active:
      self._truncated.add(name)
      self._drop_records_after_resume(os.path.join(self.workdir, name), before=step)

  def keys_at(self, step: int) -> set[str]:
    """The keys of every metrics.jsonl record at `step` (process 0; empty elsewhere)."""
    path = os.path.join(self.workdir, "metrics.jsonl")
    if not self.active or not os.path.exists(path):
      return set()
    keys = set()
    with open(path) as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:  # A torn last line; _append drops it on the next write.
          continue
        if record["step"] == step:
          keys.update(record)
    return keys

  def write(self, step: int, metrics: dict) -> None:
    if not self.active:
      return
    self._append("metrics.jsonl", {"step": int(step), **{k: float(v) for k, v in metrics.items()}})
    self.write_scalars(step, metrics)

  def write_scalars(self, step: int, scalars: dict) -> None:
    """TensorBoard only."""
    if self.active:
      for tag, value in scalars.items():
        self._tb.add_scalar(tag, float(value), int(step))

  def write_record(self, name: str, record: dict) -> None:
    if self.active:
      self._append(name, record)

  def write_config(self, config) -> None:
    """DIR/config.json: what analysis tools need to rebuild the model and data."""
    if self.active:
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
