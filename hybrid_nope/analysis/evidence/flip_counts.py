"""Which heads' logit gaps swing in sign over training, counted per head, and the test of two
configs against each other with seeds as the clusters.

The claim: NoPE in a large window lets global heads' logit gaps swing in sign (more heads than
with RoPE in the same window). Per run, per global layer and head, the logit gap at the layers'
input (`pre_mixer_norm`) is a series over the recorded steps after init; a head *flips* when that
series changes sign significantly, as compare.sign_flips defines it for the head-layer mean: only
values with |gap| > SIGNIFICANT_SE · its SE count, a flip is such a value whose sign differs from
the last such one. A run's statistic is the fraction of its heads that flip at least once.

Heads of one run share an initialisation, data order and training, so they are not independent
evidence; the unit of replication is the seed. `compare_flips` therefore tests, paired by seed
(configs started from one seed share their initialisation), the per-seed difference d_s of the
two configs' fractions:
- an exact paired permutation (sign-flip) test: under H0 (the configs are exchangeable within a
  seed) each d_s is symmetric about 0, so all 2^n sign patterns are equally likely; p is the
  share of them whose mean is at least the observed one. It is exact at any n, but discrete: the
  smallest one-sided p is 1/2^n (1/32 with 5 seeds), two-sided 2/2^n.
- a two-level bootstrap (seeds with replacement, then heads within each drawn run) of the mean
  difference: its percentile interval, and the share of resampled differences ≤ 0 as a rough
  one-sided p. With few seeds a bootstrap over seeds is optimistic (its spread is the plug-in
  one); it describes the effect's size, the permutation p decides.
"""
from __future__ import annotations

import collections
import itertools
from typing import Mapping, Sequence

import numpy as np

from hybrid_nope.run.reader import RunReader

SIGNIFICANT_SE = 2  # compare.SIGNIFICANT_SE (compare imports JAX; a test pins the two equal).
MODULE = "pre_mixer_norm"  # The normalised input global attention reads (report.SUMMARY_MODULE).
CLAIM = "more heads swing in sign with NoPE in a large window than with RoPE"


def significant_flips(values, stderrs) -> np.ndarray:
  """values, stderrs: [steps, heads, ...] (None / NaN: not measured). Per head, how often its
  sign changes significantly: compare.sign_flips applied along the first axis."""
  v, se = np.array(values, dtype=float), np.array(stderrs, dtype=float)
  if v.shape != se.shape:
    raise ValueError(f"values {v.shape} but standard errors {se.shape}")
  shape = v.shape[1:]
  v, se = v.reshape(len(v), -1), se.reshape(len(se), -1)
  ok = np.isfinite(v) & np.isfinite(se) & (np.abs(v) > SIGNIFICANT_SE * se)
  sign = np.where(ok, np.sign(v), 0.0)
  steps = np.arange(len(v))[:, None]
  last_at = np.maximum.accumulate(np.where(ok, steps, -1), axis=0)  # latest significant ≤ t
  last = np.where(last_at >= 0, np.take_along_axis(sign, np.maximum(last_at, 0), axis=0), 0.0)
  before = np.vstack([np.zeros((1, v.shape[1])), last[:-1]])
  return (ok & (before != 0) & (sign != before)).sum(axis=0).reshape(shape)


def head_flips(layers: Mapping, after_init: bool = True) -> np.ndarray:
  """One run: flips per head, the global layers in order, heads within each. `layers`: layer ->
  {"steps": [...], "logit_gap": [[per head] per step], "logit_gap_stderr": same}; step 0 is left
  out by default, as compare.load_run leaves it out of the run's count."""
  counts = []
  for layer in sorted(layers):
    series = layers[layer]
    keep = [i for i, s in enumerate(series["steps"]) if s > 0 or not after_init]
    counts.append(significant_flips([series["logit_gap"][i] for i in keep],
                                    [series["logit_gap_stderr"][i] for i in keep]))
  return np.concatenate(counts) if counts else np.zeros(0, int)


