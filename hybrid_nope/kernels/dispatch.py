"""The one dispatch table: for each kernel contract (attention, linear_attention,
delta_attention), which implementation each `impl=` runs on each platform, and why one cannot.

  impl      cpu / rocm   tpu                      cuda
  "xla"     XLA          XLA                      XLA
  "pallas"  -            splash (attention),      our Triton kernels (all three)
                         Mosaic (linear attention)
  "cudnn"   -            -                        cuDNN (attention; needs a CUDA GPU here)
  "auto"    XLA          splash (attention)       attention: per layer (`cuda_attention`);
                                                  the recurrent mixers: XLA

"auto" takes a Pallas kernel only where it was measured faster (`Contract.auto`): the
recurrent mixers' kernels have not run on their hardware yet (checked in interpret mode and
lowered with jax.export only), so their "auto" is XLA until a measurement adds the platform.
Each call lowers one branch per platform (jax.lax.platform_dependent), so one jitted or
exported function carries the right kernel everywhere.

Availability is checked against the target platform: this machine's backend, or the one set by
`target_platform(...)` (launch/lower.py exports for TPU or CUDA from a CPU machine).

Attention's "auto" on CUDA, per layer (`cuda_attention`). Measured on one H200
(docs/performance.md, "GPU: one H200", at 40073bc: bfloat16 fwd+bwd, B = 1, 12 heads x 64, no
segment ids); cuDNN's time over our Triton kernel's (pallas_gpu.py), at T = 2048 ... 32768:

  window 64     1.68  0.92  1.47  1.39  1.56
  window 256    2.22  1.36  1.31  1.22  1.20
  window 1024   1.01  3.74  0.80  0.88  0.98
  global        1.63  1.03  0.79  0.71  0.67

So our kernel for windows (the faster one at w <= 256, within 20% at 1024; wider windows short of
T are unmeasured and keep the incumbent), and cuDNN for global layers from T = 8192, where it is
1.3-1.5x faster, but only for the case that was measured: bfloat16 or float16 (cuDNN takes no
float32); no segment ids (cuDNN would need a dense [B, 1, T, T] mask, O(T^2) memory, while our
kernel skips other documents' key blocks; the paper configs use data.document_masking, so their
global layers keep our kernel); and a CUDA GPU in this process (cuDNN cannot be traced without
one, so launch/lower.py, exporting for cuda from a CPU machine, gets our kernel there too).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from types import ModuleType

import jax
import jax.numpy as jnp

from absl import logging

from hybrid_nope.kernels import (blocking, cudnn, delta_pallas_gpu, delta_xla, linear_pallas,
                                 linear_pallas_gpu, linear_xla, pallas_gpu, pallas_tpu, xla)

XLA, PALLAS, CUDNN = "xla", "pallas", "cudnn"
PER_LAYER = "per layer"  # Contract.auto: the kernel is chosen per layer (cuda_attention)
PLATFORM_NAMES = {"cuda": "CUDA GPUs", "tpu": "TPU"}

_TARGET = contextvars.ContextVar("kernel_target_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str):
  """Check kernel availability against `platform` ("cpu", "tpu", "cuda") instead of this
  machine's backend: how launch/lower.py exports a train step for hardware it does not have."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def platform() -> str:
  """The platform the traced function is meant for: the target, else the default backend
  (a GPU backend is named by its runtime, cuda or rocm, as platform_dependent names it)."""
  if _TARGET.get() is not None:
    return _TARGET.get()
  backend = jax.default_backend()
  if backend == "gpu":
    version = getattr(jax.devices()[0].client, "platform_version", "").lower()
    return "rocm" if "rocm" in version else "cuda"
  return backend


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One implementation: `module.function`, runnable where `module.available()` (looked up at
  call time, so the answer follows this jax build); `needs` names what is missing otherwise."""
  module: ModuleType
  function: str
  needs: str = ""  # "" = always available (XLA, cuDNN: cuDNN's own check is per call)

  def available(self) -> bool:
    return not self.needs or self.module.available()

  def __call__(self, *args, **kwargs):
    return getattr(self.module, self.function)(*args, **kwargs)


TRITON = "jax.experimental.pallas.triton"


@dataclasses.dataclass(frozen=True)
class Contract:
  mixer: str  # for messages: "linear attention"
  xla: Kernel  # runs on every platform
  pallas: dict[str, Kernel]  # platform -> Pallas kernel
  auto: dict[str, str]  # platform -> PALLAS or PER_LAYER where "auto" leaves XLA (measured)
  cudnn: Kernel | None = None

  @property
  def impls(self) -> tuple[str, ...]:
    return ("auto", XLA, PALLAS) + ((CUDNN,) if self.cudnn else ())


TABLE = {
    "attention": Contract(
        "attention", Kernel(xla, "attention"),
        {"tpu": Kernel(pallas_tpu, "attention",
                       "jax.experimental.pallas.ops.tpu.splash_attention"),
         "cuda": Kernel(pallas_gpu, "attention", TRITON)},
        auto={"tpu": PALLAS, "cuda": PER_LAYER}, cudnn=Kernel(cudnn, "attention")),
    "linear_attention": Contract(
        "linear attention", Kernel(linear_xla, "linear_attention"),
        {"tpu": Kernel(linear_pallas, "linear_attention", "jax.experimental.pallas.tpu"),
         "cuda": Kernel(linear_pallas_gpu, "linear_attention", TRITON)},
        auto={}),
    "delta_attention": Contract(
        "delta rule", Kernel(delta_xla, "delta_attention"),
        {"cuda": Kernel(delta_pallas_gpu, "delta_attention", TRITON)},
        auto={}),
}


def check_impl(contract: str, impl: str):
  impls = TABLE[contract].impls
  if impl not in impls:
    raise ValueError(f"impl={impl!r}: expected one of {impls}")


def unavailable_reason(contract: str, impl: str, q_BTNH=None, segment_ids=None) -> str | None:
  """Why `impl` cannot run this call of `contract` on the target platform, or None."""
  check_impl(contract, impl)
  entry = TABLE[contract]
  if impl in ("auto", XLA):
    return None
  if impl == CUDNN:  # an explicit other target rules it out; else cuDNN's own check decides
    if _TARGET.get() not in (None, "cuda"):
      return f"cuDNN runs on CUDA GPUs only; the target platform is {_TARGET.get()!r}"
    return cudnn.unsupported_reason(q_BTNH, segment_ids)
  kernel = entry.pallas.get(platform())
  if kernel is None:
    modules = " and ".join(k.module.__name__.rsplit(".", 1)[-1] for k in entry.pallas.values())
    names = " and ".join(PLATFORM_NAMES[p] for p in entry.pallas)
    return (f"the Pallas {entry.mixer} kernels compile for {names} only; the platform is "
            f"{platform()!r} (tests run them with interpret=True on {modules})")
  return None if kernel.available() else f"{kernel.needs} is missing"


def available_impls(contract: str, q_BTNH=None, segment_ids=None) -> tuple[str, ...]:
  """Concrete implementations that can run this call on the target platform."""
  return tuple(i for i in TABLE[contract].impls[1:]
               if unavailable_reason(contract, i, q_BTNH, segment_ids) is None)


def _auto_pallas(entry: Contract) -> dict[str, str]:
  """platform -> PALLAS / PER_LAYER where "auto" leaves XLA and this jax has the kernel."""
  return {p: how for p, how in entry.auto.items() if entry.pallas[p].available()}


def resolve(contract: str, impl: str, q_BTNH=None, segment_ids=None,
            window: int | None = None) -> str:
  """The concrete implementation `impl` means on the target platform for this call (a layer
  with this window); ValueError naming the reason and the alternatives if unavailable."""
  reason = unavailable_reason(contract, impl, q_BTNH, segment_ids)
  if reason is not None:
    raise ValueError(f"impl={impl!r} is not available here: {reason}. Available: "
                     f"{available_impls(contract, q_BTNH, segment_ids)}")
  if impl != "auto":
    return impl
  how = _auto_pallas(TABLE[contract]).get(platform(), XLA)
  return cuda_attention_for(q_BTNH, segment_ids, window).impl if how == PER_LAYER else how


def branches(contract: str, impl: str) -> dict:
  """platform -> kernel for jax.lax.platform_dependent ("default" for the rest), which keeps
  only the branch of the platform a function is lowered for."""
  entry = TABLE[contract]
  if impl == XLA:
    return {"default": entry.xla}
  if impl == CUDNN:
    return {"default": entry.cudnn}
  if impl == PALLAS:
    return {p: k for p, k in entry.pallas.items() if k.available()}
  auto = {p: cuda_auto if how == PER_LAYER else entry.pallas[p]
          for p, how in _auto_pallas(entry).items()}
  return {**auto, "default": entry.xla}


@dataclasses.dataclass(frozen=True)
class Choice:
  impl: str  # PALLAS or CUDNN
  why: str


CUDNN_GLOBAL_FROM_T = 8192  # The shortest sequence at which cuDNN's global layer was faster.
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def cuda_attention(*, window: int | None, seq_len: int, dtype, has_segments: bool,
                   cudnn_unavailable: str | None) -> Choice:
  """The kernel "auto" runs for one attention layer on CUDA (module docstring's figures).
  `window` is the effective one (None: every key of the sequence); `cudnn_unavailable` is
  cudnn.unsupported_reason's answer for this call."""
  if window is not None:
    return Choice(PALLAS, f"window {window}: our kernel (as fast or faster for windows)")
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
    return Choice(PALLAS, f"global, {jnp.dtype(dtype).name}: cuDNN takes bfloat16/float16 only")
  if has_segments:
    return Choice(PALLAS, "global with segment ids: cuDNN would need a dense T x T mask")
  if seq_len < CUDNN_GLOBAL_FROM_T:
    return Choice(PALLAS, f"global at T = {seq_len} < {CUDNN_GLOBAL_FROM_T}: our kernel is "
                          "as fast or faster there")
  if cudnn_unavailable is not None:
    return Choice(PALLAS, f"global: cuDNN unavailable ({cudnn_unavailable})")
  return Choice(CUDNN, f"global at T = {seq_len} >= {CUDNN_GLOBAL_FROM_T}, "
                       f"{jnp.dtype(dtype).name}, no segment ids: cuDNN 1.3-1.5x faster")


def cuda_attention_for(q_BTNH, segment_ids, window) -> Choice:
  """`cuda_attention` for this call's (per-shard) shapes."""
  return cuda_attention(
      window=blocking.effective_window(window, q_BTNH.shape[1]), seq_len=q_BTNH.shape[1],
      dtype=q_BTNH.dtype, has_segments=segment_ids is not None,
      cudnn_unavailable=cudnn.unsupported_reason(q_BTNH, segment_ids))


def cuda_auto(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None):
  """attention()'s "auto" branch on CUDA: the kernel `cuda_attention` picks for this layer."""
  choice = cuda_attention_for(q_BTNH, segment_ids, window)
  if platform() == "cuda":  # platform_dependent traces this branch on every platform
    logging.info("attention on cuda, T=%d, window=%s: %s (%s)", q_BTNH.shape[1], window,
                 choice.impl, choice.why)
  kernel = cudnn.attention if choice.impl == CUDNN else pallas_gpu.attention
  return kernel(q_BTNH, k_BTKH, v_BTKH, window=window, segment_ids=segment_ids)
