"""ProLong training data: a mixture of MDS domains cut into document-aware training rows.

`data.path` holds one MDS directory per domain; `data.domains` lists "name@proportion".

Rows. A *stream* is a run of tokens whose documents are known: a packed sample (ProLong's
`input_ids` with `indices`, one [start, end) row per document), or, for a raw domain (one
document per sample: `input_ids` and `length`), all of the domain's documents concatenated in
file order ("packing on the fly": nothing is written, rows are assembled when read). A stream
of L tokens gives ceil((L - 1) / T) rows, T = data.seq_len; row k holds
inputs = stream[kT : kT + T] and targets = stream[kT + 1 : kT + T + 1], so every token is an
input once and every token but the stream's first a target once; the last row of a stream is
padded (token 0, segment 0, weight 0) where the stream ends.

Per token, with `data.document_masking` (default):
  segment_ids  the input's document, numbered from 1 within the row; 0 = padding or a token
               that no `indices` row covers (ProLong drops those too);
  positions    the input's offset in its document (continuing across rows of one document);
  weights      1 where the target is in the same document as the input: the first token of
               every document is never a target.
Without it (ProLong's `single_seq`), a packed sample is one sequence: one segment, positions
count from the sample's start, only the sample's first token is never a target; a raw
domain's row is one sequence (positions count from the row's start).

Mixture: `hybrid_nope.data.pipeline.mixture` (the domains' rows interleaved by their proportions,
each domain's in a per-epoch shuffled order; element k is a pure function of k).

Integrity (the full list is in `hybrid_nope.data.formats.mds`): token columns must be integer
ndarrays (refused at open); each shard's token ids are checked against model.vocab_size
when a row is first read from it; data.exclude_samples names samples that are never read.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.data.formats import mds
from hybrid_nope.data.pipeline import packing
from hybrid_nope.data.pipeline.mixture import Mixture, parse_domains
from hybrid_nope.errors import ConfigError

cut_row = packing.cut_row  # Rows are cut in one place, the packing module.

_log = logging.getLogger(__name__)


# ---- rows -------------------------------------------------------------------------------------

class TokenRangeError(mds.MDSFormatError):
  """Token ids outside [0, model.vocab_size) in a shard; names the samples to exclude."""


MAX_EXCLUSIONS_SUGGESTED = 16  # More bad samples in one shard than this: a vocabulary mismatch.


def _token_column(ds: mds.MDSDataset, name: str) -> None:
  """Refuses a token column that is not an integer ndarray with a declared dtype."""
  column = ds.columns[name]
  if column.kind != "ndarray" or column.dtype is None or column.dtype.kind not in "iu":
    raise mds.MDSFormatError(
        f"{os.path.join(ds.path, mds.INDEX_BASENAME)}: column {name!r} is declared "
        f"{column.encoding!r}; token columns must be integer ndarrays with a declared dtype, "
        f"e.g. 'ndarray:uint32' (ProLong's)")


class DomainRows:
  """The training rows of one MDS domain directory, by row index (see the module docstring).

  Packed domains have columns input_ids and indices; raw ones input_ids (and optionally
  length, which must then equal len(input_ids)); both integer ndarrays with a declared dtype,
  refused at open otherwise. The first time a row comes from a shard, the token ids of the
  whole shard are checked against [0, vocab_size) (one vectorised min/max): a refusal names the
  shard file and samples, and the `exclude_samples` value that skips them. `exclude_samples`
  holds data.exclude_samples ("NAME/SHARD:SAMPLE"; entries of other domains are ignored):
  those samples give no rows and are never read. Malformed samples fail naming the shard file
  and sample.
  """

  def __init__(self, path: str, *, seq_len: int, document_masking: bool, vocab_size: int,
               cache_dir: str | None = None, verify_hashes: bool = True,
               name: str | None = None, exclude_samples: tuple[str, ...] = ()):
    self.path = path
    self.name = name or os.path.basename(os.path.normpath(path))
    self.seq_len = seq_len
    self.document_masking = bool(document_masking)
    self.vocab_size = vocab_size
    self.ds = mds.MDSDataset(path, cache_dir=cache_dir, verify_hashes=verify_hashes)
    columns = self.ds.columns
    if "input_ids" not in columns:
      raise mds.MDSFormatError(f"{path}: expected an ndarray column 'input_ids' (ProLong "
                               f"data), found columns {sorted(columns)}")
    self.packed = "indices" in columns
    for column in ("input_ids", "indices") if self.packed else ("input_ids",):
      _token_column(self.ds, column)
    self.exclude_samples = tuple(exclude_samples)
    self.excluded = np.zeros(len(self.ds), bool)
    for entry in self.exclude_samples:
      where, sample = config_values.split_sample_ref(entry)
      if where.startswith(self.name + "/"):
        try:
          self.excluded[self.ds.index_of(where[len(self.name) + 1:], sample)] = True
        except LookupError as e:
          raise ConfigError(f"config.data.exclude_samples entry {entry!r}: {e}") from None
    if self.excluded.any():
      _log.info("%s: %d samples excluded by data.exclude_samples", path, self.excluded.sum())
    self._checked_shards: set[int] = set()
    self.lengths = np.where(self.excluded, 0, self.ds.array_lengths("input_ids"))
    self.num_tokens = int(self.lengths.sum())
    if self.packed:
      rows = np.where(self.lengths >= 2, -(-(self.lengths - 1) // seq_len), 0)
      self._row_ends = np.cumsum(rows)
      self.num_rows = int(self._row_ends[-1]) if rows.size else 0
      short = (self.lengths < 2) & ~self.excluded
      if np.any(short):
        _log.warning("%s: %d samples shorter than 2 tokens have no target and give no rows",
                     path, int(np.sum(short)))
    else:  # One stream of the domain's documents in file order, packed on the fly.
      self._stream = packing.StreamRows(self.lengths, self._raw_tokens, seq_len=seq_len,
                                        document_masking=self.document_masking)
      self.num_rows = len(self._stream)
    if self.num_rows == 0:
      raise mds.MDSFormatError(f"{path}: {len(self.ds)} samples with {self.num_tokens} tokens "
                               f"give no training row of data.seq_len={seq_len}")

  def __len__(self) -> int:
    return self.num_rows

  def _check_shard(self, sample: int) -> None:
    """The token ids of `sample`'s whole shard, once: all in [0, vocab_size) but excluded ones."""
    number = self.ds.locate(sample)[0]
    if number in self._checked_shards:
      return
    lo, hi = self.ds.array_extremes("input_ids", number)
    first = self.ds.first_index(number)
    bad = first + np.flatnonzero(((lo < 0) | (hi >= self.vocab_size))
                                 & ~self.excluded[first:first + lo.size])
    if bad.size:
      ids = self.ds.get(int(bad[0]), ("input_ids",))["input_ids"].astype(np.int64)
      at = int(np.argmax((ids < 0) | (ids >= self.vocab_size)))
      first_bad = (f"token id {int(ids[at])} at position {at} of input_ids in "
                   f"{self.ds.describe(int(bad[0]))} is outside [0, "
                   f"model.vocab_size={self.vocab_size})")
      if bad.size > MAX_EXCLUSIONS_SUGGESTED:
        raise TokenRangeError(f"{first_bad}, as are {bad.size - 1} more of the shard's "
                              f"{lo.size} samples: is model.vocab_size that of the tokenizer "
                              f"the data was made with?")
      new = [f"{self.name}/{self.ds.shard_basename(number)}:{i - first}" for i in bad]
      value = "(" + " ".join(f'"{e}",' for e in (*self.exclude_samples, *new)) + ")"
      also = f" ({bad.size} samples of this shard are out of range)" if bad.size > 1 else ""
      raise TokenRangeError(
          f"{first_bad}{also}; to train past {'them' if bad.size > 1 else 'it'}, pass "
          f"--config.data.exclude_samples='{value}' (or, if the data is right, a larger "
          f"model.vocab_size)")
    self._checked_shards.add(number)

  def _indices(self, sample: int, values: dict) -> np.ndarray:
    indices, length = values["indices"], values["input_ids"].size
    where = self.ds.describe(sample)
    if indices.ndim != 2 or indices.shape[1] != 2 or indices.shape[0] == 0:
      raise mds.MDSFormatError(f"indices of {where} must have shape [n_docs >= 1, 2], got "
                               f"{indices.shape}")
    starts, ends = indices[:, 0].astype(np.int64), indices[:, 1].astype(np.int64)
    bad = np.flatnonzero((starts < 0) | (starts > ends) | (ends > length))
    if bad.size:
      i = int(bad[0])
      raise mds.MDSFormatError(f"indices row {i} [{starts[i]}, {ends[i]}) of {where} is out of "
                               f"range for its {length} input_ids")
    bad = np.flatnonzero(starts[1:] < ends[:-1])
    if bad.size:
      i = int(bad[0])
      raise mds.MDSFormatError(f"indices rows {i} [{starts[i]}, {ends[i]}) and {i + 1} "
                               f"[{starts[i + 1]}, {ends[i + 1]}) of {where} overlap or are "
                               f"out of order")
    return indices

  def __getitem__(self, row: int) -> dict[str, np.ndarray]:
    if not 0 <= row < self.num_rows:
      raise IndexError(f"row {row} out of range for {self.path} ({self.num_rows} rows)")
    if not self.packed:
      return self._stream[row]
    T = self.seq_len
    sample = int(np.searchsorted(self._row_ends, row, side="right"))
    k = row - (int(self._row_ends[sample - 1]) if sample else 0)
    self._check_shard(sample)
    values = self.ds.get(sample, ("input_ids", "indices"))
    ids = values["input_ids"]
    first = k * T
    tokens = ids[first:first + T + 1]
    if self.document_masking:
      indices = self._indices(sample, values)
      starts = indices[:, 0].astype(np.int64)
      ends = indices[:, 1].astype(np.int64)
    else:
      starts, ends = np.array([0]), np.array([ids.size])
    return cut_row(tokens.astype(np.int32), starts, ends, first, T)

  def _raw_tokens(self, sample: int, lo: int, hi: int) -> np.ndarray:
    """input_ids[lo:hi] of a raw domain's sample, its shard checked and its length column."""
    self._check_shard(sample)
    values = self.ds.get(sample, ("input_ids", "length") if "length" in self.ds.columns
                         else ("input_ids",))
    ids = values["input_ids"]
    if "length" in values and int(values["length"]) != ids.size:
      raise mds.MDSFormatError(f"{self.ds.describe(sample)}: input_ids of shape {ids.shape} "
                               f"disagrees with its length column {values.get('length')}")
    return ids[lo:hi]


