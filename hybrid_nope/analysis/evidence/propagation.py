"""How the gap moves through the stack: a transfer per module kind, used to predict the gap at
every global layer's input from the embedding's, and checked against the measurement.

Along the residual stream a block is two adds: residual_1 = input + mixer branch and
residual_2 = residual_1 + MLP branch, and the next block's input is residual_2. Each boundary's
transfer is T = gap(after) / gap(what it is compared with) (records.COMPARED_WITH), and a
module kind is (boundary, the block's layer type): the add after a window-16 SWA mixer and the
add after a global one are different kinds; the norm before global attention is one kind.
The prediction of config c's gap at layer l's normalised input is

  gap(input_0) · Π_{k < l} T(residual_1, type_k) T(residual_2, type_k) · T(pre_mixer_norm, type_l)

with each T the median over the *other* configs' runs and layers (leave one config out), so the
account is tested on configs it was not fitted to; a second column fits T within the config
(its other seeds) to separate "the kinds do not transfer across configs" from "a product of
transfers does not describe depth". It holds where the relative error (`relative_error`: the
absolute errors over the measured gaps, summed over the global layers) is within
verdict_rules.MARGIN_FRACTION.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from hybrid_nope.analysis.evidence.verdict_rules import MARGIN_FRACTION
from hybrid_nope.analysis.measure.records import COMPARED_WITH

STREAM = ("residual_1", "residual_2")
READ = "pre_mixer_norm"


def gaps(records: Sequence[dict]) -> dict[tuple[int, str], tuple[str, float]]:
  """(layer, boundary) -> (layer type, gap) of one run at one step."""
  return {(r["layer"], r["module"]): (r["layer_type"], float(r["gap"])) for r in records
          if r["layer"] >= 0}


def transfers(g: dict) -> dict[tuple[str, str], list[float]]:
  """Per module kind (boundary, layer type), the run's transfer ratios over its layers."""
  out = collections.defaultdict(list)
  for (layer, module), (kind, gap) in g.items():
    before = COMPARED_WITH.get(module)
    if before and (layer, before) in g and g[(layer, before)][1] != 0:
      out[(module, kind)].append(gap / g[(layer, before)][1])
  return out


def pooled(runs: Sequence[dict]) -> dict[tuple[str, str], float]:
  """The median transfer per kind over the runs' layers."""
  collected = collections.defaultdict(list)
  for g in runs:
    for kind, ratios in transfers(g).items():
      collected[kind].extend(ratios)
  return {kind: float(np.median(r)) for kind, r in collected.items()}


def predict(g: dict, t: dict) -> dict[int, float]:
  """Predicted gap at each global layer's normalised input, from the run's own embedding gap
  and the transfers t; a layer whose kind t lacks is left out (not guessed)."""
  layers = sorted({layer for layer, _ in g})
  out, stream = {}, g[(layers[0], "input")][1]
  for layer in layers:
    kind = g[(layer, "input")][0]
    if kind == "global" and (READ, kind) in t:
      out[layer] = stream * t[(READ, kind)]
    for module in STREAM:
      if (module, kind) not in t:
        return out
      stream *= t[(module, kind)]
  return out


def account(runs_by_config: dict[str, list[dict]]) -> list[dict]:
  """Per config: measured and predicted gaps at its global layers' input (seed means), the
  relative error with its seed SE, for transfers fitted on the other configs and within the
  config (leave one seed out), and whether each holds within the margin."""
  rows = []
  for config, runs in sorted(runs_by_config.items()):
    others = [g for c, rs in runs_by_config.items() if c != config for g in rs]
    errors, measured = {"across": [], "within": []}, []
    for i, g in enumerate(runs):
      own_others = runs[:i] + runs[i + 1:]
      fitted = {"across": pooled(others), "within": pooled(own_others) if own_others else {}}
      for name, t in fitted.items():
        predicted = predict(g, t)
        if predicted:
          meas = np.array([g[(layer, READ)][1] for layer in sorted(predicted)])
          pred = np.array([predicted[layer] for layer in sorted(predicted)])
          errors[name].append(relative_error(pred, meas))
      measured.append(np.mean([gap for (layer, m), (kind, gap) in g.items()
                               if m == READ and kind == "global"]))
    row = {"config": config, "seeds": len(runs), "measured_gap": _mean(measured)}
    for name, errs in errors.items():
      mean = _mean(errs)
      se = float(np.std(errs, ddof=1) / np.sqrt(len(errs))) if len(errs) > 1 else None
      row[f"error_{name}"], row[f"error_{name}_se"] = mean, se
      row[f"holds_{name}"] = mean is not None and mean <= MARGIN_FRACTION
    rows.append(row)
  return rows


def relative_error(predicted: np.ndarray, measured: np.ndarray) -> float:
  """Σ|predicted − measured| / Σ|measured| over a run's global layers: the mean error in units
  of the mean measured gap. A per-layer ratio (the mean of |error| / measured) explodes where
  one layer's gap is near 0 (it read 605195% on prose)."""
  return float(np.sum(np.abs(predicted - measured)) / np.sum(np.abs(measured)))


def _mean(values) -> float | None:
  return float(np.mean(values)) if len(values) else None
