"""fla's Triton kernels (flash-linear-attention, the fla-core wheel) timed in torch: the field's
reference for our GLA and delta-rule kernels, at our shapes (benchmarks/device_check.py).

fla-core is pure Python and Triton; the GPU image has torch and triton but no network, so
device_check.sh installs a carried wheel (`pip download --no-deps fla-core==0.6.0 einops`
into wheels/). Where it is missing, or there is no CUDA torch, `unavailable_reason` says why.
"""
from __future__ import annotations

import importlib.util
import time

# fla op -> the module that holds it (fla 0.6's layout).
OPS = {"chunk_gla": "fla.ops.gla", "chunk_gated_delta_rule": "fla.ops.gated_delta_rule"}


def unavailable_reason() -> str | None:
  for module in ("torch", "triton", "fla"):
    if importlib.util.find_spec(module) is None:
      return f"{module} is not importable (carry fla-core and einops wheels in wheels/)"
  import torch
  if not torch.cuda.is_available():
    return "torch sees no CUDA device"
  return None


def version() -> str:
  from importlib.metadata import PackageNotFoundError, version as package_version
  try:
    return package_version("fla-core")
  except PackageNotFoundError:
    return "?"


def _inputs(op: str, T: int, heads: int, head_dim: int):
  """bf16 CUDA tensors in fla's [B, T, H, K] layout, as benchmarks/attention.py draws ours:
  log decays uniform in [-1, 0], β uniform in [0, 1]."""
  import torch
  g = torch.Generator(device="cuda").manual_seed(0)
  normal = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)
  uniform = lambda *shape: torch.rand(*shape, generator=g, device="cuda", dtype=torch.float32)
  q, k = normal(1, T, heads, head_dim), normal(1, T, heads, head_dim)
  if op == "chunk_gla":
    return dict(q=q, k=k, v=normal(1, T, heads, head_dim), g=-uniform(1, T, heads, head_dim))
  return dict(q=q, k=k, v=normal(1, T, heads, head_dim), g=-uniform(1, T, heads),
              beta=uniform(1, T, heads).to(torch.bfloat16), use_qk_l2norm_in_kernel=True)


def fwd_bwd_ms(op: str, T: int, heads: int, head_dim: int, reps: int) -> float:
  """Best-of-reps milliseconds of one forward and backward of fla's `op`."""
  import torch
  fn = getattr(importlib.import_module(OPS[op]), op)
  kwargs = _inputs(op, T, heads, head_dim)
  leaves = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
  for leaf in leaves:
    leaf.requires_grad_(True)

  def once():
    out = fn(**kwargs)[0]
    out.backward(out.detach())
    torch.cuda.synchronize()

  once()  # Triton compiles (autotunes) on the first call.
  best = float("inf")
  for _ in range(reps):
    start = time.perf_counter()
    once()
    best = min(best, time.perf_counter() - start)
  return best * 1e3
