"""Model FLOPs per token (for MFU) and the peak rate they are measured against."""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.kernels.delta_xla import CHUNK as DELTA_CHUNK
from hybrid_nope.kernels.linear_xla import CHUNK as LINEAR_CHUNK
from hybrid_nope.model.delta import CONV_WIDTH
from hybrid_nope.model.gla import GATE_RANK
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


def mixer_params(kind: str, model_cfg) -> int:
  """Matmul parameters of one layer's token mixer: q, k, v, o projections; for a gated linear
  attention layer (L) also its low-rank decay gate and its output gate; for a gated delta rule
  layer (D) those, its β projection and its short convolutions' taps (a depthwise tap is one
  multiply-add per token, as a matmul weight is)."""
  m = model_cfg
  D, N, K, H = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
  if kind == "D":
    return _delta_mixer_params(m)
  params = D * H * (2 * N + 2 * K)
  if kind == "L":
    params += D * N * H + GATE_RANK * (D + K * H)
  return params


def _delta_heads(m) -> tuple[int, int, int]:
  """(V value heads, J = d_v, O output heads) of a D layer (model/delta.py's head layout)."""
  V = m.delta_v_heads or m.num_kv_heads
  return V, m.delta_expand_v * m.head_dim, (V if V != m.num_kv_heads else m.num_heads)


def _delta_mixer_params(m) -> int:
  """A D layer's: q, k, v, o, the output gate, the forget gate of its form, β and the taps."""
  D, N, K, H = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
  V, J, O = _delta_heads(m)
  params = D * H * (N + K) + D * V * J + O * J * D + D * V + CONV_WIDTH * (N * H + K * H + V * J)
  params += D * J + J * O * J if m.delta_gate_form == "kda" else D * O * J  # output gate
  gate_channels = V * H if m.delta_gate == "channel" else V
  params += {"gla": GATE_RANK * (D + gate_channels), "mamba2": D * V,
             "kda": H * (D + V * H)}[m.delta_gate_form]
  return params


def matmul_params(model_cfg) -> int:
  """Parameters that take part in a matmul per token: projections, MLPs and the output head."""
  m = model_cfg
  mlp = 3 * m.d_model * m.mlp_dim
  return (sum(mixer_params(kind, m) + mlp for kind in layer_kinds(m.pattern, m.num_layers))
          + m.d_model * m.vocab_size)


def attended_pairs_per_query(kind: str, window: int, seq_len: int) -> float:
  """Mean number of keys a query attends to in a causal sequence of length seq_len."""
  i = np.arange(seq_len)
  keys = i + 1 if kind == "G" else np.minimum(i + 1, window)
  return float(keys.mean())


def linear_attention_flops_per_token(num_heads: int, num_kv_heads: int, head_dim: int,
                                     chunk: int = LINEAR_CHUNK) -> float:
  """Forward FLOPs per token of chunked linear attention, counted as useful work: within a
  chunk the causal half of q·k and of the weighted sum of v ((chunk + 1) / 2 keys on average),
  across chunks the read-out q·S per query head and the state update k vᵀ per kv head."""
  H = head_dim
  return num_heads * (4 * H * (chunk + 1) / 2 + 2 * H * H) + num_kv_heads * 2 * H * H


def delta_attention_flops_per_token(num_heads: int, num_kv_heads: int, head_dim: int,
                                    chunk: int = DELTA_CHUNK, *, v_heads: int = 0,
                                    v_dim: int = 0) -> float:
  """Forward FLOPs per token of the chunked gated delta rule, counted as useful work: linear
  attention's (above: per read-out head the causal halves of q·k and of the weighted values and
  q·S, per state k vᵀ), and per state (value head) the delta rule's own: the strictly lower half
  of k·kᵀ, the unit-lower-triangular inverse (C³/3 per chunk of C), the transformed keys and
  values (causal halves) and the state's prediction of each value, S k. v_heads / v_dim: value
  heads and their dim when they differ from the kv heads and head_dim (GVA, expand_v)."""
  H, C = head_dim, chunk
  V, J = v_heads or num_kv_heads, v_dim or head_dim
  O = V if V != num_kv_heads else num_heads  # read-out heads
  linear = O * ((2 * H + 2 * J) * (C + 1) / 2 + 2 * H * J) + V * 2 * H * J
  delta_rule = 2 * H * (C - 1) / 2 + C * C / 3 + (2 * H + 2 * J) * (C + 1) / 2 + 2 * H * J
  return linear + V * delta_rule


def mixer_flops_per_token(kind: str, model_cfg, seq_len: int) -> float:
  """Forward FLOPs per token of a layer's token mixing, beside its projections."""
  m = model_cfg
  if kind == "L":
    return linear_attention_flops_per_token(m.num_heads, m.num_kv_heads, m.head_dim)
  if kind == "D":
    V, J, _ = _delta_heads(m)
    return delta_attention_flops_per_token(m.num_heads, m.num_kv_heads, m.head_dim, v_heads=V,
                                           v_dim=J)
  return 4 * m.num_heads * m.head_dim * attended_pairs_per_query(kind, m.window, seq_len)


def flops_per_token(model_cfg, seq_len: int) -> float:
  """Training FLOPs per token: 6 × matmul params plus 3 × the mixers' forward FLOPs (QKᵀ and
  AV over attended pairs; the chunked recurrences of linear attention and the delta rule)."""
  m = model_cfg
  mixing = sum(mixer_flops_per_token(kind, m, seq_len)
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
