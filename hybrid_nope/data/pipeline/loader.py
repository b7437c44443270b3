"""grain pipelines: an infinite, shuffled, process-sharded train iterator and fixed eval batches.

Rows come from the source config.data.source names (`hybrid_nope.data.sources.registry`):
in-memory sources ("stdlib", "documents") hold them as [S, T] arrays, and the train pipeline
shuffles row *indices* and gathers a whole batch with one fancy index; "mds" (ProLong) and the
text sources read them as an infinite, already mixed and shuffled grain MapDataset, and
evaluate on rows in memory (TextbookChapters, one eval document per row). Either way element k of the train stream is a pure
function of k, so the iterator's only state is how many batches were taken:
`iterator.get_state()` is {"next_index": n}, and a restored iterator yields exactly the batches
the original would have yielded next. Save it in the trainer's orbax CheckpointManager under
the item name "data":

  mngr.save(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  mngr.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(it)))
"""

import logging

import grain
import numpy as np

from hybrid_nope import config_values
from hybrid_nope.errors import ConfigError
from hybrid_nope.data.pipeline import packing
from hybrid_nope.data.sources import registry
from hybrid_nope.data.sources.registry import Rows, packed_rows
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer

BATCH_KEYS, BATCH_DTYPES = packing.ROW_KEYS, packing.ROW_DTYPES  # A batch is rows stacked.
# Config values are read through hybrid_nope.config_values, the one place a key is checked: a part
# config (tests, tools) fails on its first bad or missing key exactly as the trainer's would.
_positive_int = config_values.positive_int
_log = logging.getLogger(__name__)


# ---- pipelines ------------------------------------------------------------------------------

