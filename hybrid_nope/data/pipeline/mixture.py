"""The mixture of domains: which domain supplies training row k, and which of its rows.

`data.domains` lists "name@proportion" (`parse_domains`). The domains' rows are interleaved
by their proportions exactly and deterministically (every cycle of W rows, W = 100 for the
ProLong 64K mixture, holds exactly W * p_i rows of domain i; in the mixtures tested, any prefix
of n rows holds n * p_i within one row), each domain's rows in a per-epoch shuffled order
(seeded by data.seed, the domain name and the epoch) that repeats forever, so a domain smaller
than its share is re-read in a new order. Proportions are of rows, i.e. of tokens up to the
padding at stream ends (none for ProLong's 65536-token samples when seq_len divides 65536).
Element k of the mixture is a pure function of k: sharding by process and resuming from a
checkpoint are exact.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import sys
import zlib

import numpy as np

from hybrid_nope.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DomainSpec:
  name: str
  proportion: float
  weight: int  # integer mixing weight; weights are proportional to the proportions


DOMAINS_FORM = ("'name@proportion': a domain directory under data.path, '@', its weight (a "
                "finite number >= 0), e.g. 'book-65536@0.3'")


def parse_domains(domains, key: str = "data.domains") -> list[DomainSpec]:
  """Parses ("name@proportion", ...). Proportions may be any non-negative numbers (they are
  normalised); 0 drops the domain. Integer weights reproduce the proportions exactly (up to
  a denominator of 10**6). A malformed value is a one-line ConfigError naming `key`."""
  if isinstance(domains, str) or not isinstance(domains, (list, tuple)) or not domains:
    raise ConfigError(f"config.{key}={domains!r} is invalid: expected a non-empty tuple of "
                      f"{DOMAINS_FORM}")
  parsed = []
  for entry in domains:
    if not isinstance(entry, str) or entry.count("@") != 1:
      raise ConfigError(f"config.{key} entry {entry!r} is invalid: expected {DOMAINS_FORM}")
    name, text = entry.split("@")
    try:
      proportion = float(text)
    except ValueError:
      proportion = float("nan")
    if not name or not math.isfinite(proportion) or proportion < 0:
      raise ConfigError(f"config.{key} entry {entry!r} is invalid: the name must be non-empty "
                        f"and the proportion a finite number >= 0; expected {DOMAINS_FORM}")
    parsed.append((name, text, proportion))
  names = [name for name, _, _ in parsed]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ConfigError(f"config.{key} lists {duplicates} more than once")
  if sum(p for _, _, p in parsed) <= 0:
    raise ConfigError(f"config.{key} proportions sum to zero: {list(domains)}")
  exact = [fractions.Fraction(text).limit_denominator(10**6) for _, text, _ in parsed]
  scale = math.lcm(*(f.denominator for f in exact))
  ints = [int(f * scale) for f in exact]
  divisor = math.gcd(*ints)
  for (name, text, proportion), w in zip(parsed, ints):
    if proportion > 0 and w == 0:
      raise ConfigError(f"config.{key} entry '{name}@{text}' is positive but below the "
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
      raise ConfigError(f"the proportions need a cycle of {self.cycle} rows (> {MAX_CYCLE}); "
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
  used: it costs ~2 ms per lookup for domains of tens of rows. `domains`: one random-access
  sequence of rows per spec (`prolong.DomainRows`).
  """

  def __init__(self, domains: list, specs: list[DomainSpec], seed: int):
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
