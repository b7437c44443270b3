"""What every reader of a checkpoint checks, in one place: the per-leaf checksums the trainer
saves in each checkpoint's "meta" item (run/checkpoint.py writes them; the trainer's resume,
analysis, the report and the HF export all verify them), the one-line messages a reader
gives for a checkpoint that fails them or cannot be read at all, and how a reader lists and
reads steps while a trainer is still saving and deleting them."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import logging
import re
import sys
import tempfile
import time
import traceback
from typing import Callable, Mapping, TypeVar

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import CHECKPOINT_STATE

T = TypeVar("T")

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


# ---- reading beside a live trainer ---------------------------------------------------------
# orbax writes a step as <step>.orbax-checkpoint-tmp-<time>/ and renames it when done (local
# disks), or in place with commit_success.txt written last (gs://); the trainer's
# checkpoint.keep deletes old steps while a reader may be reading them. A reader lists steps
# itself (orbax's CheckpointManager raises FileNotFoundError for a step deleted while it lists)
# and reads only those that hold the commit marker.
COMMIT_MARKER = ocp.path.atomicity_types.COMMIT_SUCCESS_FILE
_STEP_NAME = re.compile(r"^(\d+)(" + re.escape(ocp.path.atomicity_types.TMP_DIR_SUFFIX) + r".*)?$")
SETTLE_SECONDS = 1.0  # After a failed read, how long tensorstore's threads take to stop.


@dataclasses.dataclass(frozen=True)
class StepListing:
  """The steps of a checkpoint directory: `finished` ones (committed, oldest first), and
  `unfinished` ones (being written, or being deleted: no commit marker)."""
  finished: tuple[int, ...]
  unfinished: tuple[int, ...]

  def written_after(self, step: int) -> list[int]:
    """Unfinished steps newer than `step`: saves in flight."""
    return [s for s in self.unfinished if s > step]


def list_steps(directory: str) -> StepListing:
  """The StepListing of `directory` (local or a URL); empty when it does not exist. On a local
  disk, where orbax renames a step only once it is written, a directory none of whose steps
  holds a commit marker is from an orbax that wrote none: its steps all count as finished."""
  try:
    names = storage.listdir(directory)
  except FileNotFoundError:
    return StepListing((), ())
  marked, unmarked, temporary = set(), set(), set()
  for name in names:
    match = _STEP_NAME.match(name)
    if match is None:
      continue  # owner.json, rolled_back/, ...
    step = int(match.group(1))
    if match.group(2):
      temporary.add(step)
    elif storage.exists(storage.join(directory, name, COMMIT_MARKER)):
      marked.add(step)
    else:
      unmarked.add(step)
  if not marked and storage.local_path(directory) is not None:  # Before commit markers.
    marked, unmarked = unmarked, set()
  return StepListing(tuple(sorted(marked)), tuple(sorted((unmarked | temporary) - marked)))


def being_written_message(listing: StepListing, step: int) -> str | None:
  """'step N is being written; reading step M' when a save newer than `step` is in flight."""
  newer = listing.written_after(step)
  return f"step {newer[-1]} is being written; reading step {step}" if newer else None


class _Held(logging.Filter):
  """Holds asyncio's records (a failed read's tasks: "Task exception was never retrieved") in
  `into` instead of letting them reach a handler."""

  def __init__(self, into: io.StringIO):
    super().__init__()
    self.into = into

  def filter(self, record):
    self.into.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")
    return False


def read_quietly(read: Callable[[], T], describe: Callable[[BaseException], UserError]) -> T:
  """read(), with what tensorstore's and orbax's threads print meanwhile held back: a failed
  read's callbacks into orbax's closed event loop print pages of "Event loop is closed"
  tracebacks from other threads, and its abandoned coroutines and tasks more when collected.
  After a good read the held text is passed on; after a failed one it goes, with the
  traceback, to a temporary file, and the error is raised as one line: a UserError from read()
  as it is, any other as describe(error), either naming the file when something was held."""
  printed = io.StringIO()
  held = _Held(printed)
  logging.getLogger("asyncio").addFilter(held)
  try:
    with contextlib.redirect_stderr(printed):
      try:
        result = read()
      except Exception:
        time.sleep(SETTLE_SECONDS)  # Reads still in flight finish (and print) here,
        gc.collect()  # and the failed ones' coroutines report now, not at a later collection.
        raise
  except Exception as e:  # orbax and tensorstore raise many kinds; the cause is in the text.
    error = e if isinstance(e, UserError) else describe(e)
    if printed.getvalue():
      with tempfile.NamedTemporaryFile("w", prefix="checkpoint_read_", suffix=".txt",
                                       delete=False) as log:
        log.write("".join(traceback.format_exception(e)) + printed.getvalue())
      error = type(error)(f"{error} (what orbax's threads printed: {log.name})")
    raise error from None
  finally:
    logging.getLogger("asyncio").removeFilter(held)
  sys.stderr.write(printed.getvalue())
  return result
