"""The causal test across seeds: do a config's global NoPE layers read out the recency its local
layers plant? One verdict per config, from each run's ablation_T<T>.json (`analyze.py
--ablate=local`, analysis/checkpoint/ablation.py).

Per seed the statistic is the ablated − control logit gap of each global NoPE layer (head mean),
signed by the layer's clean logit gap and averaged over the layers. The control
(ablation.CONTROL, added_noise_matched) keeps the branch and adds i.i.d. noise, its dial set so
its eval loss is the ablation's: equal damage, the branch's position kept and none added. Any
destructive intervention shrinks a read-out toward 0, so against a control of the same damage
that keeps position what is left is position. Older files lack it: `control_for` takes, for
all of a config's seeds, the first of CONTROLS every seed has (noise_matched, noise in the
branch's place, then the rotated control of the oldest files); `row`'s "control" names it.
The statistic is built from the file's per-document sums (`logit_sums`), so its error has
the seed and the document level (`two_level.combine`, the probe's documents shared by every
seed). The claim says it is negative; its margin is `verdict_rules.MARGIN_FRACTION` of the
clean |logit gap| (the read-out the ablation should remove), fixed before the ablated numbers
are read. A control whose own effect on the global input's gap is not ≈ 0 makes the verdict
invalid (`control_not_neutral`).

Beside it: the same difference unsigned, per layer and in the mean; `seed_table`'s per-layer clean
logit gaps with `stable_sign` (False where a layer's clean logit gap changes sign across seeds:
its signed effect mixes directions and should be read unsigned); and the position-specific
read-out (ablated − noise, ablated − other_row, and their difference other_row − noise: both
without content, only other_row with position, so what position alone is worth); and
`control_effects`, what each intervention of equal damage does to the branches' own recency and
to the gap at the global layers' input (the control must carry none: noise_matched − ablated ≈ 0).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hybrid_nope.analysis.checkpoint.ablation import (
    ABLATED, ADDED_NOISE_MATCHED, CLEAN, CONTROL, LEGACY_CONTROL, NOISE, NOISE_MATCHED, OTHER_ROW,
    OTHER_ROW_MATCHED, ROTATED, SCATTERED_MATCHED)
from hybrid_nope.analysis.evidence import two_level, verdict_rules
from hybrid_nope.analysis.evidence.seed_stats import mean_se
from hybrid_nope.analysis.evidence.verdict_rules import Verdict

FINDING = "global NoPE layers read out the planted recency (causal: local branches ablated)"
STATISTIC = ("ablated − damage-matched added-noise control logit gap at the final checkpoint, "
             "each global NoPE layer's signed by its clean logit gap (negative: the read-out "
             "shrinks), mean over layers and heads")
NULL = ("removing position from the local branches changes the read-out no more than adding "
        "position-free noise to them at the same eval loss")
# The null each older control stands for (`verdict` names the control its seeds share).
OLDER_NULLS = {NOISE_MATCHED: "removing position from the local branches changes the read-out "
                              "no more than position-free noise in their place at the same "
                              "eval loss (content, not position: both remove position)",
               ROTATED: "removing position from the local branches changes the read-out no "
                        "more than a rotated copy of the ablation's perturbation (which keeps "
                        "its Gram structure, and with it recency)"}
MARGIN_RULE = "a tenth of the clean logit gap's size (the read-out the ablation should remove)"
# The position-specific read-out: name -> (a, b) of a − b on the head/layer-mean logit gap.
POSITION = {"ablated_minus_noise": (ABLATED, NOISE),
            "ablated_minus_other_row": (ABLATED, OTHER_ROW),
            "other_row_minus_noise": (OTHER_ROW, NOISE),
            "other_row_matched_minus_noise_matched": (OTHER_ROW_MATCHED, NOISE_MATCHED)}


def _key(result: dict, condition: str) -> str | None:
  """Where `condition`'s sums are in this file (ROTATED is LEGACY_CONTROL in old files)."""
  sums = result["logit_sums"]
  if condition in sums:
    return condition
  if condition == ROTATED and LEGACY_CONTROL in sums:
    return LEGACY_CONTROL
  return None


def has(result: dict, condition: str) -> bool:
  return _key(result, condition) is not None


def _layer_replicates(result: dict, condition: str, layer: int) -> np.ndarray:
  """[C + 1]: one global NoPE layer's head-mean logit gap under `condition` on all of the
  probe's documents, then with each document left out (`two_level.leave_one_out`)."""
  sums, counts = result["logit_sums"], result["logit_sums"]["counts"]
  key = _key(result, condition)
  if key is None:
    raise KeyError(f"condition {condition!r} is not in this ablation file (it has "
                   f"{sorted(k for k in sums if k not in ('counts', 'layers'))})")
  near_CN, far_CN = (np.asarray(sums[key][str(layer)][k], np.float64) for k in ("near", "far"))
  return (two_level.leave_one_out(near_CN.T, counts["near"])
          - two_level.leave_one_out(far_CN.T, counts["far"])).mean(0)


