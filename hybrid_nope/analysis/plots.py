"""PNG figures of a run's analysis (`report.py`) and of a sweep (`compare.py`).

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global state); every function takes the plain dicts the JSON files hold and returns the path it
wrote.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from hybrid_nope.model.transformer import BOUNDARIES

BOUNDARY_LABELS = {"pre_mixer_norm": "norm", "mixer": "mixer", "residual_1": "+res",
                   "pre_mlp_norm": "norm", "mlp": "mlp", "residual_2": "+res"}
INIT_STYLE = dict(color="0.55", linestyle="--", linewidth=1.2)
DPI = 110


def _save(fig: Figure, path: str) -> str:
  fig.savefig(path, dpi=DPI, bbox_inches="tight")
  return path


def _grid(n: int, width: float = 3.4, height: float = 2.7, max_cols: int = 4):
  cols = min(n, max_cols)
  rows = math.ceil(n / cols)
  fig = Figure(layout="constrained", figsize=(width * cols, height * rows))
  axes = fig.subplots(rows, cols, squeeze=False).ravel()
  for ax in axes[n:]:
    ax.set_visible(False)
  return fig, axes[:n]


def _by(records: Sequence[dict], module: str) -> dict[int, dict]:
  return {r["layer"]: r for r in records if r["module"] == module}


def _log2_lag_axis(ax, lags):
  ax.set_xscale("log", base=2)
  ax.set_xlim(min(lags), max(lags))
  ax.grid(True, alpha=0.3)


def cosine_profiles(analysis: dict, path: str, module: str = "residual_2") -> str:
  """f(d) per layer at `module` (default: the block's output), init dashed, this step solid."""
  now, init = _by(analysis["records"], module), _by(analysis["init_records"], module)
  fig, axes = _grid(len(now))
  for ax, layer in zip(axes, sorted(now)):
    r = now[layer]
    ax.plot(r["lags"], init[layer]["profile"], label="init", **INIT_STYLE)
    ax.plot(r["lags"], r["profile"], color="C0" if r["layer_type"] == "swa" else "C3",
            marker=".", label=f"step {analysis['step']}")
    ax.axvline(analysis["far_lag"], color="0.8", linewidth=0.8)
    _log2_lag_axis(ax, r["lags"])
    ax.set_title(f"layer {layer} ({r['layer_type']}): gap {init[layer]['gap']:.3f} → "
                 f"{r['gap']:.3f}", fontsize=9)
    ax.set_xlabel("lag d")
    ax.set_ylabel(r"$f(d)=\cos(x_i, x_{i-d})$")
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Cosine profile of each block's output ({module}), seq_len "
               f"{analysis['seq_len']}; grey line: far lag L={analysis['far_lag']}")
  return _save(fig, path)


