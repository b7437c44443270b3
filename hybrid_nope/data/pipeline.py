"""grain pipelines: an infinite, shuffled, process-sharded train iterator and fixed eval batches.

Rows come from a source (see `ROW_SOURCES`): "stdlib" holds them in memory as [S, T] arrays,
and the train pipeline shuffles row *indices* and gathers a whole batch with one fancy index;
"mds" (ProLong, `hybrid_nope.data.prolong`) reads them from memory-mapped MDS shards as an
infinite, already mixed and shuffled grain MapDataset, and evaluates on TextbookChapters
(`hybrid_nope.data.textbook_chapters`). Either way element k of the train stream is a pure
function of k, so the iterator's only state is how many batches were taken:
`iterator.get_state()` is {"next_index": n}, and a restored iterator yields exactly the batches
the original would have yielded next. Save it in the trainer's orbax CheckpointManager under
the item name "data":

  mngr.save(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  mngr.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(it)))
"""

import functools
from typing import Callable, Union

import grain
import numpy as np

from hybrid_nope.data import packing
from hybrid_nope.data import stdlib_corpus
from hybrid_nope.data.tokenizer import ByteTokenizer

BATCH_KEYS, BATCH_DTYPES = packing.ROW_KEYS, packing.ROW_DTYPES  # A batch is rows stacked.
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


def _mds_rows(config, split: str):
  """Train split: the ProLong mixture, an infinite grain MapDataset of rows (element k is the
  k-th row of the global stream). Eval split: TextbookChapters rows, in memory."""
  seq_len = _positive_int(config, "data.seq_len")
  vocab_size = _positive_int(config, "model.vocab_size")
  if split == "eval":
    from hybrid_nope.data import textbook_chapters  # pylint: disable=g-import-not-at-top
    path = _config_value(config, "eval.path")
    if not isinstance(path, str) or not path:
      raise ValueError(f"config.eval.path must name the prepared TextbookChapters directory, "
                       f"got {path!r}")
    num_rows = _positive_int(config, "eval.batch_size") * _positive_int(config,
                                                                        "eval.num_batches")
    return textbook_chapters.eval_rows(path, seq_len=seq_len, num_rows=num_rows,
                                       vocab_size=vocab_size)
  if split != "train":
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  from hybrid_nope.data import prolong  # pylint: disable=g-import-not-at-top
  path = _config_value(config, "data.path")
  masking = _config_value(config, "data.document_masking")
  if not isinstance(masking, bool):
    raise ValueError(f"config.data.document_masking must be True or False, got {masking!r}")
  cache_dir = _config_value(config, "data.cache_dir")
  if not isinstance(cache_dir, str):
    raise ValueError(f"config.data.cache_dir must be a path or '', got {cache_dir!r}")
  mixture = prolong.build_mixture(
      path, _config_value(config, "data.domains"), seq_len=seq_len, document_masking=masking,
      vocab_size=vocab_size, seed=_seed(config), cache_dir=cache_dir or None,
      verify_hashes=_config_value(config, "data.verify_hashes"))
  return grain.MapDataset.source(mixture)


Rows = Union[dict[str, np.ndarray], grain.MapDataset]
# name -> fn(config, split) -> rows: a dict of in-memory [S, T] arrays, or (train) an infinite
# grain.MapDataset of row dicts that is already shuffled.
ROW_SOURCES: dict[str, Callable[..., Rows]] = {"stdlib": _stdlib_rows, "mds": _mds_rows}


def packed_rows(config, split: str) -> Rows:
  """Rows of `split` ("train" or "eval") from the source named by config.data.source."""
  source = _config_value(config, "data.source")
  if source not in ROW_SOURCES:
    raise ValueError(
        f"config.data.source must be one of {sorted(ROW_SOURCES)}, got {source!r}")
  return ROW_SOURCES[source](config, split)


# ---- pipelines ------------------------------------------------------------------------------

def train_dataset(rows: Rows, *, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
  """Infinite MapDataset of this process's batches of `rows`, reshuffled every epoch.

  In-memory rows: shuffle -> repeat -> shard -> batch. A MapDataset of rows (already infinite
  and shuffled; `seed` is unused) is only sharded and batched. grain's shuffle seeds epoch e with seed + e, so
  each epoch is a new permutation (and seed s + 1 starts with seed s's second epoch).
  Sharding the global index stream with [p::count] makes process p's batch k, together with
  the other processes' batch k, exactly the global (single-process) batch k: the data seen
  does not depend on the number of processes.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count="
                     f"{process_count})")
  if isinstance(rows, grain.MapDataset):
    return rows[process_index::process_count].batch(batch_size, drop_remainder=True)
  num_rows = len(rows["inputs"])
  ds = grain.MapDataset.range(num_rows).shuffle(seed=seed).repeat()
  ds = ds[process_index::process_count].batch(batch_size, drop_remainder=True)
  return ds.map(lambda index_B: {k: rows[k][index_B] for k in BATCH_KEYS})


def _seed(config) -> int:
  seed = _config_value(config, "data.seed")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f"config.data.seed must be an int in [0, 2**32) (grain's shuffle seed), "
                     f"got {seed!r}")
  return int(seed)


def train_iterator(config, *, process_index: int = 0,
                   process_count: int = 1) -> grain.DatasetIterator:
  """Infinite iterator of {BATCH_KEYS: [data.batch_size // process_count, data.seq_len]}."""
  batch_size = _positive_int(config, "data.batch_size")
  if batch_size % process_count:
    raise ValueError(f"config.data.batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  seed = _seed(config)
  ds = train_dataset(packed_rows(config, "train"), batch_size=batch_size // process_count,
                     seed=seed, process_index=process_index,
                     process_count=process_count)
  # A batch is one gather (stdlib) or a few numpy ops per row on memory-mapped shards (mds):
  # worker threads would only contend for the GIL, and without a prefetch buffer the iterator
  # state is just the next batch index. The host builds the next batch while the accelerator
  # runs the current step (JAX dispatch is asynchronous); benchmarks/data.py has the rates.
  read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return iter(ds.to_iter_dataset(read_options))


def eval_batches(config) -> list[dict[str, np.ndarray]]:
  """The first eval.num_batches batches of the eval split, in order (no shuffling).

  For "mds" these are TextbookChapters rows, one chapter per row from its first token: score
  them by position bucket with `position_buckets`.
  """
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


def position_buckets(seq_len: int, bucket_size: int) -> np.ndarray:
  """int32 [seq_len]: the eval bucket of each token index, index // bucket_size.

  Per bucket b the eval loss is sum(loss * weights over batches, rows and indices in b) /
  sum(weights over the same); on TextbookChapters rows index = position in the chapter.
  """
  for name, value in (("data.seq_len", seq_len), ("eval.bucket_size", bucket_size)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"config.{name} must be a positive int, got {value!r}")
  return (np.arange(seq_len) // bucket_size).astype(np.int32)