def logit_gap_replicates(result: dict, condition: str) -> np.ndarray:
  """[C + 1] for one condition: the head- and layer-mean logit gap, full and leave-one-out."""
  return np.mean([_layer_replicates(result, condition, layer)
                  for layer in result["logit_sums"]["layers"]], axis=0)


def read_out_size(result: dict) -> float:
  """Mean over global NoPE layers of |clean logit gap|: the read-out the ablation can remove."""
  return float(np.mean([abs(_layer_replicates(result, CLEAN, layer)[0])
                        for layer in result["logit_sums"]["layers"]]))


def layer_differences(result: dict, a: str, b: str, signed: bool = True) -> np.ndarray:
  """[layers, C + 1]: condition a − b per global NoPE layer (head mean), each signed by that
  layer's clean logit gap when `signed`; paired by document."""
  out = []
  for layer in result["logit_sums"]["layers"]:
    sign = np.sign(_layer_replicates(result, CLEAN, layer)[0]) if signed else 1.0
    out.append(sign * (_layer_replicates(result, a, layer) - _layer_replicates(result, b, layer)))
  return np.asarray(out)


def difference_replicates(result: dict, a: str = ABLATED, b: str = CONTROL,
                          signed: bool = True) -> np.ndarray:
  """[C + 1]: condition a − b per global NoPE layer, signed by that layer's clean logit gap
  (a read-out may favour recent or far keys; removing what it reads moves it toward 0 either
  way) unless `signed` is False, averaged over the layers; paired by document."""
  return layer_differences(result, a, b, signed).mean(0)


def _usable(results: Sequence[dict]) -> list[dict]:
  return [r for r in results if r is not None and "logit_sums" in r
          and r["logit_sums"]["layers"]]


# The controls a config's seeds may be compared against, newest first (`control_for`).
CONTROLS = (CONTROL, NOISE_MATCHED, ROTATED)
# Where a control's own effect on the global input's gap is read from (`control_effects`): a
# control that keeps the branch's position should leave the clean gap; noise in the branch's
# place removes position as the ablation does, so it should leave the ablated gap.
NEUTRAL_AGAINST = {NOISE_MATCHED: ABLATED}


def control_for(results: Sequence[dict]) -> str:
  """The first of CONTROLS that every seed's file has (ROTATED for the oldest files)."""
  results = _usable(results)
  return next((c for c in CONTROLS[:-1] if results and all(has(r, c) for r in results)),
              ROTATED)


def _same_probe(results: Sequence[dict], name: str) -> None:
  keys = {(tuple(r["probe"]["rows"]), r["seq_len"], r["far_lag"]) for r in results}
  if len(keys) > 1:
    raise ValueError(f"{name}: the seeds' ablation files measured different probes, lengths or "
                     f"far lags; documents cannot pair across them")


def seed_table(results: Sequence[dict]) -> dict:
  """One config's seeds side by side: per global NoPE layer its clean logit gap per seed and
  `stable_sign` (the same nonzero sign at every seed); per seed the verdict's value (ablated −
  control, signed) and the same unsigned, on the head/layer-mean logit gap, and per layer the
  signed and unsigned ablated − control per seed ([layer][seed], as clean_logit_gap).
  `control`: the control used."""
  results = _usable(results)
  if not results:
    return {"control": None, "layers": [], "clean_logit_gap": [], "stable_sign": [],
            "ablated_minus_control": [], "ablated_minus_control_signed": [],
            "layer_ablated_minus_control": [], "layer_ablated_minus_control_signed": []}
  control = control_for(results)
  layers = [int(i) for i in results[0]["logit_sums"]["layers"]]
  if any([int(i) for i in r["logit_sums"]["layers"]] != layers for r in results):
    raise ValueError("the seeds' ablation files read out different global NoPE layers")
  clean = [[float(_layer_replicates(r, CLEAN, layer)[0]) for r in results] for layer in layers]
  per_layer = {s: [layer_differences(r, ABLATED, control, s)[:, 0] for r in results]
               for s in (False, True)}
  return {"control": control, "layers": layers, "clean_logit_gap": clean,
          "stable_sign": [bool(len({np.sign(g) for g in gaps}) == 1 and gaps[0] != 0)
                          for gaps in clean],
          "ablated_minus_control": [float(np.mean(d)) for d in per_layer[False]],
          "ablated_minus_control_signed": [float(np.mean(d)) for d in per_layer[True]],
          "layer_ablated_minus_control": np.transpose(per_layer[False]).tolist(),
          "layer_ablated_minus_control_signed": np.transpose(per_layer[True]).tolist()}