def train_dataset(rows: Rows, *, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1, start_row: int = 0) -> grain.MapDataset:
  """Infinite MapDataset of this process's batches of `rows`, reshuffled every epoch, from row
  `start_row` of the global row stream on (the rows a resumed run has consumed: counting rows,
  not batches, lets a resume change the batch size and still read every row once).

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
  if start_row < 0:
    raise ValueError(f"start_row={start_row} must be >= 0")
  if isinstance(rows, grain.MapDataset):
    return rows[start_row:][process_index::process_count].batch(batch_size, drop_remainder=True)
  num_rows = len(rows["inputs"])
  ds = grain.MapDataset.range(num_rows).shuffle(seed=seed).repeat()[start_row:]
  ds = ds[process_index::process_count].batch(batch_size, drop_remainder=True)
  return ds.map(lambda index_B: {k: rows[k][index_B] for k in BATCH_KEYS})


def train_iterator(config, *, process_index: int = 0, process_count: int = 1,
                   start_row: int = 0) -> grain.DatasetIterator:
  """Infinite iterator of {BATCH_KEYS: [data.batch_size // process_count, data.seq_len]}, from
  row `start_row` of the global stream; its state {"next_index": n} counts batches from there."""
  batch_size = _positive_int(config, "data.batch_size")
  if batch_size % process_count:
    raise ValueError(f"config.data.batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  seed = config_values.data_seed(config)
  rows = packed_rows(config, "train")
  if isinstance(rows, grain.MapDataset):
    # mds: the first global batch is read now, so its shards' token ids are checked before the
    # run writes a record (a refusal's advised rerun then starts in a clean workdir).
    for k in range(start_row, start_row + batch_size):
      rows[k]  # pylint: disable=pointless-statement
  ds = train_dataset(rows, batch_size=batch_size // process_count,
                     seed=seed, process_index=process_index,
                     process_count=process_count, start_row=start_row)
  # A batch is one gather (stdlib) or a few numpy ops per row on memory-mapped shards (mds):
  # worker threads would only contend for the GIL, and without a prefetch buffer the iterator
  # state is just the next batch index. The host builds the next batch while the accelerator
  # runs the current step (JAX dispatch is asynchronous); benchmarks/data.py has the rates.
  read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return iter(ds.to_iter_dataset(read_options))


def eval_batches(config) -> list[dict[str, np.ndarray]]:
  """The first eval.num_batches batches of the eval split, in order (no shuffling).

  For "mds" these are TextbookChapters rows, one chapter per row from its first token (for
  "documents" one eval document per row, the same way): score
  them by position bucket with `position_buckets`.
  """
  batch_size = _positive_int(config, "eval.batch_size")
  num_batches = _positive_int(config, "eval.num_batches")
  rows = packed_rows(config, "eval")
  needed = batch_size * num_batches
  if needed > len(rows["inputs"]):
    raise ConfigError(
        f"config.eval.num_batches={num_batches} x config.eval.batch_size={batch_size} needs "
        f"{needed} rows but the eval split has only {len(rows['inputs'])}: lower "
        f"eval.num_batches (or eval.batch_size)")
  return [{k: np.array(rows[k][i * batch_size:(i + 1) * batch_size]) for k in BATCH_KEYS}
          for i in range(num_batches)]


def probe_pool(config) -> dict[str, np.ndarray]:
  """The first metrics.probe_pool_rows rows of the eval split, in order: the pool the recency
  probe is chosen from (hybrid_nope.analysis.measure.probe). It depends on the eval data and these keys
  only, never on a seed, so every run of a sweep is measured on the same documents.

  probe_pool_rows is the most rows to choose from: an eval split with fewer gives all of them,
  said in one line (the probe then measures at most all of them: analysis.measure.probe
  .probe_size; its documents are checked where they are chosen: probe.check_documents)."""
  count = _positive_int(config, "metrics.probe_pool_rows")
  rows = packed_rows(config, "eval", "metrics.probe_pool_rows")
  found = len(rows["inputs"])
  if found < count:
    _log.info("recency probe: chosen from all %d eval rows (metrics.probe_pool_rows=%d is the "
              "most it chooses from)", found, count)
  return {k: np.array(rows[k][:count]) for k in BATCH_KEYS}


def check_vocabulary(config) -> int | None:
  """Refuses a model.vocab_size below the data's tokenizer's size, before anything is built
  (on byte data, vocab_size=100 would otherwise train into NaN at step 1). stdlib
  (byte tokens), and a text source with data.tokenizer="byte": the byte tokenizer's
  ByteTokenizer.vocab_size ids; documents, mds and other text sources: each of the source's
  `tokenizer_files` (mds without one: the token ids are checked as they are read, each shard's
  at its first read, every eval row).
  Returns the largest tokenizer size checked, or None."""
  vocab_size = _positive_int(config, "model.vocab_size")
  source = registry.named(config)
  if registry.byte_tokenised(config):
    sizes = {f"the byte tokenizer (data.source={source.name})": ByteTokenizer.vocab_size}
  else:
    from hybrid_nope.data.tokenization.tokenizer import JsonTokenizer  # pylint: disable=g-import-not-at-top
    key = "data.tokenizer" if source.text else None  # mds: the data's own
    sizes = {path: JsonTokenizer(path, key).vocab_size
             for path in source.tokenizer_files(config)}
  for name, size in sizes.items():
    if size > vocab_size:
      raise ConfigError(
          f"config.model.vocab_size={vocab_size} is smaller than {name}'s {size} token ids: "
          f"pass --config.model.vocab_size={size} or more")
  return max(sizes.values(), default=None)


def position_buckets(seq_len: int, bucket_size: int) -> np.ndarray:
  """int32 [seq_len]: the eval bucket of each token index, index // bucket_size.

  Per bucket b the eval loss is sum(loss * weights over batches, rows and indices in b) /
  sum(weights over the same); on TextbookChapters rows index = position in the chapter.
  """
  config_values.checked_int("data.seq_len", seq_len, 1)
  config_values.checked_int("eval.bucket_size", bucket_size, 1)
  return (np.arange(seq_len) // bucket_size).astype(np.int32)
