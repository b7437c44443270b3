"""PNG figures of a sweep (`compare.py`): one point or line per row (a configuration, seeds
averaged), with ±1 standard-error bars; the same object-API, Agg-canvas style as `plots.py`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from hybrid_nope.analysis.present import plots


def _series_style(swa_pos: str | None):
  return {"linestyle": "--" if swa_pos == "nope" else "-",
          "marker": "s" if swa_pos == "nope" else "o"}


ERROR_NOTE = ("error bars: ± 1 se, over seeds for rows of n seeds, of the measurement over "
              "probe documents for single runs where recorded")


def metrics_vs_window(runs: Sequence[dict], keys: Sequence[tuple[str, str]], path: str,
                      title: str) -> str:
  """One panel per (key, label): the rows' value ± `<key>_se` vs window, a line per series
  (size and position encoding inside SWA); rows without SWA layers are horizontal dotted
  lines with a ± se band."""
  fig = Figure(layout="constrained", figsize=(5.2 * len(keys), 4))
  axes = np.atleast_1d(fig.subplots(1, len(keys)))
  for ax, (key, label) in zip(axes, keys):
    series: dict[str, list[dict]] = {}
    for run in runs:
      series.setdefault(run["series"], []).append(run)
    for i, (name, members) in enumerate(sorted(series.items())):
      windowed = sorted((r for r in members if r["window"] is not None and r[key] is not None),
                        key=lambda r: r["window"])
      if windowed:
        ax.errorbar([r["window"] for r in windowed], [r[key] for r in windowed],
                    yerr=plots.nan_array([r.get(f"{key}_se") for r in windowed]), color=f"C{i}",
                    capsize=3, label=name, **_series_style(windowed[0]["swa_pos"]))
      for r in members:
        if r["window"] is None and r[key] is not None:
          ax.axhline(r[key], color="k", linestyle=":", label=f"{r['name']} ({name})")
          se = r.get(f"{key}_se")
          if se is not None:
            ax.axhspan(r[key] - se, r[key] + se, color="k", alpha=0.08, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("SWA window")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(f"{title}\n{ERROR_NOTE}", fontsize=10)
  return plots.save_figure(fig, path)


def metrics_vs_step(runs: Sequence[dict], path: str) -> str:
  """Run gap and logit gap ± se against training step, a line per row (from recency.jsonl;
  rows of n seeds: the per-step seed mean ± its standard error)."""
  fig = Figure(layout="constrained", figsize=(11, 4))
  axes = fig.subplots(1, 2)
  for ax, key, label in zip(axes, ("gap", "logit_gap"),
                            ("gap at global layers' input", "logit gap (head mean)")):
    for i, run in enumerate(runs):
      points = [(s, v[key], v.get(f"{key}_se")) for s, v in run["by_step"] if v[key] is not None]
      if points:
        steps, values, se = zip(*points)
        ax.errorbar(steps, values, yerr=plots.nan_array(se), color=f"C{i % 10}", label=run["name"],
                    marker=".", capsize=2,
                    **{k: v for k, v in _series_style(run["swa_pos"]).items() if k != "marker"})
    ax.axhline(0, color="0.7", linewidth=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(f"Recency during training (solid: RoPE in SWA, dashed: NoPE in SWA)\n"
               f"{ERROR_NOTE}", fontsize=10)
  return plots.save_figure(fig, path)


def extrapolation_vs_gap(runs: Sequence[dict], factors: Sequence[int], correlations: dict,
                         path: str) -> str:
  """Extrapolation loss ratio at each factor against the run gap, one point per row, with
  error bars where the row has standard errors."""
  fig = Figure(layout="constrained", figsize=(5.2 * len(factors), 4))
  axes = np.atleast_1d(fig.subplots(1, len(factors)))
  for ax, k in zip(axes, factors):
    for i, run in enumerate(runs):
      x, y = run.get("extrapolation_gap"), run.get("ratio", {}).get(k)
      if x is not None and y is not None:
        ax.errorbar([x], [y], xerr=plots.nan_array([run.get("extrapolation_gap_se")]),
                    yerr=plots.nan_array([run.get("ratio_se", {}).get(k)]), color=f"C{i % 10}",
                    label=run["name"], marker=_series_style(run["swa_pos"])["marker"],
                    linestyle="none", capsize=3)
    c = correlations.get(k, {}).get("gap", {})
    ax.set_title(f"{k}× training length: Spearman ρ {plots.fmt(c.get('spearman'), '+.2f')}, "
                 f"Pearson r {plots.fmt(c.get('pearson'), '+.2f')} (n={c.get('n', 0)})", fontsize=9)
    ax.axhline(1, color="0.7", linewidth=0.8)
    ax.set_xlabel("run gap at the training length")
    ax.set_ylabel("loss at positions ≥ T / at [T/2, T)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(f"Length extrapolation against recency\n{ERROR_NOTE}", fontsize=10)
  return plots.save_figure(fig, path)
