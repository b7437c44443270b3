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

Mixture. The domains' rows are interleaved by their proportions exactly and deterministically
(every cycle of W rows, W = 100 for the ProLong 64K mixture, holds exactly W * p_i rows of
domain i; in the mixtures tested, any prefix of n rows holds n * p_i within one row), each
domain's rows in a per-epoch shuffled order (seeded by data.seed, the domain name and the
epoch) that repeats forever, so a domain smaller than its share is re-read in a new order.
Proportions are of rows, i.e. of tokens up to the padding at stream ends (none for ProLong's
65536-token samples when seq_len divides 65536). Element k of the mixture is a pure function
of k: sharding by process and resuming from a checkpoint are exact.
"""

from __future__ import annotations

import dataclasses
import fractions
import logging
import math
import os
import sys
import zlib

import numpy as np

from hybrid_nope.data import mds

_log = logging.getLogger(__name__)


# ---- the mixture ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DomainSpec:
  name: str
  proportion: float
  weight: int  # integer mixing weight; weights are proportional to the proportions


def parse_domains(domains, key: str = "data.domains") -> list[DomainSpec]:
  """Parses ("name@proportion", ...). Proportions may be any non-negative numbers (they are
  normalised); 0 drops the domain. Integer weights reproduce the proportions exactly (up to
  a denominator of 10**6)."""
  if isinstance(domains, str) or not isinstance(domains, (list, tuple)) or not domains:
    raise ValueError(f"config.{key} must be a non-empty list of 'name@proportion' strings, "
                     f"got {domains!r}")
  parsed = []
  for entry in domains:
    if not isinstance(entry, str) or entry.count("@") != 1:
      raise ValueError(f"config.{key} entry {entry!r} must be 'name@proportion', e.g. "
                       f"'book-65536@0.3'")
    name, text = entry.split("@")
    try:
      proportion = float(text)
    except ValueError:
      proportion = float("nan")
    if not name or not math.isfinite(proportion) or proportion < 0:
      raise ValueError(f"config.{key} entry {entry!r}: the name must be non-empty and the "
                       f"proportion a finite number >= 0")
    parsed.append((name, text, proportion))
  names = [name for name, _, _ in parsed]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"config.{key} lists {duplicates} more than once")
  if sum(p for _, _, p in parsed) <= 0:
    raise ValueError(f"config.{key} proportions sum to zero: {list(domains)}")
  exact = [fractions.Fraction(text).limit_denominator(10**6) for _, text, _ in parsed]
  scale = math.lcm(*(f.denominator for f in exact))
  ints = [int(f * scale) for f in exact]
  divisor = math.gcd(*ints)
  for (name, text, proportion), w in zip(parsed, ints):
    if proportion > 0 and w == 0:
      raise ValueError(f"config.{key} entry '{name}@{text}' is positive but below the "
                       f"resolution 1e-6 of proportions")
  return [DomainSpec(name, proportion, w // divisor)
          for (name, _, proportion), w in zip(parsed, ints)]


MAX_CYCLE = 10**6


class MixtureSchedule:
  """Which domain supplies element k of the mixture, and which of its elements it is.

  Integer weights w_i with sum W: every cycle of W consecutive elements holds exactly w_i
  elements of domain i, in one fixed order chosen greedily (largest deficit
  (k + 1) w_i / W - count_i first, ties to the lower index); for the mixtures in the tests
  (ProLong's among them) every prefix of n elements then holds n w_i / W of domain i within
  less than one element.
  Domain i's elements are taken in order 0, 1, 2, ... O(1) per lookup.
  """

  def __init__(self, weights: tuple[int, ...]):
    self.weights = tuple(int(w) for w in weights)
    if not self.weights or min(self.weights) < 1:
      raise ValueError(f"mixture weights must be positive integers, got {weights}")
    self.cycle = sum(self.weights)
    if self.cycle > MAX_CYCLE:
      raise ValueError(f"the proportions need a cycle of {self.cycle} rows (> {MAX_CYCLE}); "
                       f"give config.data.domains proportions with fewer digits")
    counts = [0] * len(self.weights)
    order, rank = [], []
    for k in range(self.cycle):
      deficits = [(k + 1) * w - c * self.cycle for w, c in zip(self.weights, counts)]
      d = deficits.index(max(deficits))
      order.append(d)
      rank.append(counts[d])
      counts[d] += 1
    self.order = np.array(order, np.int32)
    self.rank = np.array(rank, np.int64)

  def __call__(self, k: int) -> tuple[int, int]:
    cycle, pos = divmod(int(k), self.cycle)
    d = int(self.order[pos])
    return d, cycle * self.weights[d] + int(self.rank[pos])


def domain_seed(seed: int, name: str) -> int:
  return (seed * 0x9E3779B1 + zlib.crc32(name.encode("utf-8"))) % 2**32


class Mixture:
  """Infinite random-access rows: element k = domain d's row perm_{d,e}[i], where (d, j) comes
  from the `MixtureSchedule` and (e, i) = divmod(j, rows of d). A grain data source (len is
  sys.maxsize).

  perm_{d,e} is numpy's PCG64 permutation seeded by (data.seed, domain name, epoch e), so
  the order is fixed by the numpy version (pinned in requirements.lock). Permutations are
  cached, two epochs per domain (int32, 4 bytes per row). grain's own index shuffle is not
  used: it costs ~2 ms per lookup for domains of tens of rows.
  """

  def __init__(self, domains: list["DomainRows"], specs: list[DomainSpec], seed: int):
    self.domains = domains
    self.specs = specs
    self.seed = seed
    self.schedule = MixtureSchedule(tuple(s.weight for s in specs))
    self._perms: list[dict[int, np.ndarray]] = [{} for _ in domains]

  def __len__(self) -> int:
    return sys.maxsize

  def permutation(self, d: int, epoch: int) -> np.ndarray:
    cache = self._perms[d]
    perm = cache.get(epoch)
    if perm is None:
      rng = np.random.default_rng([domain_seed(self.seed, self.specs[d].name), epoch])
      perm = rng.permutation(len(self.domains[d])).astype(np.int32)
      for old in [e for e in cache if e < epoch - 1 or e > epoch + 1]:
        del cache[old]
      cache[epoch] = perm
    return perm

  def locate(self, k: int) -> tuple[int, int]:
    """(domain, row within the domain) of element k."""
    d, j = self.schedule(k)
    epoch, i = divmod(j, len(self.domains[d]))
    return d, int(self.permutation(d, epoch)[i])

  def __getitem__(self, k: int) -> dict[str, np.ndarray]:
    d, row = self.locate(k)
    return self.domains[d][row]


# ---- rows -------------------------------------------------------------------------------------

def cut_row(tokens: np.ndarray, doc_starts: np.ndarray, doc_ends: np.ndarray, first: int,
            seq_len: int) -> dict[str, np.ndarray]:
  """One training row from stream[first : first + n] (n = tokens.size, 2 <= n <= seq_len + 1).

  doc_starts / doc_ends: sorted, non-overlapping [start, end) of the stream's documents, in
  stream coordinates (only those near the row are needed). Returns packing.ROW_KEYS, each
  [seq_len].
  """
  n, T = tokens.size, seq_len
  if not 2 <= n <= T + 1:
    raise ValueError(f"a row needs 2..{T + 1} tokens, got {n}")
  p = first + np.arange(n, dtype=np.int64)
  doc = np.searchsorted(doc_starts, p, side="right") - 1
  clipped = np.maximum(doc, 0)
  inside = (doc >= 0) & (p < doc_ends[clipped]) if doc_ends.size else np.zeros(n, bool)
  m = min(n, T)  # inputs; n - 1 targets
  first_doc = doc[inside].min() if inside.any() else 0
  row = {
      "inputs": np.zeros(T, np.int32), "targets": np.zeros(T, np.int32),
      "segment_ids": np.zeros(T, np.int32), "positions": np.zeros(T, np.int32),
      "weights": np.zeros(T, np.float32),
  }
  row["inputs"][:m] = tokens[:m]
  row["targets"][:n - 1] = tokens[1:]
  row["segment_ids"][:m] = np.where(inside[:m], doc[:m] - first_doc + 1, 0)
  row["positions"][:m] = np.where(inside[:m], p[:m] - doc_starts[clipped[:m]], 0)
  row["weights"][:n - 1] = inside[:-1] & inside[1:] & (doc[:-1] == doc[1:])
  return row


class DomainRows:
  """The training rows of one MDS domain directory, by row index (see the module docstring).

  Packed domains have columns input_ids and indices; raw ones input_ids (and optionally
  length, which must then equal len(input_ids)). Every row read checks its token ids against
  vocab_size and its sample's indices, and fails naming the shard file and sample.
  """

  def __init__(self, path: str, *, seq_len: int, document_masking: bool, vocab_size: int,
               cache_dir: str | None = None, verify_hashes: bool = True):
    self.path = path
    self.seq_len = seq_len
    self.document_masking = bool(document_masking)
    self.vocab_size = vocab_size
    self.ds = mds.MDSDataset(path, cache_dir=cache_dir, verify_hashes=verify_hashes)
    columns = self.ds.columns
    if "input_ids" not in columns or columns["input_ids"].kind != "ndarray":
      raise mds.MDSFormatError(f"{path}: expected an ndarray column 'input_ids' (ProLong "
                               f"data), found columns {sorted(columns)}")
    self.packed = "indices" in columns
    self.lengths = self.ds.array_lengths("input_ids")
    self.num_tokens = int(self.lengths.sum())
    if self.packed:
      rows = np.where(self.lengths >= 2, -(-(self.lengths - 1) // seq_len), 0)
      self._row_ends = np.cumsum(rows)
      self.num_rows = int(self._row_ends[-1]) if rows.size else 0
      if np.any(self.lengths < 2):
        _log.warning("%s: %d samples shorter than 2 tokens have no target and give no rows",
                     path, int(np.sum(self.lengths < 2)))
    else:
      self._starts = np.concatenate([[0], np.cumsum(self.lengths)])
      self.num_rows = -(-(self.num_tokens - 1) // seq_len) if self.num_tokens >= 2 else 0
    if self.num_rows == 0:
      raise ValueError(f"{path}: {len(self.ds)} samples with {self.num_tokens} tokens give no "
                       f"training row of data.seq_len={seq_len}")

  def __len__(self) -> int:
    return self.num_rows

  def _check_ids(self, ids: np.ndarray, sample: int, offset: int) -> None:
    if ids.size and np.issubdtype(ids.dtype, np.signedinteger) and ids.min() < 0:
      bad = int(np.argmin(ids))
      raise ValueError(f"negative token id {int(ids[bad])} at position {offset + bad} of "
                       f"input_ids in {self.ds.describe(sample)}")
    if ids.size and ids.max() >= self.vocab_size:
      bad = int(np.argmax(ids >= self.vocab_size))
      raise ValueError(f"token id {int(ids[bad])} >= model.vocab_size={self.vocab_size} at "
                       f"position {offset + bad} of input_ids in {self.ds.describe(sample)}")

  def _indices(self, sample: int, values: dict) -> np.ndarray:
    indices, length = values["indices"], values["input_ids"].size
    where = self.ds.describe(sample)
    if indices.ndim != 2 or indices.shape[1] != 2 or indices.shape[0] == 0:
      raise ValueError(f"indices of {where} must have shape [n_docs >= 1, 2], got "
                       f"{indices.shape}")
    starts, ends = indices[:, 0].astype(np.int64), indices[:, 1].astype(np.int64)
    bad = np.flatnonzero((starts < 0) | (starts > ends) | (ends > length))
    if bad.size:
      i = int(bad[0])
      raise ValueError(f"indices row {i} [{starts[i]}, {ends[i]}) of {where} is out of range "
                       f"for its {length} input_ids")
    bad = np.flatnonzero(starts[1:] < ends[:-1])
    if bad.size:
      i = int(bad[0])
      raise ValueError(f"indices rows {i} [{starts[i]}, {ends[i]}) and {i + 1} "
                       f"[{starts[i + 1]}, {ends[i + 1]}) of {where} overlap or are out of "
                       f"order")
    return indices

  def __getitem__(self, row: int) -> dict[str, np.ndarray]:
    if not 0 <= row < self.num_rows:
      raise IndexError(f"row {row} out of range for {self.path} ({self.num_rows} rows)")
    T = self.seq_len
    if self.packed:
      sample = int(np.searchsorted(self._row_ends, row, side="right"))
      k = row - (int(self._row_ends[sample - 1]) if sample else 0)
      values = self.ds.get(sample, ("input_ids", "indices"))
      ids = values["input_ids"]
      if ids.ndim != 1:
        raise ValueError(f"input_ids of {self.ds.describe(sample)} must be 1-D, got {ids.shape}")
      first = k * T
      tokens = ids[first:first + T + 1]
      self._check_ids(tokens, sample, first)
      if self.document_masking:
        indices = self._indices(sample, values)
        starts = indices[:, 0].astype(np.int64)
        ends = indices[:, 1].astype(np.int64)
      else:
        starts, ends = np.array([0]), np.array([ids.size])
      return cut_row(tokens.astype(np.int32), starts, ends, first, T)

    first = row * T
    stop = min(first + T + 1, self.num_tokens)
    s0 = int(np.searchsorted(self._starts, first, side="right")) - 1
    s1 = int(np.searchsorted(self._starts, stop - 1, side="right")) - 1
    pieces = []
    for s in range(s0, s1 + 1):
      values = self.ds.get(s, ("input_ids", "length") if "length" in self.ds.columns
                           else ("input_ids",))
      ids = values["input_ids"]
      if ids.ndim != 1 or ("length" in values and int(values["length"]) != ids.size):
        raise ValueError(f"{self.ds.describe(s)}: input_ids of shape {ids.shape} disagrees "
                         f"with its length column {values.get('length')}")
      lo = max(first - int(self._starts[s]), 0)
      hi = min(stop - int(self._starts[s]), ids.size)
      piece = ids[lo:hi]
      self._check_ids(piece, s, lo)
      pieces.append(piece)
    tokens = np.concatenate(pieces).astype(np.int32)
    if self.document_masking:
      starts, ends = self._starts[s0:s1 + 1], self._starts[s0 + 1:s1 + 2]
    else:
      starts, ends = np.array([first]), np.array([stop])
    return cut_row(tokens, starts, ends, first, T)


# ---- from the config --------------------------------------------------------------------------

def build_mixture(data_path: str, domains, *, seq_len: int, document_masking: bool,
                  vocab_size: int, seed: int, cache_dir: str | None = None,
                  verify_hashes: bool = True) -> Mixture:
  """The Mixture of `domains` ("name@proportion") under `data_path`."""
  if not data_path or not os.path.isdir(data_path):
    raise FileNotFoundError(f"config.data.path={data_path!r} must be an existing directory "
                            f"with one MDS directory per domain (e.g. prolong-data-64K)")
  specs = [s for s in parse_domains(domains) if s.weight > 0]
  dropped = [d for d in domains if d.split("@")[0] not in {s.name for s in specs}]
  if dropped:
    _log.info("data.domains: proportion 0, not read: %s", dropped)
  rows = []
  for spec in specs:
    path = os.path.join(data_path, spec.name)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"domain {spec.name!r} of config.data.domains has no directory "
                              f"{path} under config.data.path")
    rows.append(DomainRows(path, seq_len=seq_len, document_masking=document_masking,
                           vocab_size=vocab_size, cache_dir=cache_dir,
                           verify_hashes=verify_hashes))
  total = sum(s.weight for s in specs)
  for spec, domain in zip(specs, rows):
    share = spec.weight / total
    _log.info("domain %s: %s, %d samples, %d tokens, %d rows of %d; %.4f of rows, one epoch "
              "per %.3g training tokens", spec.name, "packed" if domain.packed else "raw",
              len(domain.ds), domain.num_tokens, len(domain), seq_len, share,
              len(domain) * seq_len / share)
  return Mixture(rows, specs, seed)
