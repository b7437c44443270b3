"""The empirical init null: every statistic at K fresh initialisations, on the run's probe.

A trained value means something only against what an untrained network of the same config
already shows on the same documents. `measure` draws K initialisations with seeds
INIT_SEED_BASE + k (never a training seed), measures each with the run's hook, and keeps, per
(layer, module) and for the run summary, the mean and standard deviation over the K draws.
`zscore` is how far a trained value lies from that null in its standard deviations.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

INIT_SEED_BASE = 1_000_000
RECORD_STATS = ("gap", "floor", "gap_matched", "shuffled_gap")
HEAD_MEAN_STATS = ("logit_gap", "alignment")


def _moments(values: Sequence[float]) -> dict:
  """Mean, SD and count over the draws, and the draws themselves in seed order (None where a
  draw measured nothing): a statistic combining several records (a mean over layers) needs
  them per draw, since the records of one draw are correlated."""
  drawn = [None if x is None or not np.isfinite(x) else float(x) for x in values]
  v = np.asarray([x for x in drawn if x is not None], np.float64)
  return {"mean": float(v.mean()) if v.size else None,
          "sd": float(v.std(ddof=1)) if v.size >= 2 else None, "draws": int(v.size),
          "values": drawn}


def _per_record(records: Sequence[dict]) -> dict[str, dict[str, float]]:
  out = {}
  for r in records:
    values = {k: r[k] for k in RECORD_STATS if k in r}
    values.update({k: float(np.mean(r[k])) for k in HEAD_MEAN_STATS if k in r})
    out[f"{r['layer']}/{r['module']}"] = values
  return out


def measure(records_of: Callable[[dict], list[dict]], init: Callable[[int], dict],
            summarize: Callable[[list[dict]], dict], num_seeds: int) -> dict:
  """`records_of(params)`: the hook's records; `init(seed)`: fresh params; `summarize`: the
  run summary of a record list. Returns {"seeds", "records": key -> stat -> moments,
  "summary": stat -> moments}."""
  if num_seeds < 2:
    raise ValueError(f"--init_seeds={num_seeds}: need at least 2 initialisations for a spread")
  seeds = [INIT_SEED_BASE + k for k in range(num_seeds)]
  per_record, summaries = [], []
  for seed in seeds:
    records = records_of(init(seed))
    per_record.append(_per_record(records))
    summaries.append(summarize(records))
  keys = per_record[0]
  return {"seeds": seeds,
          "records": {key: {stat: _moments([d[key].get(stat) for d in per_record])
                            for stat in keys[key]} for key in keys},
          "summary": {stat: _moments([s.get(stat) for s in summaries])
                      for stat in summaries[0] if isinstance(summaries[0][stat], float)}}


def zscore(value, null: dict | None) -> float | None:
  """(value − null mean) / null SD, or None where either is missing or the SD is 0."""
  if value is None or not null or null.get("mean") is None or not null.get("sd"):
    return None
  return float((value - null["mean"]) / null["sd"])


def on_device_of(params) -> Callable[[dict], dict]:
  """Puts fresh params where `params` live, so measuring them reuses one compilation."""
  sharding = jax.tree.leaves(params)[0].sharding
  return lambda tree: jax.device_put(tree, sharding)
