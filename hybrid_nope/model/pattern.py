"""The layer letters of `model.pattern`: the one place each kind is named and described.

  S  sliding-window attention   records' layer_type "swa"     a local mixer (window w)
  G  global causal attention    "global"                      NoPE by default: reads recency out
  L  gated linear attention     "linear"                      a local mixer (data-dependent decay)
  D  gated delta rule           "delta"                       a local mixer (decay and erase)
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LayerKind:
  letter: str
  layer_type: str    # `layer_type` in recency records (DESIGN.md)
  description: str
  local: bool        # a local mixer: plants recency into the residual stream
  windowed: bool     # reads model.window


KINDS = {k.letter: k for k in (
    LayerKind("S", "swa", "sliding-window attention", local=True, windowed=True),
    LayerKind("G", "global", "global attention", local=False, windowed=False),
    LayerKind("L", "linear", "gated linear attention", local=True, windowed=False),
    LayerKind("D", "delta", "gated delta rule (Gated DeltaNet)", local=True, windowed=False),
)}


def layer_kinds(pattern: str, num_layers: int) -> str:
  """`pattern` repeated to `num_layers`, e.g. ("SG", 4) -> "SGSG"."""
  unknown = sorted(set(pattern) - set(KINDS))
  if not pattern or unknown:
    letters = {k: v.description for k, v in KINDS.items()}
    raise ValueError(f"config.model.pattern={pattern!r} is invalid: expected a non-empty string "
                     f"of letters from {letters}; unknown letters {unknown}")
  if num_layers < 1 or num_layers % len(pattern):
    raise ValueError(f"config.model.num_layers={num_layers} is invalid: expected a positive "
                     f"multiple of len(model.pattern)={len(pattern)} (pattern {pattern!r})")
  return pattern * (num_layers // len(pattern))


def window_of(model_cfg) -> int | None:
  """model.window where some layer reads it, else None (a pattern without S layers)."""
  return model_cfg.window if any(KINDS[k].windowed for k in set(model_cfg.pattern)) else None


def layer_type(letter: str) -> str:
  return KINDS[letter].layer_type
