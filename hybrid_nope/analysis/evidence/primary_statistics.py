"""The statistics a primary claim may name (docs/results/primary.toml), computed from packs.

Each is one value per seed (or per init draw) with the error its level allows: seed × document
where it is built from the probe's per-document sums (`two_level`), seed alone for eval losses
and for statistics read from the per-step records, draws alone for init-time statistics (each
draw measured on the same probe). A statistic whose inputs the packs lack gives a Verdict with
no values (inconclusive, "0 seeds"), never a guess.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from hybrid_nope.analysis.evidence import causal, two_level
from hybrid_nope.analysis.evidence.verdict_rules import Verdict
from hybrid_nope.analysis.evidence.finding_statistics import (INPUT, Run, against_null, by_seed,
                                                               mixer_most, verdict)


@dataclasses.dataclass
class Evidence:
  """One corpus's primary runs: experiment -> seed -> Run, each config's init-null file (the
  whole JSON of analyze.py --init_seeds, per-record draws included) and each config's causal
  test files by seed."""
  runs: dict[str, dict[int, Run]]
  init_nulls: dict[str, dict] = dataclasses.field(default_factory=dict)
  ablations: dict[str, dict[int, dict]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Statistic:
  configs: int                                        # how many configs the claim names
  text: str                                           # what is computed, per seed or draw
  compute: Callable[[Evidence, tuple[str, ...], str], Verdict]  # (evidence, configs, text)
  per_draw: bool = False                              # one value per init draw, not per seed

  def __call__(self, ev: Evidence, configs: tuple[str, ...]) -> Verdict:
    return self.compute(ev, configs, self.text)


def _empty(text: str, why: str) -> Verdict:
  return Verdict("", f"{text} — not computed: {why}", "", [])


def _runs(ev: Evidence, *configs: str) -> list[tuple] | None:
  if not all(c in ev.runs for c in configs):
    return None
  return by_seed(*(ev.runs[c] for c in configs))


def _trained(fn, needs: tuple[Callable[[Run], bool], str] | None = None) -> Callable:
  """A statistic of one or more trained configs paired by seed: fn(*runs) per seed. `needs`:
  (a test every run must pass, what it means) for inputs not every pack holds."""
  def compute(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
    pairs = _runs(ev, *configs)
    if not pairs:
      return _empty(text, f"no packs of {' and '.join(configs)} on common seeds")
    if needs and not all(needs[0](r) for runs in pairs for r in runs):
      return _empty(text, f"a pack lacks {needs[1]}")
    return verdict("", text, "", pairs, fn)
  return compute


def _steepness(lag: int) -> Callable:
  trained = _trained(lambda a, b: a.steepness(a.final, lag) - b.steepness(b.final, lag))
  def compute(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
    runs = [next(iter(ev.runs[c].values())) for c in configs if ev.runs.get(c)]
    if any(lag not in r.at(r.final).lags for r in runs):
      return _empty(text, f"lag {lag} was not measured")
    return trained(ev, configs, text)
  return compute


def _init_gap_minus_nope(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
  """Per init draw: the global layers' input gap of the hybrid − of the global-only model at
  the same layers, both drawn from the same init seed."""
  hybrid, nope = configs
  nulls = [ev.init_nulls.get(c) for c in configs]
  if not all(nulls) or hybrid not in ev.runs:
    return _empty(text, f"no init-null file of {hybrid} and {nope}")
  if nulls[0]["seeds"] != nulls[1]["seeds"]:
    return _empty(text, "the two configs' init draws used different seeds")
  layers = next(iter(ev.runs[hybrid].values())).global_layers
  try:
    per_layer = np.asarray([[np.asarray(n["records"][f"{g}/{INPUT}"]["gap"]["values"], float)
                             for g in layers] for n in nulls])      # [2, layers, draws]
  except KeyError:
    return _empty(text, "the init-null files hold no per-draw values (packed before they were "
                  "kept)")
  diff = (per_layer[0] - per_layer[1]).mean(0)
  return Verdict("", text, "", [float(x) for x in diff])


def _matched_loss_step(r: Run, target: float) -> int | None:
  """The step with both an eval loss and recency records whose eval loss is nearest `target`."""
  steps = [s for s in r.eval_losses if s in r.by_step]
  return min(steps, key=lambda s: abs(r.eval_losses[s] - target)) if steps else None


def _readout_at(r: Run, step: int, layers) -> float:
  """Head- and layer-mean logit gap of the per-step records at the given global layers."""
  return float(np.mean([np.mean(rec["logit_gap"]) for rec in r.records(step, INPUT)
                        if rec["layer"] in layers and "logit_gap" in rec]))


def _readout_minus_nope_at_matched_loss(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
  pairs = _runs(ev, *configs)
  if not pairs:
    return _empty(text, f"no packs of {' and '.join(configs)} on common seeds")
  values = []
  for hybrid, nope in pairs:
    target = nope.summary["eval_loss"]
    step = None if target is None else _matched_loss_step(hybrid, target)
    if step is None:
      continue
    values.append(_readout_at(hybrid, step, hybrid.global_layers)
                  - _readout_at(nope, nope.final, hybrid.global_layers))
  return Verdict("", text, "", values)


def _logit_gap_minus_init_null(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
  (e,) = configs
  null = ((ev.init_nulls.get(e) or {}).get("summary") or {}).get("logit_gap") or {}
  pairs = _runs(ev, e)
  if not pairs or not null.get("sd"):
    return _empty(text, f"no packs of {e}, or no init null of its logit gap")
  return against_null(verdict("", text, "", pairs, lambda r: r.logit_gap(r.final)), null)


def _causal(ev: Evidence, configs: tuple[str, ...], text: str) -> Verdict:
  """Per seed: ablated − the damage-matched control that keeps the branch and adds
  position-free noise (ablation.CONTROL, added_noise_matched), the head- and layer-mean logit
  gap unsigned (the registered direction says it falls), paired by the probe's documents; only
  seeds whose file holds that control count. Invalid where that control is not neutral over
  those seeds (`causal.control_not_neutral`: it moves the clean gap at the global input)."""
  (e,) = configs
  files = [f for _, f in sorted((ev.ablations.get(e) or {}).items())
           if f is not None and causal.has(f, causal.CONTROL)]
  if not files:
    return _empty(text, f"no causal-test files of {e} with the matched control")
  diffs = [causal.difference_replicates(f, causal.ABLATED, causal.CONTROL, signed=False)
           for f in files]
  return Verdict("", text, "", [float(d[0]) for d in diffs],
                 estimate=two_level.combine(diffs) if len(diffs) >= 2 else None,
                 invalid=causal.control_not_neutral(files))


def _loss(a: Run, b: Run):
  if a.summary["eval_loss"] is None or b.summary["eval_loss"] is None:
    return float("nan")
  return a.summary["eval_loss"] - b.summary["eval_loss"]


STATISTICS: dict[str, Statistic] = {
    "init_global_input_gap_minus_nope": Statistic(
        2, "gap at the global layers' normalised input at init, config − nope at the same "
        "layers, per init draw (same draw seed)", _init_gap_minus_nope, per_draw=True),
    "global_input_gap_final_minus_init": Statistic(
        1, "gap at the global layers' normalised input, final − step 0, mean over global layers",
        _trained(lambda r: r.global_input_gap(r.final) - r.global_input_gap(0))),
    "local_mixer_gap_raise_minus_largest_other": Statistic(
        1, "gap raise of the local mixer − the largest other module's (norms, MLP, global "
        "mixer), mean over layers, final", _trained(mixer_most)),
    "steepness_64_small_minus_large": Statistic(
        2, "f(1) − f(64) at the global input, first config − second, paired by seed, final",
        _steepness(64)),
    "logit_gap_final_minus_init_null": Statistic(
        1, "head- and layer-mean logit gap, final − the init-null mean (Welch with the draws)",
        _logit_gap_minus_init_null),
    "logit_gap_minus_shuffled": Statistic(
        1, "logit gap − shuffled-token logit gap, head and layer mean, final",
        _trained(lambda r: r.logit_gap(r.final) - np.mean(
            [r.at(r.final).shuffled_logit_gap(g) for g in r.global_layers], axis=0),
        needs=(Run.has_shuffled_readout, "the shuffled-token read-out sums"))),
    "logit_gap_minus_nope_at_matched_loss": Statistic(
        2, "head- and layer-mean logit gap (per-step records) of the config at its step whose "
        "eval loss is nearest nope's final − nope's final at the same layers, paired by seed",
        _readout_minus_nope_at_matched_loss),
    "causal_ablated_minus_added_noise_control": Statistic(
        1, "head- and layer-mean logit gap, local branches ablated − the branch kept plus "
        "position-free noise at the ablation's eval loss, final checkpoint", _causal),
    "eval_loss_small_minus_large": Statistic(
        2, "final eval loss, first config − second, paired by seed", _trained(_loss)),
    "eval_loss_nopeswa_minus_swa_at_far_lag": Statistic(
        2, "final eval loss, NoPE-in-SWA − RoPE-in-SWA at the same window, paired by seed",
        _trained(_loss)),
}
