"""`model.pattern`: the layer letters repeated to the model's depth (model/kind_specs.py holds
what each letter is)."""
from __future__ import annotations

from hybrid_nope.model.kind_specs import KINDS


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
