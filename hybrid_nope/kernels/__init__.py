"""Attention kernels behind one dispatch function (contract in DESIGN.md)."""
from hybrid_nope.kernels.attention import IMPLS, attention

__all__ = ["IMPLS", "attention"]
