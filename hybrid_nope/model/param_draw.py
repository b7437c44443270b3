"""Parameter initialisers, and their draws in fixed-size blocks: a compiled program per
distribution, not per parameter shape.

Every program that draws threefry bits costs ~0.22 CPU-s of XLA:CPU compile whatever its shape,
so a model drew in a program per distinct parameter shape (six at 120m SG; a graph of every
draw, before issue 48, compiled in 9 CPU-s, and 3m15s on an H200). With jax's partitionable
threefry (the default), element i of a draw is a pure function of the key and of i, its index in
the row-major [fan_in, fan_out] matrix. So one program draws BLOCK elements from any offset,
and a parameter is its blocks laid end to end, bit for bit what one draw of its shape gives:
`drawn` assembles them on the host, one parameter at a time, and places the value in its shards.
Inside a trace (jax.jit or eval_shape of the model's init) a parameter is drawn whole, inline.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import random as jax_random

# Elements per block: 1 MiB of float32. A parameter wastes at most one block's tail (~4 ms of
# CPU), and 120m takes ~460 blocks.
BLOCK = 2 ** 18
# The standard deviation of a unit normal truncated to (-2, 2), as jax's variance_scaling has it.
_TRUNCATED_STDDEV = np.float32(.87962566103423978)


@dataclasses.dataclass(frozen=True)
class Init:
  """An initialiser: unit draws of `distribution` times a standard deviation, 1/sqrt(fan-in)
  (rescaled for the truncation) where `fan_in_scaled`, else 1. Bit for bit jax's
  variance_scaling(1, "fan_in", "truncated_normal") and normal(1) (tests/test_model_param_draw).
  """
  distribution: str  # "truncated_normal" (to ±2 standard deviations) or "normal"
  fan_in_scaled: bool

  def __post_init__(self):
    if self.distribution not in ("truncated_normal", "normal"):
      raise ValueError(f"Init distribution {self.distribution!r}: expected 'truncated_normal' "
                       "or 'normal'")

  def stddev(self, fan_in: int) -> np.float32:
    if not self.fan_in_scaled:
      return np.float32(1.0)
    return np.sqrt(np.float32(1.0 / fan_in)) / _TRUNCATED_STDDEV

  def unit(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if self.distribution == "truncated_normal":
      return jax.random.truncated_normal(key, -2, 2, shape, jnp.float32)
    return jax.random.normal(key, shape, jnp.float32)

  def __call__(self, key: jax.Array, shape: tuple[int, int], dtype=jnp.float32) -> jax.Array:
    """A [fan_in, fan_out] draw, as a flax initialiser."""
    assert dtype == jnp.float32, dtype
    return self.unit(key, shape) * self.stddev(shape[0])


def _offset_threefry_bits(key_data: jax.Array, bit_width: int, shape) -> jax.Array:
  """Partitionable threefry's bits of flat indices offset + [0, prod(shape)), key_data being
  (key word 0, key word 1, offset): what jax's own draw of a larger array holds there."""
  if bit_width != 32:
    raise NotImplementedError(f"blocked draws take 32-bit samples, not {bit_width}-bit")
  counts_lo = key_data[2] + jax.lax.iota(np.uint32, math.prod(shape))
  bits_hi, bits_lo = jax_random.threefry2x32_p.bind(
      key_data[0], key_data[1], jnp.zeros_like(counts_lo), counts_lo)
  return (bits_hi ^ bits_lo).reshape(shape)


def _no_key_derivation(*_):
  raise NotImplementedError("an offset key only draws; derive keys before offsetting them")


_OFFSET_THREEFRY = jax_random.define_prng_impl(
    key_shape=(3,), seed=_no_key_derivation, split=_no_key_derivation,
    random_bits=_offset_threefry_bits, fold_in=_no_key_derivation, name="offset_threefry")


@functools.partial(jax.jit, static_argnames=("init",))
def _block(key_data: jax.Array, stddev: jax.Array, *, init: Init) -> jax.Array:
  """Elements [offset, offset + BLOCK) of a draw, key_data = (key words, offset)."""
  key = jax.random.wrap_key_data(key_data, impl=_OFFSET_THREEFRY)
  # One program per distribution, not both selected in one: fused together, XLA rounds 0.1% of
  # elements differently from the whole draw's program (1 ulp).
  return init.unit(key, (BLOCK,)) * stddev


def blockable(key: jax.Array, size: int) -> bool:
  """Whether blocks reproduce the key's own draw of `size` elements: partitionable threefry,
  counts that fit one 32-bit word, and a concrete key (not inside a trace)."""
  return (not isinstance(key, jax.core.Tracer) and jax.config.jax_threefry_partitionable
          and str(jax.random.key_impl(key)) == "threefry2x32" and size + BLOCK < 2 ** 32)


def drawn_matrix(key: jax.Array, init: Init, fan_in: int, fan_out: int) -> np.ndarray:
  """init(key, (fan_in, fan_out)) on the host, drawn in blocks."""
  size = fan_in * fan_out
  words = np.asarray(jax.random.key_data(key), np.uint32)
  stddev = init.stddev(fan_in)
  blocks = [_block(np.array([words[0], words[1], start], np.uint32), stddev, init=init)
            for start in range(0, size, BLOCK)]  # dispatched before any is waited for
  value = np.empty(len(blocks) * BLOCK, np.float32)
  for i, block in enumerate(blocks):
    value[i * BLOCK:(i + 1) * BLOCK] = np.asarray(block)
  return value[:size].reshape(fan_in, fan_out)


def placed(value: np.ndarray, spec: tuple) -> jax.Array:
  """A host value on the devices: in the shards of `spec` (mesh axes, one per dimension) under
  the mesh jax.set_mesh has set, or on the default device."""
  mesh = jax.sharding.get_mesh()
  if mesh.empty or all(axis is None for axis in spec):
    return jnp.asarray(value)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
