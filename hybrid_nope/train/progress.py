"""The progress line of a run: loss, throughput, MFU, seconds per step, ETA and memory."""
from __future__ import annotations

import resource
import sys
import time

import jax
from absl import logging

from hybrid_nope.train import flops


def memory_in_use() -> tuple[float, str]:
  """(bytes, what was measured): the devices' peak where the backend reports it (TPU, GPU),
  else this process's peak resident memory (CPU, where arrays live in host memory)."""
  stats = [d.memory_stats() or {} for d in jax.local_devices()]
  peaks = [s.get("peak_bytes_in_use", s.get("bytes_in_use")) for s in stats]
  if peaks and all(p is not None for p in peaks):
    return float(max(peaks)), "device peak"
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS.
  return float(rss if sys.platform == "darwin" else rss * 1024), "host peak RSS"


def _rate(flops_per_second: float) -> str:
  """A FLOP/s figure in the unit that reads best: 131.9 GFLOP/s, 989 TFLOP/s, 31.6 PFLOP/s."""
  for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12)):
    if flops_per_second >= scale:
      return f"{flops_per_second / scale:.4g} {unit}"
  return f"{flops_per_second / 1e9:.4g} GFLOP/s"


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
  """Measures the steps between two log points; `report` returns the scalars it logged.

  The loop `note`s the time it spends off the train steps (compiling, evals, hooks, saves).
  Throughput is the steps' own time; the ETA is the run's mean step time so far times the
  steps left, plus each kind of side work still due on the schedule times its mean so far, so
  a run whose evals and hooks take minutes is not promised the end early."""

  def __init__(self, config, start_step: int):
    self.total_steps = config.train.steps
    self.tokens_per_step = config.data.batch_size * config.data.seq_len
    self.flops_per_token = flops.flops_per_token(config.model, config.data.seq_len)
    peak, source = flops.peak_flops_per_device(config.train.peak_flops)
    self.peak = peak * jax.device_count()
    # Named in the progress line, the run's summary and, with where it came from, here.
    self.peak_name = _rate(self.peak)
    self.peak_source = f"{self.peak_name}: {source}" + (
        f", × {jax.device_count()} devices" if jax.device_count() > 1 else "")
    logging.info("MFU against %s", self.peak_source)
    self._warned_above_peak = False
    self.step, self.time = start_step, time.perf_counter()
    # Side work by kind: its period in steps (0: once, not again) and (seconds, count) so far.
    self._every = {"eval": config.eval.every_steps, "hooks": config.metrics.every_steps,
                   "checkpoint": config.checkpoint.every_steps, "compile": 0,
                   "samples": config.eval.sample_every_steps}
    self._side = {kind: (0.0, 0) for kind in self._every}
    self._first: dict[str, float] = {}
    self._side_in_interval = 0.0
    self._step_seconds, self._steps_timed = 0.0, 0

  def track(self, kind: str, every: int) -> None:
    """Side work of a kind the defaults lack (a hook with its own every_steps), due every
    `every` steps and at the last."""
    self._every[kind] = every
    self._side.setdefault(kind, (0.0, 0))

  def note(self, kind: str, seconds: float) -> None:
    """`seconds` of side work of `kind` (a key of the schedule) since the last report."""
    total, count = self._side[kind]
    self._side[kind] = (total + seconds, count + 1)
    self._first.setdefault(kind, seconds)
    self._side_in_interval += seconds

  def _mean(self, kind: str) -> float:
    """The kind's mean time, leaving out its first time once there are others: the first hook
    also compiles the hook's functions (28 s against 11-13 s after, on the demo)."""
    total, count = self._side[kind]
    if count > 1:
      return (total - self._first[kind]) / (count - 1)
    return total / max(count, 1)

  def _due(self, every: int, step: int) -> int:
    """How many of the steps after `step` (to the end) do this work: multiples and the last."""
    if not every:
      return 0
    left = self.total_steps // every - step // every
    return left + (self.total_steps % every != 0 and step < self.total_steps)

  def eta_seconds(self, step: int) -> float:
    per_step = self._step_seconds / max(self._steps_timed, 1)
    seconds = per_step * (self.total_steps - step)
    for kind, every in self._every.items():
      if self._side[kind][1]:
        seconds += self._due(every, step) * self._mean(kind)
    return seconds

  def report(self, step: int, loss: float, learning_rate: float) -> dict:
    now = time.perf_counter()
    steps = max(step - self.step, 1)
    seconds_per_step = max(now - self.time - self._side_in_interval, 1e-9) / steps
    self._step_seconds += seconds_per_step * steps
    self._steps_timed += steps
    self.step, self.time, self._side_in_interval = step, now, 0.0
    tokens_per_second = self.tokens_per_step / seconds_per_step
    mfu = flops.model_flops_utilization(tokens_per_second, self.flops_per_token, self.peak)
    if mfu > 1 and not self._warned_above_peak:
      self._warned_above_peak = True
      logging.warning("MFU %.1f%% is above 100%%: the peak it is measured against (%s) is below "
                      "this machine's; set train.peak_flops to its peak per device (on CPU: "
                      "%s measures it)", 100 * mfu, self.peak_source, flops.CPU_ROOFLINE_COMMAND)
    memory, memory_kind = memory_in_use()
    logging.info("step %d/%d | loss %.4f | %.0f tokens/s | MFU %.1f%% of %s | %.3f s/step | "
                 "ETA %s | %s %.2f GiB | lr %.2e", step, self.total_steps, loss,
                 tokens_per_second, 100 * mfu, self.peak_name, seconds_per_step,
                 _duration(self.eta_seconds(step)), memory_kind, memory / 2**30, learning_rate)
    return {"tokens_per_second": tokens_per_second, "mfu": mfu,
            "seconds_per_step": seconds_per_step, "memory_bytes": memory}
