"""Each published finding (DESIGN.md) as a statistic per seed, with its two-level error, its null
and its margin: what docs/results.md's verdict table is made of.

A statistic of the recency records is computed on the probe's per-document sums
(`two_level.Replicates`: the estimate on all documents and with each one left out), so it
carries a seed × document error; eval losses are not split by document and carry the seed
level alone. Each finding names the part the local layers contribute where the claim is about
them: a config against the baseline (global layers only, same seed, same shapes where they
agree) at the same layers.

Margins follow one rule (`verdict_rules.MARGIN_FRACTION` of a reference magnitude), the reference
being what the local layers themselves do to the statistic's quantity in that config, final
step, seed mean:
- cosine statistics: the local mixer's own raise of the gap (mixer output − its input);
- logit statistics: the config's head- and layer-mean logit gap − the baseline's (what the local
  layers add to the read-out);
- eval losses: the baseline's loss − the reference config's (what the local layers buy);
- the configs without a local layer (the baseline) take the mean of that reference over the
  page's local configs.

The baseline (global layers only) is named by the caller (`exploratory_experiments`).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable

import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.analysis.evidence import compare, run_files, two_level
from hybrid_nope.analysis.evidence.verdict_rules import Verdict, margin_of, paired
from hybrid_nope.analysis.measure import records as records_lib
from hybrid_nope.run.reader import RunReader

INPUT = "pre_mixer_norm"  # The normalised input global attention reads.
NORMS = ("pre_mixer_norm", "pre_mlp_norm")
# The two readings of a residual add: against the stream it adds to, and against the branch.
RESIDUALS = {"residual_1": ("the mixer's residual add", "input", "mixer"),
             "residual_2": ("the MLP's residual add", "residual_1", "mlp")}


class Run:
  """One run's recency records and per-document sums by step, and its compare summary."""

  def __init__(self, run: RunReader, name: str):
    self.summary = compare.load_run(run, name)
    rd = run.layout
    self.eval_losses = {r["step"]: r["eval_loss"] for r in run_files.read_jsonl(rd.metrics)
                        if "eval_loss" in r}
    self.by_step = collections.defaultdict(list)
    for r in run_files.read_jsonl(rd.recency):
      self.by_step[r["step"]].append(r)
    self.final = max(self.by_step)
    self.layer_types = {r["layer"]: r["layer_type"] for r in self.by_step[self.final]
                        if r["layer"] >= 0}
    self._sums = {}
    for step in (0, self.final):
      path = rd.recency_sums_file(step)
      if storage.exists(path):
        sums, lags, far = records_lib.decode_sums(storage.read_bytes(path))
        self._sums[step] = two_level.Replicates(sums, lags, far)

  def at(self, step: int) -> two_level.Replicates:
    if step not in self._sums:
      raise FileNotFoundError(f"{self.summary['name']}: no per-document sums at step {step}")
    return self._sums[step]

  def layers(self, *types: str) -> list[int]:
    return sorted(layer for layer, t in self.layer_types.items() if t in types)

  @property
  def global_layers(self) -> list[int]:
    return self.layers("global")

  @property
  def local_layers(self) -> list[int]:
    return self.layers("swa", "linear", "delta")

  def local_type(self) -> str:
    types = {self.layer_types[layer] for layer in self.local_layers}
    return next(iter(types)) if len(types) == 1 else ""

  def records(self, step: int, module: str, layer_type: str | None = None) -> list[dict]:
    return [r for r in self.by_step[step] if r["module"] == module
            and (layer_type is None or r["layer_type"] == layer_type)]

  # ---- statistics as replicate arrays [C + 1] ----
  def gap(self, step: int, module: str, layers) -> np.ndarray:
    reps = self.at(step)
    return np.mean([reps.gap(f"{layer}/{module}") for layer in layers], axis=0)

  def floor(self, step: int, module: str, layers) -> np.ndarray:
    reps = self.at(step)
    return np.mean([reps.floor(f"{layer}/{module}") for layer in layers], axis=0)

  def change(self, kind: str, step: int, module: str, before: str, layers) -> np.ndarray:
    """gap or floor of `module` − of `before`, mean over layers."""
    of = self.gap if kind == "gap" else self.floor
    return of(step, module, layers) - of(step, before, layers)

  def global_input_gap(self, step: int, layers=None) -> np.ndarray:
    return self.gap(step, INPUT, self.global_layers if layers is None else layers)

  def steepness(self, step: int, lag: int) -> np.ndarray:
    """f(1) − f(lag) at the global layers' input."""
    reps = self.at(step)
    i = reps.lags.index(lag)
    return np.mean([reps.mean(f"{g}/{INPUT}", reps.near_i) - reps.mean(f"{g}/{INPUT}", i)
                    for g in self.global_layers], axis=0)

  def logit_gap(self, step: int, layers=None) -> np.ndarray:
    """Head- and layer-mean logit gap at the global layers (or those given)."""
    reps = self.at(step)
    return np.mean([reps.logit_gap(g) for g in (self.global_layers if layers is None
                                                 else layers)], axis=0)

  def has_shuffled_readout(self) -> bool:
    return self.at(self.final).has(f"{self.global_layers[0]}/logit/shuffled")


