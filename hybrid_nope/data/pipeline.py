"""grain pipelines: an infinite, shuffled, process-sharded train iterator and fixed eval batches.

Rows come from a source (see `ROW_SOURCES`): "stdlib" holds them in memory as [S, T] arrays,
and the train pipeline shuffles row *indices* and gathers a whole batch with one fancy index;
"documents" (a prepared directory, `hybrid_nope.data.documents`) packs its train documents
the same way in memory and evaluates on one document per row from its first token;
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
import logging
from typing import Callable, Union

import grain
import numpy as np

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.errors import ConfigError
from hybrid_nope.data import packing
from hybrid_nope.data import stdlib_corpus
from hybrid_nope.data.tokenizer import ByteTokenizer

BATCH_KEYS, BATCH_DTYPES = packing.ROW_KEYS, packing.ROW_DTYPES  # A batch is rows stacked.
# Config values are read through hybrid_nope.config_values, the one place a key is checked: a part
# config (tests, tools) fails on its first bad or missing key exactly as the trainer's would.
_positive_int = config_values.positive_int
_log = logging.getLogger(__name__)


# ---- row sources: name -> fn(config, split) -> packed rows (dict of [S, T] arrays) ----------

@functools.lru_cache(maxsize=4)  # ~0.5 GB per full-corpus train entry; tests reuse one seq_len
def _stdlib_packed(split: str, seq_len: int, eval_fraction: float) -> dict[str, np.ndarray]:
  tokenizer = ByteTokenizer()
  docs = stdlib_corpus.documents(split, eval_fraction)
  rows = packing.pack_documents([tokenizer.encode(data) for _, data in docs], seq_len)
  for array in rows.values():
    array.flags.writeable = False  # shared by every caller through the cache
  return rows


def _stdlib_rows(config, split: str, num_rows_key: str | None = None) -> dict[str, np.ndarray]:
  del num_rows_key  # The whole split is in memory; callers take the rows they need.
  return _stdlib_packed(split, _positive_int(config, "data.seq_len"),
                       config_values.eval_fraction(config))


def _documents_rows(config, split: str,
                    num_rows_key: str | None = None) -> dict[str, np.ndarray]:
  """The prepared directory at data.path: train documents packed as stdlib's, eval documents
  one per row (hybrid_nope.data.documents); all in memory, callers take the rows they need."""
  del num_rows_key
  from hybrid_nope.data import documents  # pylint: disable=g-import-not-at-top
  path = config_values.string(config, "data.path", "a prepared documents directory",
                              nonempty=True)
  seq_len = _positive_int(config, "data.seq_len")
  verify = config_values.verify_hashes(config)
  if split == "train":
    return documents.train_rows(path, seq_len, verify_hashes=verify)
  if split != "eval":
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  return documents.eval_rows(path, seq_len, verify_hashes=verify)


def _mds_rows(config, split: str, num_rows_key: str | None = None):
  """Train split: the ProLong mixture, an infinite grain MapDataset of rows (element k is the
  k-th row of the global stream). Eval split: TextbookChapters rows, in memory (the first rows
  of a fixed order: as many as the eval batches need, or at most the int at `num_rows_key`)."""
  seq_len = _positive_int(config, "data.seq_len")
  vocab_size = _positive_int(config, "model.vocab_size")
  if split == "eval":
    from hybrid_nope.data import textbook_chapters  # pylint: disable=g-import-not-at-top
    path = config_values.string(config, "eval.path", "the prepared TextbookChapters directory",
                           nonempty=True)
    if num_rows_key is None:
      num_rows = _positive_int(config, "eval.batch_size") * _positive_int(config,
                                                                          "eval.num_batches")
      return textbook_chapters.eval_rows(path, seq_len=seq_len, num_rows=num_rows,
                                         vocab_size=vocab_size)
    return textbook_chapters.eval_rows(path, seq_len=seq_len,
                                       num_rows=_positive_int(config, num_rows_key),
                                       vocab_size=vocab_size, at_most=True)
  if split != "train":
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  return grain.MapDataset.source(train_mixture(config))


def train_mixture(config):
  """The ProLong mixture (`prolong.build_mixture`) of config.data's domains: a
  `mixture.Mixture` whose `domains` are `prolong.DomainRows` (data/check.py reports them)."""
  from hybrid_nope.data import prolong  # pylint: disable=g-import-not-at-top
  cache_dir = config_values.string(config, "data.cache_dir", "a path or '' (the default cache)")
  return prolong.build_mixture(
      config_values.value(config, "data.path"), config_values.value(config, "data.domains"),
      seq_len=_positive_int(config, "data.seq_len"),
      document_masking=config_values.boolean(config, "data.document_masking"),
      vocab_size=_positive_int(config, "model.vocab_size"), seed=config_values.data_seed(config),
      cache_dir=cache_dir or None, verify_hashes=config_values.verify_hashes(config),
      exclude_samples=config_values.exclude_samples(config))


def _text_rows(config, split: str, num_rows_key: str | None = None):
  """jsonl, parquet, hf: text tokenised on the fly (hybrid_nope.data.text_rows)."""
  from hybrid_nope.data import text_rows  # pylint: disable=g-import-not-at-top
  return text_rows.text_rows(config, split, num_rows_key)


Rows = Union[dict[str, np.ndarray], grain.MapDataset]
# name -> fn(config, split, num_rows_key) -> rows: a dict of in-memory [S, T] arrays, or (train) an infinite
# grain.MapDataset of row dicts that is already shuffled.
ROW_SOURCES: dict[str, Callable[..., Rows]] = {
    "stdlib": _stdlib_rows, "mds": _mds_rows, "documents": _documents_rows,
    **{source: _text_rows for source in config_values.TEXT_SOURCES}}
assert tuple(ROW_SOURCES) == config_values.DATA_SOURCES, "one reader per config_values.DATA_SOURCES name"


def packed_rows(config, split: str, num_rows_key: str | None = None) -> Rows:
  """Rows of `split` ("train" or "eval") from the source named by config.data.source; a source
  that reads eval rows one by one reads at most the int at `num_rows_key` of them (fewer where
  the split has fewer), or by default the eval batches' rows."""
  source = ROW_SOURCES[config_values.one_of(config, "data.source", config_values.DATA_SOURCES)]
  return source(config, split, num_rows_key)


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
  said in one line. Fewer rows than the probe measures (metrics.probe_batch_size) is refused,
  naming both numbers; the probe's documents are checked where they are chosen
  (analysis.measure.probe.check_documents)."""
  count = _positive_int(config, "metrics.probe_pool_rows")
  measured = _positive_int(config, "metrics.probe_batch_size")
  rows = packed_rows(config, "eval", "metrics.probe_pool_rows")
  found = len(rows["inputs"])
  if found < measured:
    raise ConfigError(f"config.metrics.probe_batch_size={measured}: the recency probe measures "
                      f"{measured} eval rows but the eval split has only {found}; lower "
                      f"metrics.probe_batch_size to {found} or fewer, or use a larger eval set")
  if found < count:
    _log.info("recency probe: chosen from all %d eval rows (metrics.probe_pool_rows=%d is the "
              "most it chooses from)", found, count)
  return {k: np.array(rows[k][:count]) for k in BATCH_KEYS}


def tokenizer_files(config) -> list[str]:
  """The tokenizer.json files the data carries: for mds, one in data.path (put there by
  whoever prepared the domains) and one in the prepared eval directory (textbook_chapters
  copies the --tokenizer it tokenised with), where present; for a text source, data.tokenizer
  unless it is the byte tokenizer; for documents, the prepared directory's tokenizer.json."""
  source = config_values.one_of(config, "data.source", config_values.DATA_SOURCES)
  if source in config_values.TEXT_SOURCES and not config_values.byte_tokenised(config):
    return [config_values.text_tokenizer(config)]
  if source == "documents":
    from hybrid_nope.data import documents  # pylint: disable=g-import-not-at-top
    path = config_values.string(config, "data.path", "a prepared documents directory",
                                nonempty=True)
    found = storage.join(path, documents.TOKENIZER)
    return [found] if storage.exists(found) else []
  if source != "mds":
    return []
  from hybrid_nope.data import textbook_chapters  # pylint: disable=g-import-not-at-top
  places = [config_values.string(config, "data.path", "a directory", nonempty=True)]
  eval_path = config_values.string(config, "eval.path", "the prepared TextbookChapters directory",
                              nonempty=True)
  places.append(textbook_chapters.dataset_dir(eval_path))
  return [p for p in (storage.join(d, "tokenizer.json") for d in places) if storage.exists(p)]


def check_vocabulary(config) -> int | None:
  """Refuses a model.vocab_size below the data's tokenizer's size, before anything is built
  (on byte data, vocab_size=100 would otherwise train into NaN at step 1). stdlib
  (config_values.BYTE_SOURCES), and a text source with data.tokenizer="byte": the
  byte tokenizer's ByteTokenizer.vocab_size ids; documents, mds and other text sources: each of
  `tokenizer_files` (mds without one: the token ids are checked as they are read, each shard's
  at its first read, every eval row).
  Returns the largest tokenizer size checked, or None."""
  vocab_size = _positive_int(config, "model.vocab_size")
  source = config_values.one_of(config, "data.source", config_values.DATA_SOURCES)
  if config_values.byte_tokenised(config):
    sizes = {f"the byte tokenizer (data.source={source})": ByteTokenizer.vocab_size}
  else:
    from hybrid_nope.data.tokenizer import JsonTokenizer  # pylint: disable=g-import-not-at-top
    key = "data.tokenizer" if source in config_values.TEXT_SOURCES else None  # mds: the data's
    sizes = {path: JsonTokenizer(path, key).vocab_size for path in tokenizer_files(config)}
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