def control_not_neutral(results: Sequence[dict]) -> str:
  """Why the matched control cannot decide the causal claim, or "" where it can: it is not
  neutral (`control_effects`), i.e. its own effect on the global layers' input gap is beyond a
  tenth of the ablation's change. Against such a control the read-out difference mixes
  position with the control's own effect on the gap (dilution where its dial scales the noise
  past the ablation's norm), so neither direction of the difference decides."""
  effects = control_effects(results)
  if not effects["seeds"] or effects["neutral"]:
    return ""
  mean, se = effects["own_gap_effect"]
  return (f"the matched control is not neutral: {effects['control']} − "
          f"{effects['neutral_against']} moves the global layers' input gap by {mean:+.4f} ± "
          f"{se:.4f} (seed SE), beyond ±{effects['neutral_bound']:.4f} (a tenth of the "
          f"ablation's own change) at λ {effects['control_lam']:.3g}")


def verdict(config: str, results: Sequence[dict]) -> Verdict:
  """The config's causal verdict over its seeds' ablation results (one per seed); `invalid`
  where its matched control is not neutral (`control_not_neutral`)."""
  results = _usable(results)
  if results:
    _same_probe(results, config)
  control = control_for(results)
  diffs = [difference_replicates(r, ABLATED, control) for r in results]
  clean = [read_out_size(r) for r in results]
  estimate = two_level.combine(diffs) if len(diffs) >= 2 else None
  statistic = STATISTIC if control == CONTROL else STATISTIC.replace(
      "damage-matched added-noise control", {
          NOISE_MATCHED: "damage-matched noise in the branch's place (files older than the "
                         "added-noise control)",
          ROTATED: "rotated control (files older than the matched ones)"}[control])
  return Verdict(f"{config}: {FINDING}", statistic, OLDER_NULLS.get(control, NULL),
                 [float(d[0]) for d in diffs],
                 sign=-1, margin=verdict_rules.MARGIN_FRACTION * float(np.mean(clean)) if clean
                 else None, margin_rule=MARGIN_RULE, estimate=estimate,
                 invalid=control_not_neutral(results) if control != ROTATED else "")


def loss_change(results: Sequence[dict], key: str = "loss", name: str | None = None
                ) -> list[float]:
  """Per seed: a loss difference (`name`, default ablated − the config's control;
  `key`: loss, loss_within, loss_near or loss_beyond). Against the matched control it is ≈ 0
  by construction (within the matching tolerance); ablated_minus_clean is the ablation's cost."""
  results = [r for r in results if r is not None]
  if name is None:
    control = control_for(results)
    name = f"{ABLATED}_minus_{control}"
  out = []
  for r in results:
    delta = r["loss_delta"].get(name)
    legacy = name.startswith(f"{ABLATED}_minus_") and name != f"{ABLATED}_minus_{CLEAN}"
    if delta is None and legacy:
      delta = r["loss_delta"].get(f"{ABLATED}_minus_{LEGACY_CONTROL}")  # An older file's.
    if delta is not None and delta[key] is not None:
      out.append(delta[key])
  return out


# The interventions of equal damage (files older than a condition lack it).
EFFECT_CONDITIONS = (ABLATED, NOISE_MATCHED, OTHER_ROW_MATCHED, ADDED_NOISE_MATCHED,
                     SCATTERED_MATCHED)