# ---- from the config --------------------------------------------------------------------------

def build_mixture(data_path: str, domains, *, seq_len: int, document_masking: bool,
                  vocab_size: int, seed: int, cache_dir: str | None = None,
                  verify_hashes: bool = True, exclude_samples: tuple[str, ...] = ()) -> Mixture:
  """The Mixture of `domains` ("name@proportion") under `data_path`, without the samples
  `exclude_samples` names (data.exclude_samples: each must name one domain that is read)."""
  if not data_path or not storage.isdir(data_path):
    raise ConfigError(f"config.data.path={data_path!r} is invalid: expected an existing "
                      f"directory with one MDS directory per domain (e.g. prolong-data-64K)")
  specs = [s for s in parse_domains(domains) if s.weight > 0]
  dropped = [d for d in domains if d.split("@")[0] not in {s.name for s in specs}]
  if dropped:
    _log.info("data.domains: proportion 0, not read: %s", dropped)
  for entry in exclude_samples:
    where, _ = config_values.split_sample_ref(entry)
    owners = [s.name for s in specs if where.startswith(s.name + "/")]
    if len(owners) != 1:
      raise ConfigError(f"config.data.exclude_samples entry {entry!r} names "
                        f"{'no' if not owners else 'more than one'} domain that "
                        f"config.data.domains reads ({', '.join(s.name for s in specs)})")
  rows = []
  for spec in specs:
    path = storage.join(data_path, spec.name)
    if not storage.isdir(path):
      raise ConfigError(f"domain {spec.name!r} of config.data.domains has no directory "
                        f"{path} under config.data.path")
    rows.append(DomainRows(path, seq_len=seq_len, document_masking=document_masking,
                           vocab_size=vocab_size, cache_dir=cache_dir,
                           verify_hashes=verify_hashes, name=spec.name,
                           exclude_samples=tuple(exclude_samples)))
  total = sum(s.weight for s in specs)
  for spec, domain in zip(specs, rows):
    share = spec.weight / total
    _log.info("domain %s: %s, %d samples, %d tokens, %d rows of %d; %.4f of rows, one epoch "
              "per %.3g training tokens", spec.name, "packed" if domain.packed else "raw",
              len(domain.ds), domain.num_tokens, len(domain), seq_len, share,
              len(domain) * seq_len / share)
  return Mixture(rows, specs, seed)