Statistic = Callable[..., np.ndarray]


def verdict(finding: str, statistic: str, null: str, runs_by_seed: list[tuple], fn: Statistic,
            sign: int = 1, reference: float | None = None, rule: str = "") -> Verdict:
  """A Verdict from `fn(*runs)` per seed (runs: one per config, paired by seed), each a replicate
  array (two levels) or a float (seed level only)."""
  values = [fn(*rs) for rs in runs_by_seed]
  arrays = all(np.ndim(v) == 1 for v in values)
  est = two_level.combine(values) if arrays and len(values) >= 2 else None
  return Verdict(finding, statistic, null, [float(v[0]) if np.ndim(v) else float(v)
                                            for v in values], sign=sign,
                 margin=margin_of(reference), margin_rule=rule, estimate=est)


def by_seed(*configs: dict[int, Run]) -> list[tuple]:
  seeds = sorted(set.intersection(*(set(c) for c in configs)))
  return [tuple(c[s] for c in configs) for s in seeds]


def _seed_mean(values) -> float | None:
  values = [v for v in values if v is not None and math.isfinite(v)]
  return float(np.mean(values)) if values else None


class References:
  """The margins' reference magnitudes (the module docstring's rule), per config."""

  def __init__(self, runs: dict[str, dict[int, Run]], local: list[str], baseline: str):
    self.baseline = baseline
    self.cosine = {e: _seed_mean([float(r.change("gap", r.final, "mixer", INPUT,
                                                  r.local_layers)[0])
                                  for r in runs[e].values()]) for e in local}
    baseline_runs = runs.get(baseline)
    self.logit, self.loss = {}, {}
    for e in local:
      if baseline_runs:
        pairs = by_seed(runs[e], baseline_runs)
        self.logit[e] = _seed_mean([float(a.logit_gap(a.final)[0] - b.logit_gap(b.final)[0])
                                    for a, b in pairs])
        self.loss[e] = _seed_mean([b.summary["eval_loss"] - a.summary["eval_loss"]
                                   for a, b in pairs if a.summary["eval_loss"] is not None
                                   and b.summary["eval_loss"] is not None])
    # What a norm can move: the floor and gap of the streams the two norms read.
    self.norm = {kind: {e: _seed_mean([float(norm_input(kind)(r)[0]) for r in rs.values()])
                        for e, rs in runs.items()} for kind in ("floor", "gap")}
    for table in (self.cosine, self.logit, self.loss):
      known = [abs(v) for v in table.values() if v is not None]
      table[baseline] = float(np.mean(known)) if known else None

  COSINE_RULE = "10% of {e} local mixer raise of the gap"
  LOGIT_RULE = "10% of {e} logit gap − {baseline}'s"
  LOSS_RULE = "10% of {baseline}'s loss − {e}'s"
  POOLED = "the local configs' mean"

  def _whose(self, e: str) -> str:
    return f"{e}'s" if e != self.baseline else self.POOLED

  def cosine_margin(self, e: str) -> tuple[float | None, str]:
    return self.cosine.get(e), self.COSINE_RULE.format(e=self._whose(e))

  def logit_margin(self, e: str) -> tuple[float | None, str]:
    return self.logit.get(e), self.LOGIT_RULE.format(e=self._whose(e), baseline=self.baseline)

  def loss_margin(self, e: str) -> tuple[float | None, str]:
    return self.loss.get(e), self.LOSS_RULE.format(e=e, baseline=self.baseline)

  NORM_RULE = "10% of {e}'s {kind} at the norms' inputs (what a norm can move)"

  def norm_margin(self, e: str, kind: str) -> tuple[float | None, str]:
    """RMSNorm leaves cosines unchanged but for its gains, so a norm's effect is measured
    against the quantity it acts on, not against the local mixer's raise."""
    return self.norm[kind].get(e), self.NORM_RULE.format(e=e, kind=kind)


