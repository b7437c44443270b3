"""Flax NNX modules of the hybrid SWA / global-NoPE language model."""
from hybrid_nope.model.pattern import layer_kinds
from hybrid_nope.model.transformer import LanguageModel, parameter_counts

__all__ = ["LanguageModel", "layer_kinds", "parameter_counts"]