def control_effects(results: Sequence[dict]) -> dict:
  """What each intervention of equal damage (EFFECT_CONDITIONS) does to the recency it should
  keep or remove, each a (seed mean, seed SE) over the seeds whose file has the matched
  control. Per condition: `branch_gap`, the local branches' own gap (mean over the local
  layers: ≈ 0 where it carries no position), `input_gap_change`, its change of the gap at the
  global layers' normalised input from clean, `eval_loss` with the dial `lam`, and for a control
  `readout_ablated_minus`: ablated − it on the head/layer-mean logit gap, unsigned (seed ×
  document SE; seed SE for one document or seed level). Then for the verdict's `control`
  (`control_for`) its `own_gap_effect` at the global input, against `neutral_against` (clean,
  or the ablated gap for noise in the branch's place, NEUTRAL_AGAINST: ≈ 0 where the control
  adds or removes no position of its own) and `document_se`, its mean per-seed standard error
  over the probe's documents; `neutral` whether that is within `neutral_bound`, a tenth of the
  ablation's own change of the gap; `seeds`, the files used."""
  control = control_for(results)
  results = [r for r in _usable(results)
             if has(r, control) and all(k in r for k in ("summary", "local_layers", "eval"))]
  out = {"seeds": len(results) if control != ROTATED else 0, "conditions": {}}
  if not out["seeds"]:
    return out
  branch = lambda r, c: float(np.mean([x["mixer_gap"][c] for x in r["local_layers"]]))
  for c in [c for c in (CLEAN, *EFFECT_CONDITIONS) if all(c in r["eval"] for r in results)]:
    out["conditions"][c] = {
        "branch_gap": mean_se([branch(r, c) for r in results]),
        "input_gap_change": (mean_se([r["summary"][f"{c}_minus_{CLEAN}"]["gap"]
                                         for r in results]) if c != CLEAN else (0.0, None)),
        "input_gap": mean_se([r["summary"][c]["gap"] for r in results]),
        "eval_loss": mean_se([r["eval"][c]["loss"] for r in results]),
        "lam": mean_se([(r["damage"].get(c) or {}).get("lam", 1.0) for r in results])}
    if c not in (CLEAN, ABLATED) and all(has(r, c) for r in results):
      estimate = two_level.combine([difference_replicates(r, ABLATED, c, signed=False)
                                    for r in results])
      out["conditions"][c]["readout_ablated_minus"] = (
          (estimate.mean, estimate.se) if estimate else
          mean_se([float(difference_replicates(r, ABLATED, c, signed=False)[0])
                      for r in results]))
  against = NEUTRAL_AGAINST.get(control, CLEAN)
  own = [r["summary"][f"{control}_minus_{CLEAN}" if against == CLEAN
                      else f"{ABLATED}_minus_{control}"] for r in results]
  sign = 1 if against == CLEAN else -1  # ablated − control read as control − ablated.
  out.update(control=control, neutral_against=against,
             own_gap_effect=mean_se([sign * x["gap"] for x in own]),
             document_se=float(np.mean([x["gap_stderr"] for x in own])))
  # ≈ 0 means within a tenth (verdict_rules.MARGIN_FRACTION) of what the ablation itself
  # does to the gap: a control that moves the gap by more mixes its own effect into the verdict.
  bound = verdict_rules.MARGIN_FRACTION * abs(out["conditions"][ABLATED]["input_gap_change"][0])
  out["neutral_bound"] = bound
  out["neutral"] = bool(abs(out["own_gap_effect"][0]) <= bound)
  out["control_lam"] = out["conditions"][control]["lam"][0]
  return out


def row(config: str, results: Sequence[dict], v: Verdict) -> dict:
  """The page's numbers for one config: seeds, the control used, the clean read-out's size, each
  difference's seed mean (signed as the verdict's statistic, and unsigned), per layer its clean
  logit gap, stable_sign and effects, the position-specific differences (unsigned; None where
  the files lack those controls), and the loss changes (seed mean, seed SE)."""
  results = _usable(results)
  control = control_for(results)
  mean = lambda xs: float(np.mean(xs)) if len(xs) else None
  se = lambda xs: float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) >= 2 else None
  diff = lambda a, b, s=True: (mean([float(difference_replicates(r, a, b, s)[0])
                                     for r in results])
                               if results and all(has(r, a) and has(r, b) for r in results)
                               else None)
  table = seed_table(results)
  losses = loss_change(results)
  cost = loss_change(results, name=f"{ABLATED}_minus_{CLEAN}")
  layers = [{"layer": layer, "clean": mean(gaps), "stable_sign": stable,
             "ablated_minus_control": mean(unsigned), "ablated_minus_control_signed": mean(signed)}
            for layer, gaps, stable, unsigned, signed in zip(
                table["layers"], table["clean_logit_gap"], table["stable_sign"],
                table["layer_ablated_minus_control"], table["layer_ablated_minus_control_signed"])]
  return {"config": config, "seeds": len(results), "control": control,
          "clean": mean([read_out_size(r) for r in results]),
          "ablated_minus_clean": diff(ABLATED, CLEAN),
          "control_minus_clean": diff(control, CLEAN),
          "ablated_minus_control": v.mean, "se": v.se,
          "ablated_minus_control_unsigned": diff(ABLATED, control, False),
          "ablated_minus_control_unsigned_se": se(table["ablated_minus_control"]),
          "layers": layers,
          "no_stable_sign": [r["layer"] for r in layers if not r["stable_sign"]],
          "position": {name: diff(a, b, False) for name, (a, b) in POSITION.items()},
          "loss": mean(losses), "loss_se": se(losses),
          "loss_ablated_minus_clean": mean(cost), "loss_ablated_minus_clean_se": se(cost),
          "control_effects": control_effects(results), "verdict": v}
