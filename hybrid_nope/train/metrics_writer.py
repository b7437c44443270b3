"""Metrics to JSONL files in the workdir and to TensorBoard; only process 0 writes."""
from __future__ import annotations

import json
import os

import jax


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
      # Records after the restored checkpoint belong to a run that did not survive; drop them
      # so the file describes one trajectory.
      if os.path.exists(path):
        with open(path) as f:
          kept = [l for l in f if l.strip() and json.loads(l)["step"] <= self.resume_step]
        with open(path, "w") as f:
          f.writelines(kept)
    with open(path, "a") as f:
      f.write(json.dumps(record) + "\n")

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