def floor_gap_by_boundary(analysis: dict, path: str) -> str:
  """Floor and gap at every module boundary, in depth order, init vs this step."""
  def series(records, key):
    order = {(r["layer"], BOUNDARIES.index(r["module"])): r[key] for r in records}
    return [order[k] for k in sorted(order)]

  records = analysis["records"]
  num_layers = 1 + max(r["layer"] for r in records)
  x = np.arange(num_layers * len(BOUNDARIES))
  fig = Figure(layout="constrained", figsize=(min(16, max(8, 0.32 * len(x))), 6))
  axes = fig.subplots(2, 1, sharex=True)
  kinds = {r["layer"]: r["layer_type"] for r in records}
  for ax, key in zip(axes, ("floor", "gap")):
    ax.plot(x, series(analysis["init_records"], key), marker=".", label="init", **INIT_STYLE)
    ax.plot(x, series(records, key), marker="o", markersize=3, color="C0",
            label=f"step {analysis['step']}")
    for layer in range(num_layers):
      if kinds[layer] == "global":
        ax.axvspan(layer * len(BOUNDARIES) - 0.5, (layer + 1) * len(BOUNDARIES) - 0.5,
                   color="C3", alpha=0.07, linewidth=0)
    ax.set_ylabel(f"{key} (L={analysis['far_lag']})")
    ax.grid(True, alpha=0.3)
    if key == "floor" and num_layers <= 16:
      for layer in range(num_layers):
        ax.text((layer + 0.5) * len(BOUNDARIES) - 0.5, 1.0, f"layer {layer} ({kinds[layer]})",
                transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
  axes[0].legend(fontsize=8)
  if len(x) <= 48:
    axes[1].set_xticks(x, [BOUNDARY_LABELS[b] for _ in range(num_layers) for b in BOUNDARIES],
                       rotation=90, fontsize=7)
  else:
    axes[1].set_xticks(x[::len(BOUNDARIES)], [f"L{l}" for l in range(num_layers)], fontsize=7)
  axes[1].set_xlabel("module boundary, by depth (shaded: global layers; each block is "
                     "norm, mixer, +res, norm, mlp, +res)")
  fig.suptitle(f"Floor f(L) and gap f(1) − f(L) through the network, seq_len "
               f"{analysis['seq_len']}")
  return _save(fig, path)


def _readout(records):
  return {r["layer"]: r for r in records if r["module"] == "pre_mixer_norm" and "logit_gap" in r}


def logit_profiles(analysis: dict, path: str) -> str:
  """ℓ_h(d) per global NoPE layer, one line per head, and the init head mean dashed."""
  now, init = _readout(analysis["records"]), _readout(analysis["init_records"])
  fig, axes = _grid(len(now))
  for ax, layer in zip(axes, sorted(now)):
    r = now[layer]
    logit = np.asarray(r["logit_profile"])
    for h, row in enumerate(logit):
      ax.plot(r["lags"], row, color=f"C{h % 10}", linewidth=1, label=f"head {h}")
    ax.plot(r["lags"], np.mean(init[layer]["logit_profile"], 0), label="init (head mean)",
            **INIT_STYLE)
    ax.axhline(0, color="0.7", linewidth=0.8)
    _log2_lag_axis(ax, r["lags"])
    ax.set_title(f"layer {layer}: logit gap {np.mean(r['logit_gap']):+.3f} (head mean)",
                 fontsize=9)
    ax.set_xlabel("lag d")
    ax.set_ylabel(r"$\ell(d)$ = mean $q_i \cdot k_{i-d}/\sqrt{H}$")
  axes[0].legend(fontsize=7, ncol=2)
  fig.suptitle(f"Logit profile of each global NoPE layer, step {analysis['step']}, seq_len "
               f"{analysis['seq_len']}")
  return _save(fig, path)


def logit_gap_alignment(analysis: dict, path: str) -> str:
  """Heat maps [global layer x head] of the logit gap and the alignment, init vs this step."""
  now, init = _readout(analysis["records"]), _readout(analysis["init_records"])
  layers = sorted(now)
  fig = Figure(layout="constrained", figsize=(10, 1.0 + 2 * max(1.6, 0.4 * len(layers))))
  axes = fig.subplots(2, 2)
  for row, key in enumerate(("logit_gap", "alignment")):
    values = {name: np.array([recs[l][key] for l in layers])
              for name, recs in (("init", init), (f"step {analysis['step']}", now))}
    scale = max(float(np.max(np.abs(v))) for v in values.values()) or 1.0
    for col, (name, v) in enumerate(values.items()):
      ax = axes[row, col]
      im = ax.imshow(v, cmap="RdBu_r", vmin=-scale, vmax=scale, aspect="auto")
      ax.set_yticks(range(len(layers)), [f"layer {l}" for l in layers], fontsize=8)
      ax.set_xticks(range(v.shape[1]), range(v.shape[1]), fontsize=8)
      ax.set_xlabel("head")
      ax.set_title(f"{key.replace('_', ' ')}, {name} (mean {v.mean():+.3f})", fontsize=9)
      if v.size <= 64:
        for (i, j), value in np.ndenumerate(v):
          ax.text(j, i, f"{value:+.2g}", ha="center", va="center", fontsize=7)
      fig.colorbar(im, ax=ax, fraction=0.046)
  fig.suptitle("Logit gap ℓ(1) − ℓ(L) and alignment cos(M_h, G_X(1) − G_X(L)) per global NoPE "
               f"layer and head, seq_len {analysis['seq_len']}")
  return _save(fig, path)


def _bucket_x(ev: dict) -> np.ndarray:
  return (np.arange(len(ev["loss_by_position"])) + 0.5) * ev["bucket_size"]


def _plot_loss(ax, ev, **kw):
  y = np.array([np.nan if l is None else l for l in ev["loss_by_position"]], float)
  ax.plot(_bucket_x(ev), y, marker=".", **kw)


def loss_by_position(analysis: dict, path: str) -> str:
  ev = analysis["eval"]
  fig = Figure(layout="constrained", figsize=(7, 4))
  ax = fig.subplots()
  _plot_loss(ax, ev, color="C0")
  ax.axvline(analysis["train_seq_len"], color="0.6", linestyle=":", label="training length")
  ax.set_xlabel(f"context position (bucket centre, {ev['bucket_size']} positions per bucket)")
  ax.set_ylabel("eval loss (nats/token)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(f"Eval loss by context position: step {analysis['step']}, seq_len "
               f"{ev['seq_len']}, mean {ev['loss']:.4f}", fontsize=10)
  return _save(fig, path)


def run_figures(analysis: dict, out_dir: str, suffix: str = "") -> list[str]:
  """Every figure of one analysis; the logit figures only where there are global NoPE layers."""
  files = [cosine_profiles(analysis, os.path.join(out_dir, f"profiles{suffix}.png")),
           floor_gap_by_boundary(analysis, os.path.join(out_dir, f"floor_gap{suffix}.png"))]
  if _readout(analysis["records"]):
    files += [logit_profiles(analysis, os.path.join(out_dir, f"logit_profiles{suffix}.png")),
              logit_gap_alignment(analysis,
                                  os.path.join(out_dir, f"logit_gap_alignment{suffix}.png"))]
  files.append(loss_by_position(analysis, os.path.join(out_dir, f"loss_by_position{suffix}.png")))
  return files


def _fmt(value, spec=".3f"):
  return "—" if value is None else format(value, spec)


def extrapolation(ext: dict, path: str) -> str:
  """Loss by context position at each analysed length, with ratio and gap per length."""
  fig = Figure(layout="constrained", figsize=(8, 4.5))
  ax = fig.subplots()
  for i, row in enumerate(ext["lengths"]):
    _plot_loss(ax, row, color=f"C{i}", markersize=3,
               label=f"{row['factor']}× ({row['seq_len']}): ratio {_fmt(row['ratio'])}, "
                     f"gap {_fmt(row['gap'])}, logit gap {_fmt(row['logit_gap'], '+.3f')}")
  ax.axvline(ext["train_seq_len"], color="0.5", linestyle=":", label="training length")
  ax.set_xlabel("context position (bucket centre)")
  ax.set_ylabel("eval loss (nats/token)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  ax.axvline(ext["train_seq_len"] / 2, color="0.8", linestyle=":")
  ax.set_title(f"Length extrapolation, step {ext['step']}: ratio = loss at context positions "
               f"≥ T / loss at [T/2, T), T = {ext['train_seq_len']}", fontsize=10)
  return _save(fig, path)


# ---- sweep figures (compare.py) ---------------------------------------------------------------

def _series_style(swa_pos: str | None):
  return {"linestyle": "--" if swa_pos == "nope" else "-",
          "marker": "s" if swa_pos == "nope" else "o"}


def metrics_vs_window(runs: Sequence[dict], keys: Sequence[tuple[str, str]], path: str,
                      title: str) -> str:
  """One panel per (key, label): the runs' value vs window, a line per series (size and
  position encoding inside SWA); runs without SWA layers are horizontal dotted lines."""
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
        ax.plot([r["window"] for r in windowed], [r[key] for r in windowed], color=f"C{i}",
                label=name, **_series_style(windowed[0]["swa_pos"]))
      for r in members:
        if r["window"] is None and r[key] is not None:
          ax.axhline(r[key], color="k", linestyle=":", label=f"{r['name']} ({name})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("SWA window")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(title)
  return _save(fig, path)


def metrics_vs_step(runs: Sequence[dict], path: str) -> str:
  """Run gap and logit gap against training step, a line per run (from recency.jsonl)."""
  fig = Figure(layout="constrained", figsize=(11, 4))
  axes = fig.subplots(1, 2)
  for ax, key, label in zip(axes, ("gap", "logit_gap"),
                            ("gap at global layers' input", "logit gap (head mean)")):
    for i, run in enumerate(runs):
      points = [(s, v[key]) for s, v in run["by_step"] if v[key] is not None]
      if points:
        ax.plot(*zip(*points), color=f"C{i % 10}", label=run["name"], marker=".",
                **{k: v for k, v in _series_style(run["swa_pos"]).items() if k != "marker"})
    ax.axhline(0, color="0.7", linewidth=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Recency during training (solid: RoPE in SWA, dashed: NoPE in SWA)")
  return _save(fig, path)


def extrapolation_vs_gap(runs: Sequence[dict], factors: Sequence[int], correlations: dict,
                         path: str) -> str:
  """Extrapolation loss ratio at each factor against the run gap, one point per run."""
  fig = Figure(layout="constrained", figsize=(5.2 * len(factors), 4))
  axes = np.atleast_1d(fig.subplots(1, len(factors)))
  for ax, k in zip(axes, factors):
    for i, run in enumerate(runs):
      x, y = run.get("extrapolation_gap"), run.get("ratio", {}).get(k)
      if x is not None and y is not None:
        ax.scatter([x], [y], color=f"C{i % 10}", label=run["name"],
                   marker=_series_style(run["swa_pos"])["marker"])
    c = correlations.get(k, {}).get("gap", {})
    ax.set_title(f"{k}× training length: Spearman ρ {_fmt(c.get('spearman'), '+.2f')}, "
                 f"Pearson r {_fmt(c.get('pearson'), '+.2f')} (n={c.get('n', 0)})", fontsize=9)
    ax.axhline(1, color="0.7", linewidth=0.8)
    ax.set_xlabel("run gap at the training length")
    ax.set_ylabel("loss at positions ≥ T / at [T/2, T)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Length extrapolation against recency")
  return _save(fig, path)