def depth_trend(r: Run, layers=None) -> np.ndarray:
  """Gap at the last global layer's input − at the first (or of `layers`), final step."""
  layers = r.global_layers if layers is None else layers
  return r.gap(r.final, INPUT, [layers[-1]]) - r.gap(r.final, INPUT, [layers[0]])


NORM_INPUTS = (("pre_mixer_norm", "input"), ("pre_mlp_norm", "residual_1"))


def norm_input(kind: str) -> Statistic:
  """The gap or floor of the streams the two norms read, mean over layers and norms, final."""
  return lambda r: np.mean([getattr(r, kind)(r.final, before, sorted(r.layer_types))
                            for _, before in NORM_INPUTS], axis=0)


def norm_change(kind: str) -> Statistic:
  """The two norms' change of `kind` (gap or floor: output − input), mean over all layers and
  over the two norms, final step."""
  return lambda r: np.mean(
      [r.change(kind, r.final, n, before, sorted(r.layer_types))
       for n, before in NORM_INPUTS], axis=0)


def mixer_most(r: Run) -> np.ndarray:
  """The local mixer's gap raise − the largest of the other modules' (global mixer, MLP, the
  norms), final step: stage 2's "SWA raises the gap most"."""
  own = r.change("gap", r.final, "mixer", INPUT, r.local_layers)
  others = [r.change("gap", r.final, "mixer", INPUT, r.global_layers),
            r.change("gap", r.final, "mlp", "pre_mlp_norm", sorted(r.layer_types)),
            norm_change("gap")(r)]
  return own - np.max(others, axis=0)


def data_findings(runs: dict[int, Run]) -> list[Verdict]:
  """The probe's own recency: in the tokens, and carried by the embedding at init."""
  def data_gap(r):
    reps = r.at(0)
    return reps.mean("tokens", reps.near_i) - reps.mean("tokens", reps.far_i)
  return [
      verdict("the data: tokens repeat more at lag 1 than at the far lag", "P(t_i = t_{i−1}) − "
              "P(t_i = t_{i−L}) on the probe", "no difference", by_seed(runs), data_gap),
      verdict("the data: the embedding carries recency at init", "gap − shuffled-token gap at "
              "layer 0's input, step 0", "the same embedding on tokens shuffled within documents",
              by_seed(runs), lambda r: r.at(0).gap("0/input") - r.at(0).shuffled_gap("0/input"))]


def paired_paths(runs: list[RunReader]) -> None:
  """Every run's probe must be the same documents, or seeds and configs do not pair."""
  probes = {r.workdir: storage.read_text(r.layout.recency_probe) for r in runs
            if storage.exists(r.layout.recency_probe)}
  if len(set(probes.values())) > 1:
    raise ValueError("the runs were measured on different probes, so documents do not pair: "
                     + ", ".join(sorted(probes)))


def paired_by_seed(a: dict[int, Run], b: dict[int, Run], fn) -> list[float]:
  """Seed-level paired differences of a scalar summary (eval losses)."""
  return paired({s: fn(r) for s, r in a.items()}, {s: fn(r) for s, r in b.items()})


def with_null(estimate: two_level.Estimate, values, null: dict) -> two_level.Estimate | None:
  """A trained mean against the empirical init null of `draws` fresh initialisations: both
  spreads in the error, Welch–Satterthwaite degrees of freedom."""
  sd, k = null.get("sd"), null.get("draws")
  if estimate is None or not sd or not k or k < 2:
    return None
  a, b = estimate.se ** 2, sd ** 2 / k
  df = (a + b) ** 2 / (a ** 2 / estimate.df + b ** 2 / (k - 1))
  return dataclasses.replace(estimate, mean=estimate.mean - null["mean"], se=math.sqrt(a + b),
                             df=float(df))


def against_null(v: Verdict, null: dict) -> Verdict:
  """`v`'s trained values read against the empirical init null: its mean subtracted, its
  spread in the error (`with_null`)."""
  v.estimate = with_null(v.estimate, v.values, null)
  v.values = [x - null.get("mean", 0.0) for x in v.values]
  return v
