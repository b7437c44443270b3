"""What every reader of a checkpoint checks, in one place: the per-leaf checksums the trainer
saves in each checkpoint's "meta" item (train/checkpoint.py writes them; the trainer's resume,
analysis, the report and the HF export all verify them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

META_ITEM = "meta"  # DIR/checkpoints/<step>/meta: JSON (checksums, data position, config, ...).
STATE_ITEM = "state"


def leaf_checksum(x: jax.Array) -> jax.Array:
  """A uint32 sum of the leaf's bits, each word weighted by an odd number from its position:
  one flipped bit anywhere, or two values swapped, changes it."""
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:
    words = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    if x.dtype.itemsize == 8:  # x64: each word splits into two uint32 on a new last axis.
      words = jax.lax.bitcast_convert_type(words, jnp.uint32)
    words = words.astype(jnp.uint32)
  weights = 2 * jax.lax.iota(jnp.uint32, words.size).reshape(words.shape) + 1
  return jnp.sum(words * weights, dtype=jnp.uint32)


def state_checksums(state) -> dict[str, jax.Array]:
  """{leaf path: uint32 checksum} of a pytree (jittable; sharded leaves reduce globally)."""
  return {jax.tree_util.keystr(path): leaf_checksum(jnp.asarray(leaf))
          for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
