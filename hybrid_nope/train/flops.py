"""Model FLOPs per token (for MFU) and the peak rate they are measured against."""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.pattern import layer_kinds

# Dense bf16 peak per device, from vendor datasheets; keyed by a substring of device_kind.
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "H200": 989e12, "H100": 989e12, "A100": 312e12,
}
# A CPU has no datasheet figure here: its float32 matmul roofline per core, the best of three
# runs of `python benchmarks/cpu_roofline.py` (20, 50, 50 repeats) on an AMD EPYC (Zen 4, 2
# cores under KVM, shared) at ead5429: 131.9 GFLOP/s on 2 cores at 1024² (the runs' bests
# 129.9, 131.9, 116.8). A faster CPU reads MFU above 100% (the progress line warns): measure
# it there and set train.peak_flops.
CPU_PEAK_FLOPS_PER_CORE = 66.0e9
CPU_ROOFLINE_COMMAND = "python benchmarks/cpu_roofline.py"


def matmul_params(model_cfg) -> int:
  """Parameters that take part in a matmul per token: projections, MLPs and the output head."""
  m = model_cfg
  mlp = 3 * m.d_model * m.mlp_dim
  return (sum(KINDS[kind].mixer_params(m) + mlp for kind in layer_kinds(m.pattern, m.num_layers))
          + m.d_model * m.vocab_size)


def flops_per_token(model_cfg, seq_len: int) -> float:
  """Training FLOPs per token: 6 × matmul params plus 3 × the mixers' forward FLOPs (QKᵀ and
  AV over attended pairs; the chunked recurrences of linear attention and the delta rule)."""
  m = model_cfg
  mixing = sum(KINDS[kind].mixing_flops(m, seq_len)
               for kind in layer_kinds(m.pattern, m.num_layers))
  return 6 * matmul_params(m) + 3 * mixing


def measure_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
  """Best observed float32 n×n matmul rate of the default device (CPU_ROOFLINE_COMMAND)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def host_cores() -> int:
  """The cores this process may run on (its affinity where the OS says, else all)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS, Windows.
    return os.cpu_count() or 1


def peak_flops_per_device(configured: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s of one device, where the figure came from): train.peak_flops where set, else
  the device's datasheet bf16 peak, else on CPU the stated roofline per core times the cores,
  shared by the host's devices (simulated CPU devices share its cores)."""
  if configured > 0:
    return configured, "config train.peak_flops"
  device = jax.devices()[0]
  for name, peak in PEAK_FLOPS.items():
    if name in device.device_kind:
      return peak, f"datasheet bf16 peak of {device.device_kind}"
  if device.platform == "cpu":
    cores, devices = host_cores(), jax.local_device_count()
    per_device = f" over {devices} host devices" if devices > 1 else ""
    return (CPU_PEAK_FLOPS_PER_CORE * cores / devices,
            f"CPU float32 matmul roofline, {CPU_PEAK_FLOPS_PER_CORE / 1e9:.1f} GFLOP/s per core "
            f"× {cores} cores{per_device} ({CPU_ROOFLINE_COMMAND})")
  raise ValueError(f"no peak FLOP/s known for device_kind={device.device_kind!r}; "
                   "set config train.peak_flops")


def model_flops_utilization(tokens_per_second: float, flops_per_token_: float,
                            peak_flops: float) -> float:
  """MFU: the model's FLOPs per second (flops_per_token × tokens/s) over the peak of every
  device the step runs on."""
  return tokens_per_second * flops_per_token_ / peak_flops


def si(value: float, unit: str, prefixes: str = "kMGT", sep: str = "") -> str:
  """(3.51e9, "FLOP") -> "3.51 GFLOP"; (1.05e10, "tokens", "kMB", " ") -> "10.5 B tokens"."""
  for power, prefix in reversed(list(enumerate(prefixes, 1))):
    if value >= 1000**power:
      return f"{value / 1000**power:.3g} {prefix}{sep}{unit}"
  return f"{value:.3g} {unit}"