def _by_seed(runs) -> dict:
  return dict(runs) if isinstance(runs, Mapping) else dict(enumerate(runs))


def _mean_se(x: np.ndarray) -> tuple[float, float | None]:
  return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else None


def sign_flip_p(differences: Sequence[float]) -> dict:
  """The exact paired permutation test of mean(d) over all 2^n sign patterns: one-sided (H1:
  mean > 0) and two-sided p, and the smallest p each can reach at this n."""
  d = np.asarray(differences, float)
  n = len(d)
  if n == 0:
    return {"p_one_sided": None, "p_two_sided": None, "min_p_one_sided": None,
            "min_p_two_sided": None, "patterns": 0, "zeros": 0, "at_floor": False}
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
  means, observed = signs @ d / n, d.mean()
  eps = 1e-12 * max(1.0, float(np.abs(d).max()))
  return {"p_one_sided": float(np.mean(means >= observed - eps)),
          "p_two_sided": float(np.mean(np.abs(means) >= abs(observed) - eps)),
          "min_p_one_sided": 1.0 / 2 ** n, "min_p_two_sided": min(1.0, 2.0 / 2 ** n),
          "patterns": int(2 ** n), "zeros": int(np.sum(d == 0)),
          # No sign pattern gives a larger mean: the data are as extreme as n seeds allow.
          "at_floor": bool(observed > 0 and observed >= means.max() - eps)}


def _two_level_bootstrap(flipped_a: np.ndarray, flipped_b: np.ndarray, resamples: int,
                         seed: int) -> np.ndarray:
  """Resampled mean differences: seeds with replacement (paired), then heads within each run."""
  rng = np.random.default_rng(seed)
  n = len(flipped_a)
  seeds = rng.integers(0, n, size=(resamples, n))
  def rates(flipped):
    heads = rng.integers(0, flipped.shape[1], size=(resamples, n, flipped.shape[1]))
    return flipped[seeds[..., None], heads].mean(axis=-1)
  return (rates(flipped_a) - rates(flipped_b)).mean(axis=-1)


def compare_flips(runs_a, runs_b, names: tuple[str, str] = ("a", "b"),
                  resamples: int = 4000, seed: int = 0) -> dict:
  """runs_a, runs_b: seed -> layers (or lists, index = seed), the claim being a > b. Returns the
  per-config fraction of heads that flip (mean ± SE over seeds, and per seed), the paired
  difference, its exact sign-flip p (`sign_flip_p`) and two-level bootstrap interval and p."""
  a, b = _by_seed(runs_a), _by_seed(runs_b)
  seeds = sorted(set(a) & set(b))
  if not seeds:
    raise ValueError("the two configs share no seed to pair")
  flipped = {name: np.stack([head_flips(runs[s]) > 0 for s in seeds])
             for name, runs in zip(names, (a, b))}
  rates = {name: f.mean(axis=1) for name, f in flipped.items()}
  d = rates[names[0]] - rates[names[1]]
  boot = _two_level_bootstrap(*(flipped[n].astype(float) for n in names), resamples, seed)
  out = {"names": list(names), "seeds": seeds, "heads": {n: int(f.shape[1])
                                                         for n, f in flipped.items()},
         "rate": {}, "flip_counts": {n: [head_flips(r[s]).tolist() for s in seeds]
                                     for n, r in zip(names, (a, b))}}
  for name in names:
    mean, se = _mean_se(rates[name])
    out["rate"][name] = {"mean": mean, "se": se, "per_seed": rates[name].tolist()}
  mean, se = _mean_se(d)
  out["difference"] = {"mean": mean, "se": se, "per_seed": d.tolist()}
  out["permutation"] = sign_flip_p(d)
  low, high = np.quantile(boot, [0.025, 0.975])
  out["bootstrap"] = {"low": float(low), "high": float(high), "resamples": resamples,
                      "p_one_sided": float((1 + np.sum(boot <= 0)) / (resamples + 1))}
  return out


