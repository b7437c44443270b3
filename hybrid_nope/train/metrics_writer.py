"""Metrics to DIR/metrics.jsonl and TensorBoard event files; only process 0 writes."""
from __future__ import annotations

import json
import os

import jax


class MetricsWriter:

  def __init__(self, workdir: str, *, resume_step: int = 0):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if not self.active:
      return
    os.makedirs(workdir, exist_ok=True)
    # Records after the restored checkpoint belong to a run that did not survive; drop them so
    # the file describes one trajectory.
    if os.path.exists(self.path):
      with open(self.path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resume_step]
      with open(self.path, "w") as f:
        f.writelines(kept)
    from tensorboardX import SummaryWriter  # Imported lazily: only process 0 needs it.
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: dict) -> None:
    if not self.active:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for key, value in metrics.items():
      self._tb.add_scalar(key, float(value), int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
