"""Attention kernels behind one dispatch function each (contracts in DESIGN.md): softmax
attention(...), gated linear attention linear_attention(...) and the gated delta rule
delta_attention(...) (with its one-token form delta_step and a prompt's state,
delta_prefill)."""
from hybrid_nope.kernels import jax_compat
from hybrid_nope.kernels.attention import IMPLS, attention, available_impls, resolve
from hybrid_nope.kernels.dispatch import target_platform
from hybrid_nope.kernels.delta_attention import IMPLS as DELTA_IMPLS
from hybrid_nope.kernels.delta_attention import delta_attention, delta_prefill, delta_step
from hybrid_nope.kernels.linear_attention import IMPLS as LINEAR_IMPLS
from hybrid_nope.kernels.linear_attention import linear_attention

__all__ = ["DELTA_IMPLS", "IMPLS", "LINEAR_IMPLS", "attention", "available_impls",
           "delta_attention", "delta_prefill", "delta_step", "linear_attention", "resolve",
           "target_platform"]

jax_compat.lower_triton_without_gpu()
