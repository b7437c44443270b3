"""Attention kernels behind one dispatch function each (contracts in DESIGN.md): softmax
attention(...) and gated linear attention linear_attention(...)."""
from hybrid_nope.kernels.attention import IMPLS, attention, available_impls, resolve, target_platform
from hybrid_nope.kernels.linear_attention import IMPLS as LINEAR_IMPLS
from hybrid_nope.kernels.linear_attention import linear_attention

__all__ = ["IMPLS", "LINEAR_IMPLS", "attention", "available_impls", "linear_attention",
           "resolve", "target_platform"]
