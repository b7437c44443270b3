"""Reading one config value, checked: each reader names the key, the value and what is allowed.

The whole-config check (`validate.py`) and the data pipeline both read through these, so a rule
for one key has one home and `data/` need not import the whole-config check.
"""
from __future__ import annotations

import math
import re

import numpy as np

from hybrid_nope.errors import ConfigError

# The data.source names, and what each reads, live in hybrid_nope.data.sources.registry.
BYTE_TOKENIZER = "byte"  # data.tokenizer's name for the byte tokenizer (data/tokenization/tokenizer.py).


def require(ok: bool, key: str, value, allowed: str):
  if not ok:
    raise ConfigError(f"config.{key}={value!r} is invalid: expected {allowed}")


_MISSING = object()


def value(config, key: str):
  """config["section.name"]; a missing key fails naming itself (no silent default)."""
  found = config
  for part in key.split("."):
    found = found.get(part, _MISSING) if hasattr(found, "get") else _MISSING
    if found is _MISSING:
      raise ConfigError(f"config.{key} is missing")
  return found


def is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def checked_int(key: str, x, low: int, high: int | None = None, allowed: str = "") -> int:
  """`x`, the value of `key`, checked to be an integer in [low, high)."""
  require(is_int(x) and x >= low and (high is None or x < high), key, x,
          allowed or f"an integer >= {low}")
  return int(x)


def int_in(config, key: str, low: int, high: int | None = None, allowed: str = "") -> int:
  return checked_int(key, value(config, key), low, high, allowed)


def positive_int(config, key: str) -> int:
  return int_in(config, key, 1)


def boolean(config, key: str) -> bool:
  x = value(config, key)
  require(isinstance(x, bool), key, x, "True or False")
  return x


VERIFY_ALWAYS = "always"  # data.verify_hashes: hash every shard at every start (no stamps).


def verify_hashes(config) -> bool | str:
  """data.verify_hashes: True (hash a shard once per file version: a stamp skips it later),
  False (never), or "always" (every start, past the stamps: bit rot after the first check)."""
  x = value(config, "data.verify_hashes")
  require(isinstance(x, bool) or x == VERIFY_ALWAYS, "data.verify_hashes", x,
          f"True, False or {VERIFY_ALWAYS!r}")
  return x


def string(config, key: str, allowed: str, *, nonempty: bool = False) -> str:
  x = value(config, key)
  require(isinstance(x, str) and (x or not nonempty), key, x, allowed)
  return x


def one_of(config, key: str, options) -> str:
  x = value(config, key)
  require(isinstance(x, str) and x in options, key, x, f"one of {sorted(options)}")
  return x


def number_in(config, key: str, low, high, allowed: str, *, low_open: bool = True,
              high_open: bool = True) -> float:
  """A real number (not bool), finite, within (low, high) with the given open ends."""
  x = value(config, key)
  ok = (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        and (x > low if low_open else x >= low)
        and (high is None or (x < high if high_open else x <= high)))
  require(ok, key, x, allowed)
  return float(x)


def data_seed(config) -> int:
  return int_in(config, "data.seed", 0, 2**32, "an int in [0, 2**32) (grain's shuffle seed)")


def eval_fraction(config) -> float:
  return number_in(config, "data.eval_fraction", 0, 1, "a float in (0, 1)")


def text_tokenizer(config) -> str:
  """data.tokenizer: "byte" or the path or URL of a tokenizer.json (text sources)."""
  return string(config, "data.tokenizer", f"{BYTE_TOKENIZER!r} or a tokenizer.json path or URL",
                nonempty=True)


EXCLUDE_SAMPLES_FORM = ('a tuple of distinct "DOMAIN/SHARD:SAMPLE" strings, e.g. '
                        '("book-65536/shard.00003.mds:7",): a data.domains name, a shard\'s '
                        'basename as its index.json names it, the sample\'s index in the shard')


def split_sample_ref(entry: str) -> tuple[str, int]:
  """"book-65536/shard.00003.mds:7" -> ("book-65536/shard.00003.mds", 7); ConfigError if the
  entry of data.exclude_samples is not of that form."""
  where, _, sample = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
  domain, _, shard = where.partition("/")
  require(bool(domain and shard and re.fullmatch(r"[0-9]+", sample)),
          "data.exclude_samples", entry, EXCLUDE_SAMPLES_FORM)
  return where, int(sample)


def exclude_samples(config) -> tuple[str, ...]:
  """data.exclude_samples, each entry checked (split_sample_ref); which sources may name
  samples is the registry's rule (hybrid_nope.data.sources.registry.exclude_samples)."""
  x = value(config, "data.exclude_samples")
  require(isinstance(x, (tuple, list)) and all(isinstance(e, str) for e in x)
          and len(set(x)) == len(x), "data.exclude_samples", x, EXCLUDE_SAMPLES_FORM)
  for entry in x:
    split_sample_ref(entry)
  return tuple(x)


# train.schedule's names (built by train/lr_schedule.py), here so that config checks need no
# train code.
SCHEDULES = ("cosine", "wsd", "linear", "constant")


def decay_steps(train_cfg) -> int:
  """WSD's cooldown length in updates: train.decay_fraction × train.steps, rounded."""
  return round(train_cfg.decay_fraction * train_cfg.steps)
