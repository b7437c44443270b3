"""The implementation policy of a recurrent mixer (linear attention, the delta rule): an XLA
path that runs everywhere and Pallas kernels per platform, which "auto" takes only on the
platforms named where the mixer is defined (measured faster there). attention() has its own
per-layer choice (gpu_choice.py) and cuDNN besides, so it does not use this."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

from hybrid_nope.kernels.attention import _platform

IMPLS = ("auto", "xla", "pallas")
# The Pallas module each platform needs, for the message when this jax build lacks it.
PALLAS_MODULES = {"cuda": "jax.experimental.pallas.triton", "tpu": "jax.experimental.pallas.tpu"}
PLATFORM_NAMES = {"cuda": "CUDA GPUs", "tpu": "TPU"}


@dataclasses.dataclass(frozen=True)
class Dispatch:
  mixer: str  # for messages: "linear attention"
  xla: Callable
  pallas: dict[str, ModuleType]  # platform -> kernel module (available(), `function`)
  function: str  # the kernel's name in each Pallas module
  auto_platforms: Callable[[], tuple[str, ...]]  # read at call time: the mixer's constant

  def unavailable_reason(self, impl: str) -> str | None:
    if impl not in IMPLS:
      raise ValueError(f"impl={impl!r}: expected one of {IMPLS}")
    if impl in ("xla", "auto"):
      return None
    platform = _platform()  # the target_platform(...) context, else this backend
    if platform not in self.pallas:
      modules = " and ".join(m.__name__.rsplit(".", 1)[-1] for m in self.pallas.values())
      names = " and ".join(PLATFORM_NAMES[p] for p in self.pallas)
      return (f"the Pallas {self.mixer} kernels compile for {names} only; "
              f"the platform is {platform!r} (tests run them with interpret=True on "
              f"{modules})")
    if not self.pallas[platform].available():
      return f"{PALLAS_MODULES[platform]} is missing"
    return None

  def available_impls(self) -> tuple[str, ...]:
    """Concrete implementations that can run on the target platform."""
    return tuple(i for i in IMPLS[1:] if self.unavailable_reason(i) is None)

  def per_platform(self, impl: str) -> dict:
    """platform -> kernel for jax.lax.platform_dependent (only the lowered platform's branch
    is kept), as attention._per_platform."""
    if impl == "xla":
      return {"default": self.xla}
    pallas = {p: getattr(m, self.function) for p, m in self.pallas.items() if m.available()}
    if impl == "pallas":
      return pallas
    return {**{p: k for p, k in pallas.items() if p in self.auto_platforms()},
            "default": self.xla}

  def resolve(self, impl: str) -> str:
    """The concrete implementation `impl` means on the target platform; ValueError if
    unavailable."""
    reason = self.unavailable_reason(impl)
    if reason is not None:
      raise ValueError(f"impl={impl!r} is not available here: {reason}. Available: "
                       f"{self.available_impls()}")
    if impl == "auto":
      return "pallas" if _platform() in self.per_platform("auto") else "xla"
    return impl
