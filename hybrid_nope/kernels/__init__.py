"""Attention kernels behind one dispatch function (contract in DESIGN.md)."""
from hybrid_nope.kernels.attention import IMPLS, attention, available_impls, resolve, target_platform

__all__ = ["IMPLS", "attention", "available_impls", "resolve", "target_platform"]