def verdict_text(result: dict, alpha: float = 0.05, p: float | None = None) -> str:
  """The claim, the numbers and whether they support it at `alpha` on the one-sided exact
  permutation p (or `p`, e.g. its Holm-adjusted value in the page's family); says when the test
  is at the floor its number of seeds allows."""
  a, b = result["names"]
  perm, diff = result["permutation"], result["difference"]
  n = len(result["seeds"])
  p = perm["p_one_sided"] if p is None else p
  def rate(name):
    r = result["rate"][name]
    se = f" ± {r['se']:.2f}" if r["se"] is not None else ""
    return f"{name} {r['mean']:.2f}{se}"
  text = [f"Claim: {CLAIM} ({a} against {b}, the same window).",
          f"Fraction of global heads whose logit gap flips sign significantly (> {SIGNIFICANT_SE} "
          f"SE) over training, mean ± SE over {n} seeds: {rate(a)}, {rate(b)}; paired "
          f"difference {diff['mean']:+.2f}"
          + (f" ± {diff['se']:.2f}" if diff["se"] is not None else "")
          + f" (two-level bootstrap 95% interval [{result['bootstrap']['low']:+.2f}, "
            f"{result['bootstrap']['high']:+.2f}]).",
          f"Exact paired sign-flip test over seeds: p = {perm['p_one_sided']:.3g} one-sided, "
          f"{perm['p_two_sided']:.3g} two-sided"
          + (f"; {p:.3g} as adjusted" if p != perm["p_one_sided"] else "")
          + f" (the smallest it can give with {n} seeds: 1/{2 ** n} = "
            f"{perm['min_p_one_sided']:.3g} one-sided, {perm['min_p_two_sided']:.3g} "
            f"two-sided)."]
  floor = perm["min_p_one_sided"]
  if perm["at_floor"]:
    tie = (f" (here {2 ** perm['zeros']}/{2 ** n}: {perm['zeros']} seed(s) differ by exactly 0)"
           if perm["zeros"] else "")
    text.append(f"That floor binds: every seed that differs favours {a}, so no data from {n} "
                f"seeds could give a smaller p{tie}; only more seeds can.")
  if floor > alpha:
    text.append(f"With {n} seeds no outcome can reach p ≤ {alpha}: the claim cannot be "
                f"supported at this number of seeds.")
  supported = diff["mean"] > 0 and p <= alpha
  text.append(f"{'Supported' if supported else 'Not supported'} at α = {alpha}"
              + ("." if supported else
                 " (the difference is not positive)." if diff["mean"] <= 0 else
                 f" (p = {p:.3g} > {alpha})."))
  return " ".join(text)


def load_layers(run: RunReader, module: str = MODULE) -> dict:
  """One run's per-head logit-gap series at its global layers' `module`, from recency.jsonl:
  layer -> {"steps", "logit_gap", "logit_gap_stderr"} (the shape head_flips reads)."""
  from hybrid_nope.analysis.evidence import run_files  # Imports JAX: only when reading runs.
  by_layer: dict[int, dict[int, dict]] = collections.defaultdict(dict)
  for r in run_files.read_jsonl(run.layout.recency):
    if r["layer_type"] == "global" and r["module"] == module and "logit_gap" in r:
      by_layer[r["layer"]][r["step"]] = r
  out = {}
  for layer, by_step in sorted(by_layer.items()):
    steps = sorted(by_step)
    out[layer] = {"steps": steps, "logit_gap": [by_step[s]["logit_gap"] for s in steps],
                  "logit_gap_stderr": [by_step[s].get("logit_gap_stderr",
                                                      [None] * len(by_step[s]["logit_gap"]))
                                       for s in steps]}
  return out
