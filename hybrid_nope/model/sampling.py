"""The next token from a row of logits: greedy (temperature 0), or temperature and nucleus (top-p).

Nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration") keeps the
smallest set of most probable tokens whose probability sums to at least `top_p`, renormalised;
`top_p = 1` keeps every token.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_nope.errors import UserError


class SamplingError(UserError):
  pass


def check(temperature: float, top_p: float) -> None:
  """A temperature >= 0 (0 = greedy) and a top_p in (0, 1], or SamplingError naming them."""
  if not temperature >= 0 or temperature == float("inf"):
    raise SamplingError(f"temperature={temperature!r}: expected a finite number >= 0 "
                        "(0 = greedy)")
  if not 0 < top_p <= 1:
    raise SamplingError(f"top_p={top_p!r}: expected a number in (0, 1] (1 = every token)")


def nucleus_mask(logits_BV: jax.Array, top_p) -> jax.Array:
  """bool [B, V]: the tokens of each row's nucleus. A token is in it when the probability of
  the tokens ranked before it is below `top_p` (a number, or [B, 1] per row), so the most
  probable token always is."""
  order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)
  sorted_probs_BV = jax.nn.softmax(jnp.take_along_axis(logits_BV, order_BV, -1), axis=-1)
  before_BV = jnp.cumsum(sorted_probs_BV, axis=-1) - sorted_probs_BV
  keep_sorted_BV = before_BV < top_p
  rows_B1 = jnp.arange(logits_BV.shape[0])[:, None]
  return jnp.zeros(logits_BV.shape, bool).at[rows_B1, order_BV].set(keep_sorted_BV)


def next_token(logits_BV: jax.Array, key: jax.Array, *, temperature: float,
               top_p: float) -> jax.Array:
  """int32 [B]: argmax at temperature 0, else a draw from softmax(logits / temperature)
  restricted to the nucleus. `temperature` and `top_p` are Python numbers (static)."""
  logits_BV = logits_BV.astype(jnp.float32)
  if temperature == 0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  scaled_BV = logits_BV / temperature
  if top_p < 1:
    scaled_BV = jnp.where(nucleus_mask(scaled_BV, top_p), scaled_BV, -jnp.inf)
  return jax.random.categorical(key, scaled_BV, axis=-1).astype(jnp.int32)
