"""What every reader of a checkpoint checks, in one place: the per-leaf checksums the trainer
saves in each checkpoint's "meta" item (train/checkpoint.py writes them; the trainer's resume,
analysis, the report and the HF export all verify them), and the one-line messages a reader
gives for a checkpoint that fails them or cannot be read at all."""
from __future__ import annotations

import re
from typing import Mapping

import jax
import jax.numpy as jnp

from hybrid_nope.run_dir import CHECKPOINT_STATE

# The path of TrainState.params (train/state.py) in the keys of meta's checksums: a params leaf
# is saved as ".params['blocks'][0]['attn']['wq_DNH']".
PARAMS_PREFIX = jax.tree_util.keystr((jax.tree_util.GetAttrKey("params"),))


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


def params_checksums(params) -> dict[str, jax.Array]:
  """state_checksums of TrainState.params alone, under the keys the whole state has them."""
  return {PARAMS_PREFIX + key: value for key, value in state_checksums(params).items()}


def differing_leaves(saved: Mapping[str, int], computed: Mapping[str, int]) -> list[str]:
  """The keys of `computed` (in its order) whose checksum is not the one `saved` holds for
  them; a key `saved` lacks differs too. `computed` may cover only part of the saved state."""
  return [key for key, value in computed.items()
          if key not in saved or int(saved[key]) != int(value)]


def corrupt_message(step: int, step_dir: str, differing: list[str]) -> str:
  """The one line for checkpoint `step` (DIR/checkpoints/<step>) whose leaves `differing`
  (from differing_leaves, non-empty) fail their checksums."""
  return (f"checkpoint step {step} is corrupt: {len(differing)} leaves of {step_dir}/"
          f"{CHECKPOINT_STATE} differ from the checksums saved with them (first: {differing[0]})")


_STATUS = re.compile(r"\b(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|INVALID_ARGUMENT|FAILED_PRECONDITION"
                     r"|INTERNAL|UNKNOWN|UNAVAILABLE|PERMISSION_DENIED)\b: [^\n]{0,300}")


def read_error(error: BaseException, where: str) -> str:
  """The line that says what failed (tensorstore's status, e.g. OUT_OF_RANGE reading "w/0.0"),
  from an exception chain whose outer messages hold pages of TensorStore spec; without one, the
  first line of the outermost message, after `where`."""
  chain = []
  while error is not None and len(chain) < 10:
    chain.append(error)
    error = error.__cause__ or error.__context__
  for e in reversed(chain):  # The innermost cause is the most specific.
    status = _STATUS.search(str(e))
    if status:
      return status.group(0)
  text = str(chain[0]).strip()
  return f"{where}: {text.splitlines()[0][:200] if text else type(chain[0]).__name__}"


def unreadable_message(step: int, error: BaseException, where: str) -> str:
  """The one line for checkpoint `step` whose files at `where` orbax could not read."""
  return f"checkpoint step {step} cannot be read ({read_error(error, where)})"
