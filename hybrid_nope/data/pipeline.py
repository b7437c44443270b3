"""grain pipelines: an infinite, shuffled, process-sharded train iterator and fixed eval batches.

Rows come from a packed source (see `ROW_SOURCES`), held in memory as [S, T] arrays. The train
pipeline shuffles row *indices* and gathers a whole batch with one fancy index, so its only
state is how many batches were taken: `iterator.get_state()` is {"next_index": n}, and a
restored iterator yields exactly the batches the original would have yielded next. Save it in
the trainer's orbax CheckpointManager under the item name "data":

  mngr.save(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  mngr.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(it)))
"""

import functools
from typing import Callable

import grain
import numpy as np

from hybrid_nope.data import packing
from hybrid_nope.data import stdlib_corpus
from hybrid_nope.data.tokenizer import ByteTokenizer

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")
_MISSING = object()


def _config_value(config, key: str):
  """config["data.seq_len"] style lookup; a missing key names itself."""
  value = config
  for part in key.split("."):
    value = value.get(part, _MISSING) if hasattr(value, "get") else _MISSING
    if value is _MISSING:
      raise ValueError(f"config.{key} is missing")
  return value


def _positive_int(config, key: str) -> int:
  value = _config_value(config, key)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"config.{key} must be a positive int, got {value!r}")
  return int(value)


# ---- row sources: name -> fn(config, split) -> packed rows (dict of [S, T] arrays) ----------

@functools.lru_cache(maxsize=4)  # ~0.5 GB per full-corpus train entry; tests reuse one seq_len
def _stdlib_packed(split: str, seq_len: int, eval_fraction: float) -> dict[str, np.ndarray]:
  tokenizer = ByteTokenizer()
  docs = stdlib_corpus.documents(split, eval_fraction)
  rows = packing.pack_documents([tokenizer.encode(data) for _, data in docs], seq_len)
  for array in rows.values():
    array.flags.writeable = False  # shared by every caller through the cache
  return rows


def _stdlib_rows(config, split: str) -> dict[str, np.ndarray]:
  eval_fraction = _config_value(config, "data.eval_fraction")
  if not isinstance(eval_fraction, (float, int)) or not 0 < eval_fraction < 1:
    raise ValueError(
        f"config.data.eval_fraction must be a float in (0, 1), got {eval_fraction!r}")
  return _stdlib_packed(split, _positive_int(config, "data.seq_len"), float(eval_fraction))


# "mds" (ProLong / TextbookChapters) plugs in here with the same signature.
ROW_SOURCES: dict[str, Callable[..., dict[str, np.ndarray]]] = {"stdlib": _stdlib_rows}


def packed_rows(config, split: str) -> dict[str, np.ndarray]:
  """Packed rows of `split` ("train" or "eval") from the source named by config.data.source."""
  source = _config_value(config, "data.source")
  if source not in ROW_SOURCES:
    raise ValueError(
        f"config.data.source must be one of {sorted(ROW_SOURCES)}, got {source!r}")
  return ROW_SOURCES[source](config, split)


# ---- pipelines ------------------------------------------------------------------------------

def train_dataset(rows: dict[str, np.ndarray], *, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
  """Infinite MapDataset of this process's batches of `rows`, reshuffled every epoch.

  Order: shuffle -> repeat -> shard -> batch. grain's shuffle seeds epoch e with seed + e, so
  each epoch is a new permutation (and seed s + 1 starts with seed s's second epoch).
  Sharding the global index stream with [p::count] makes process p's batch k, together with
  the other processes' batch k, exactly the global (single-process) batch k: the data seen
  does not depend on the number of processes.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count="
                     f"{process_count})")
  num_rows = len(rows["inputs"])
  ds = grain.MapDataset.range(num_rows).shuffle(seed=seed).repeat()
  ds = ds[process_index::process_count].batch(batch_size, drop_remainder=True)
  return ds.map(lambda index_B: {k: rows[k][index_B] for k in BATCH_KEYS})


def train_iterator(config, *, process_index: int = 0,
                   process_count: int = 1) -> grain.DatasetIterator:
  """Infinite iterator of {BATCH_KEYS: [data.batch_size // process_count, data.seq_len]}."""
  batch_size = _positive_int(config, "data.batch_size")
  if batch_size % process_count:
    raise ValueError(f"config.data.batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  seed = _config_value(config, "data.seed")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f"config.data.seed must be an int in [0, 2**32) (grain's shuffle seed), "
                     f"got {seed!r}")
  ds = train_dataset(packed_rows(config, "train"), batch_size=batch_size // process_count,
                     seed=int(seed), process_index=process_index,
                     process_count=process_count)
  # Rows are in memory and a batch is one gather: worker threads would only contend for the
  # GIL, and without a prefetch buffer the iterator state is just the next batch index.
  read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return iter(ds.to_iter_dataset(read_options))


def eval_batches(config) -> list[dict[str, np.ndarray]]:
  """The first eval.num_batches batches of the eval split, in order (no shuffling)."""
  batch_size = _positive_int(config, "eval.batch_size")
  num_batches = _positive_int(config, "eval.num_batches")
  rows = packed_rows(config, "eval")
  needed = batch_size * num_batches
  if needed > len(rows["inputs"]):
    raise ValueError(
        f"config.eval.num_batches={num_batches} x config.eval.batch_size={batch_size} needs "
        f"{needed} rows but the eval split has only {len(rows['inputs'])}")
  return [{k: np.array(rows[k][i * batch_size:(i + 1) * batch_size]) for k in BATCH_KEYS}
          for i in range(num_batches)]
