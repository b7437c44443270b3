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


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
  """Measures the steps between two log points; `report` returns the scalars it logged."""

  def __init__(self, config, start_step: int):
    self.total_steps = config.train.steps
    self.tokens_per_step = config.data.batch_size * config.data.seq_len
    self.flops_per_token = flops.flops_per_token(config.model, config.data.seq_len)
    peak, source = flops.peak_flops_per_device(config.train.peak_flops)
    self.peak = peak * jax.device_count()
    logging.info("MFU against %.1f GFLOP/s (%s)", self.peak / 1e9, source)
    self.step, self.time = start_step, time.perf_counter()

  def report(self, step: int, loss: float, learning_rate: float) -> dict:
    now = time.perf_counter()
    seconds_per_step = (now - self.time) / max(step - self.step, 1)
    self.step, self.time = step, now
    tokens_per_second = self.tokens_per_step / seconds_per_step
    mfu = tokens_per_second * self.flops_per_token / self.peak
    memory, memory_kind = memory_in_use()
    logging.info("step %d/%d | loss %.4f | %.0f tokens/s | MFU %.1f%% | %.3f s/step | ETA %s | "
                 "%s %.2f GiB | lr %.2e", step, self.total_steps, loss, tokens_per_second,
                 100 * mfu, seconds_per_step,
                 _duration(seconds_per_step * (self.total_steps - step)), memory_kind,
                 memory / 2**30, learning_rate)
    return {"tokens_per_second": tokens_per_second, "mfu": mfu,
            "seconds_per_step": seconds_per_step, "memory_bytes": memory}
