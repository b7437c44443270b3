"""PNG figures of a run's analysis (`report.py`); a sweep's are in `sweep_plots.py`.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global state); every function takes the plain dicts the JSON files hold and returns the path it
wrote.
"""
from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from hybrid_nope.run import storage
from hybrid_nope.analysis.measure.records import DATA_LAYER
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY

BOUNDARY_LABELS = {"input": "in", "pre_mixer_norm": "norm", "mixer": "mixer",
                   "residual_1": "+res", "pre_mlp_norm": "norm", "mlp": "mlp",
                   "residual_2": "+res", FINAL_BOUNDARY: "final norm"}
INIT_STYLE = dict(color="0.55", linestyle="--", linewidth=1.2)
DATA_STYLE = dict(color="k", linestyle=":", linewidth=0.9)
DATA_LABEL = "data: P(t_i = t_{i-d})"
NOISE_SE = 2  # Bands and significance marks are at ± this many standard errors.
DPI = 110
# Heat maps of signed values; a cell with no value (NaN) shows HEATMAP_BAD, hatched.
HEATMAP_BAD = "0.82"
HEATMAP_CMAP = colormaps["RdBu_r"].with_extremes(bad=HEATMAP_BAD)


def save_figure(fig: Figure, path: str) -> str:
  """Writes the PNG to a local path or a URL (hybrid_nope.run.storage)."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
  storage.write_bytes(path, buffer.getvalue())
  return path


def panel_grid(n: int, width: float = 3.4, height: float = 2.7, max_cols: int = 4):
  """(figure, n axes): panels of width x height inches, at most max_cols to a row."""
  cols = min(n, max_cols)
  rows = math.ceil(n / cols)
  fig = Figure(layout="constrained", figsize=(width * cols, height * rows))
  axes = fig.subplots(rows, cols, squeeze=False).ravel()
  for ax in axes[n:]:
    ax.set_visible(False)
  return fig, axes[:n]


def records_by_layer(records: Sequence[dict], module: str) -> dict[int, dict]:
  """Layer -> record at `module`; the data control (layer DATA_LAYER) is no layer."""
  return {r["layer"]: r for r in records if r["module"] == module and r["layer"] != DATA_LAYER}


def _data(analysis: dict) -> dict | None:
  """The data control record P(t_i = t_{i-d}) of the analysis (the same probe at init and at
  this step), None where it was not recorded."""
  for key in ("records", "init_records"):
    found = [r for r in analysis[key] if r["layer"] == DATA_LAYER]
    if found:
      return found[0]
  return None


def nan_array(values) -> np.ndarray:
  """JSON lists with None for unmeasured entries (profiles, standard errors, error bars) as
  float arrays with NaN, which matplotlib leaves undrawn."""
  return np.array([np.nan if v is None else v for v in values], float)


def _se_at(r: dict, lag: int) -> float:
  """The profile's standard error at `lag`, NaN where not recorded (no band is drawn)."""
  se = r.get("stderr")
  value = None if se is None else se[r["lags"].index(lag)]
  return float("nan") if value is None else float(value)


def log2_lag_axis(ax, lags):
  """A log2 x axis spanning `lags`, with a light grid."""
  ax.set_xscale("log", base=2)
  ax.set_xlim(min(lags), max(lags))
  ax.grid(True, alpha=0.3)


def cosine_profiles(analysis: dict, path: str, module: str = "residual_2") -> str:
  """f(d) per layer at `module` (default: the block's output): init dashed, this step solid
  with a band of ± NOISE_SE standard errors, the data control P(t_i = t_{i-d}) dotted."""
  now = records_by_layer(analysis["records"], module)
  init = records_by_layer(analysis["init_records"], module)
  data = _data(analysis)
  fig, axes = panel_grid(len(now))
  for ax, layer in zip(axes, sorted(now)):
    r = now[layer]
    color = "C3" if r["layer_type"] == "global" else "C0"  # Local mixers (swa, linear) blue.
    profile = nan_array(r["profile"])
    ax.plot(r["lags"], nan_array(init[layer]["profile"]), label="init", **INIT_STYLE)
    ax.plot(r["lags"], profile, color=color, marker=".", label=f"step {analysis['step']}")
    if "stderr" in r:
      band = NOISE_SE * nan_array(r["stderr"])
      ax.fill_between(r["lags"], profile - band, profile + band, color=color, alpha=0.2,
                      linewidth=0, label=f"± {NOISE_SE} se")
    if data is not None:
      ax.plot(data["lags"], nan_array(data["profile"]), label=DATA_LABEL, **DATA_STYLE)
    ax.axvline(analysis["far_lag"], color="0.8", linewidth=0.8)
    log2_lag_axis(ax, r["lags"])
    ax.set_title(f"layer {layer} ({r['layer_type']}): gap {init[layer]['gap']:.3f} → "
                 f"{r['gap']:.3f}", fontsize=9)
    ax.set_xlabel("lag d")
    ax.set_ylabel(r"$f(d)=\cos(x_i, x_{i-d})$")
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Cosine profile of each block's output ({module}), seq_len "
               f"{analysis['seq_len']}; grey line: far lag L={analysis['far_lag']}; shaded: "
               f"± {NOISE_SE} standard errors over probe documents")
  return save_figure(fig, path)


def depth_order(r: dict) -> int:
  """x position of a record in depth order: the block boundaries of each layer in turn, the
  final norm after the last layer's residual_2."""
  if r["module"] == FINAL_BOUNDARY:
    return (r["layer"] + 1) * len(BOUNDARIES)
  return r["layer"] * len(BOUNDARIES) + BOUNDARIES.index(r["module"])


def floor_gap_se(r: dict, key: str, far_lag: int) -> float:
  """Standard error of the floor f(L), or of the gap f(1) − f(L): the record's paired
  per-document `gap_stderr` (records older than it: the two errors added in quadrature)."""
  if key == "floor":
    return _se_at(r, far_lag)
  if "gap_stderr" in r:
    return float(r["gap_stderr"])
  return float(np.hypot(_se_at(r, 1), _se_at(r, far_lag)))


def floor_gap_by_boundary(analysis: dict, path: str) -> str:
  """Floor and gap at every module boundary in depth order (the final norm last), init vs this
  step ± NOISE_SE standard errors, and the data control's floor and gap as a dotted line."""
  def layered(records):
    return sorted((r for r in records if r["layer"] != DATA_LAYER), key=depth_order)

  records, init = layered(analysis["records"]), layered(analysis["init_records"])
  data = _data(analysis)
  num_layers = 1 + max(r["layer"] for r in records)
  positions = [depth_order(r) for r in records]
  labels = {depth_order(r): BOUNDARY_LABELS[r["module"]] for r in records}
  fig = Figure(layout="constrained", figsize=(min(16, max(8, 0.32 * len(positions))), 6))
  axes = fig.subplots(2, 1, sharex=True)
  kinds = {r["layer"]: r["layer_type"] for r in records}
  for ax, key in zip(axes, ("floor", "gap")):
    ax.plot([depth_order(r) for r in init], [r[key] for r in init], marker=".", label="init",
            **INIT_STYLE)
    values = np.array([r[key] for r in records], float)
    band = NOISE_SE * np.array([floor_gap_se(r, key, analysis["far_lag"]) for r in records])
    ax.plot(positions, values, marker="o", markersize=3, color="C0",
            label=f"step {analysis['step']}")
    ax.fill_between(positions, values - band, values + band, color="C0", alpha=0.2,
                    linewidth=0, label=f"± {NOISE_SE} se")
    if data is not None:
      ax.axhline(data[key], label=DATA_LABEL, **DATA_STYLE)
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
  if len(positions) <= 48:
    axes[1].set_xticks(positions, [labels[x] for x in positions], rotation=90, fontsize=7)
  else:
    axes[1].set_xticks([l * len(BOUNDARIES) for l in range(num_layers)],
                       [f"L{l}" for l in range(num_layers)], fontsize=7)
  block = ", ".join(BOUNDARY_LABELS[b] for b in BOUNDARIES)
  axes[1].set_xlabel(f"module boundary, by depth (shaded: global layers; each block is {block}; "
                     f"then the {BOUNDARY_LABELS[FINAL_BOUNDARY]})")
  fig.suptitle(f"Floor f(L) and gap f(1) − f(L) through the network, seq_len "
               f"{analysis['seq_len']}; band: ± {NOISE_SE} standard errors over probe documents")
  return save_figure(fig, path)


def readout_by_layer(records):
  """Layer -> the record that carries the logit read-out (global NoPE layers, pre_mixer_norm)."""
  return {r["layer"]: r for r in records if r["module"] == "pre_mixer_norm" and "logit_gap" in r
          and r["layer"] != DATA_LAYER}


def head_mean_se(r: dict) -> float | None:
  """Standard error of the head-mean logit gap: the mean of the per-head standard errors (the
  bound for fully correlated heads, as `report.summarize`), None where not recorded."""
  se = r.get("logit_gap_stderr")
  return None if se is None else float(np.mean(nan_array(se)))


def logit_profiles(analysis: dict, path: str) -> str:
  """ℓ_h(d) per global NoPE layer, one thin line per head, the head mean thick with the noise
  band ℓ(L) ± NOISE_SE standard errors of the logit gap (points of the mean profile outside
  it differ from the far lag by more than noise), and the init head mean dashed."""
  now, init = readout_by_layer(analysis["records"]), readout_by_layer(analysis["init_records"])
  fig, axes = panel_grid(len(now))
  for ax, layer in zip(axes, sorted(now)):
    r = now[layer]
    logit = nan_rows(r["logit_profile"])
    for h, row in enumerate(logit):
      ax.plot(r["lags"], row, color=f"C{h % 10}", linewidth=0.7, alpha=0.8, label=f"head {h}")
    mean = logit.mean(0)
    ax.plot(r["lags"], mean, color="k", linewidth=1.8, label="head mean")
    se = head_mean_se(r)
    far = mean[r["lags"].index(analysis["far_lag"])]
    if se is not None:
      ax.axhspan(far - NOISE_SE * se, far + NOISE_SE * se, color="0.5", alpha=0.2, linewidth=0,
                 label=f"ℓ(L) ± {NOISE_SE} se")
    ax.plot(r["lags"], nan_rows(init[layer]["logit_profile"]).mean(0),
            label="init (head mean)", **INIT_STYLE)
    ax.axhline(0, color="0.7", linewidth=0.8)
    log2_lag_axis(ax, r["lags"])
    se_text = "" if se is None else f" ± {se:.3f}"
    ax.set_title(f"layer {layer}: logit gap {np.mean(r['logit_gap']):+.3f}{se_text} "
                 f"(head mean)", fontsize=9)
    ax.set_xlabel("lag d")
    ax.set_ylabel(r"$\ell(d)$ = mean $q_i \cdot k_{i-d}/\sqrt{H}$")
  axes[0].legend(fontsize=7, ncol=2)
  fig.suptitle(f"Logit profile of each global NoPE layer, step {analysis['step']}, seq_len "
               f"{analysis['seq_len']}; shaded: head-mean ℓ(L) ± {NOISE_SE} standard errors "
               f"of the logit gap")
  return save_figure(fig, path)


def nan_rows(rows) -> np.ndarray:
  """nan_array of each row: a [rows, lags] float array (per-head logit profiles)."""
  return np.array([nan_array(row) for row in rows], float)


def ink(rgba) -> str:
  """"k" or "w", whichever contrasts more with the colour `rgba` (WCAG 2 contrast ratio of
  relative luminances): at least 4.58:1 against any colour, so a hatch or a number in it
  reads on every colormap value."""
  linear = np.where(np.asarray(rgba[:3]) <= 0.04045, np.asarray(rgba[:3]) / 12.92,
                    ((np.asarray(rgba[:3]) + 0.055) / 1.055) ** 2.4)
  luminance = float(linear @ [0.2126, 0.7152, 0.0722])
  return "k" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "w"


def hatch_cells(ax, image, weak: np.ndarray, labels: bool = False) -> None:
  """Hatches the `weak` cells of the heat map `image` (an AxesImage of [rows, cols] values) in
  the ink of each cell's own colour (a NaN cell's is the colormap's bad colour, HEATMAP_BAD);
  with `labels`, writes each value in the same ink on a patch of the cell's colour, so the
  hatching never runs through a number."""
  values = np.ma.getdata(image.get_array())
  for (i, j), value in np.ndenumerate(values):
    colour = image.cmap.get_bad() if np.isnan(value) else image.cmap(image.norm(value))
    if weak[i, j]:
      ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                             edgecolor=ink(colour), linewidth=0))
    if labels:
      ax.text(j, i, "—" if np.isnan(value) else f"{value:+.2g}", ha="center", va="center",
              fontsize=7, color=ink(colour),
              bbox=dict(facecolor=colour, edgecolor="none", pad=1.0))


def _noise(records: dict, layers, key: str) -> np.ndarray | None:
  """[layer, head] standard deviation of `key` under noise: the logit gap's standard error,
  the alignment's null (that of a random M); None where a record lacks it."""
  source = {"logit_gap": "logit_gap_stderr", "alignment": "alignment_null"}[key]
  if any(source not in records[l] for l in layers):
    return None
  return np.array([nan_array(records[l][source]) for l in layers])


def logit_gap_alignment(analysis: dict, path: str) -> str:
  """Heat maps [global layer x head] of the logit gap and the alignment, init vs this step;
  hatched cells are within NOISE_SE noise standard deviations of zero (logit gap: its standard
  error; alignment: the null of a random M), i.e. not significant."""
  now, init = readout_by_layer(analysis["records"]), readout_by_layer(analysis["init_records"])
  layers = sorted(now)
  fig = Figure(layout="constrained", figsize=(10, 1.0 + 2 * max(1.6, 0.4 * len(layers))))
  axes = fig.subplots(2, 2)
  for row, key in enumerate(("logit_gap", "alignment")):
    values = {name: (np.array([nan_array(recs[l][key]) for l in layers]), _noise(recs, layers, key))
              for name, recs in (("init", init), (f"step {analysis['step']}", now))}
    scale = max(float(np.nanmax(np.abs(v))) for v, _ in values.values()) or 1.0
    for col, (name, (v, noise)) in enumerate(values.items()):
      ax = axes[row, col]
      im = ax.imshow(v, cmap=HEATMAP_CMAP, vmin=-scale, vmax=scale, aspect="auto")
      ax.set_yticks(range(len(layers)), [f"layer {l}" for l in layers], fontsize=8)
      ax.set_xticks(range(v.shape[1]), range(v.shape[1]), fontsize=8)
      ax.set_xlabel("head")
      # A NaN value is weak too: nothing was measured there to tell from noise.
      weak = np.isnan(v) if noise is None else ~(np.abs(v) > NOISE_SE * noise)
      hatch_cells(ax, im, weak, labels=v.size <= 64)
      ax.set_title(f"{key.replace('_', ' ')}, {name} (mean {np.nanmean(v):+.3f}); "
                   f"{_noise_text(key, noise)}", fontsize=8)
      fig.colorbar(im, ax=ax, fraction=0.046)
  fig.suptitle("Logit gap ℓ(1) − ℓ(L) and alignment cos(M_h, G_X(1) − G_X(L)) per global NoPE "
               f"layer and head, seq_len {analysis['seq_len']}; hatched: within "
               f"{NOISE_SE} noise sd of 0 (grey: no value)")
  return save_figure(fig, path)


def _noise_text(key: str, noise: np.ndarray | None) -> str:
  if noise is None:
    return "noise not recorded"
  if key == "alignment":
    return f"null ±{NOISE_SE * float(np.nanmax(noise)):.3g}"
  return f"n.s.: |gap| ≤ {NOISE_SE} se"


def _bucket_x(ev: dict) -> np.ndarray:
  return (np.arange(len(ev["loss_by_position"])) + 0.5) * ev["bucket_size"]


def plot_position_loss(ax, ev, **kw):
  """Eval loss by context position (bucket centres) on `ax`; unmeasured buckets undrawn."""
  y = np.array([np.nan if l is None else l for l in ev["loss_by_position"]], float)
  ax.plot(_bucket_x(ev), y, marker=".", **kw)


def loss_by_position(analysis: dict, path: str) -> str:
  ev = analysis["eval"]
  fig = Figure(layout="constrained", figsize=(7, 4))
  ax = fig.subplots()
  plot_position_loss(ax, ev, color="C0")
  ax.axvline(analysis["train_seq_len"], color="0.6", linestyle=":", label="training length")
  ax.set_xlabel(f"context position (bucket centre, {ev['bucket_size']} positions per bucket)")
  ax.set_ylabel("eval loss (nats/token)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(f"Eval loss by context position: step {analysis['step']}, seq_len "
               f"{ev['seq_len']}, mean {ev['loss']:.4f}", fontsize=10)
  return save_figure(fig, path)


def run_figures(analysis: dict, out_dir: str, suffix: str = "") -> list[str]:
  """Every figure of one analysis; the logit figures only where there are global NoPE layers."""
  files = [cosine_profiles(analysis, storage.join(out_dir, f"profiles{suffix}.png")),
           floor_gap_by_boundary(analysis, storage.join(out_dir, f"floor_gap{suffix}.png"))]
  if readout_by_layer(analysis["records"]):
    files += [logit_profiles(analysis, storage.join(out_dir, f"logit_profiles{suffix}.png")),
              logit_gap_alignment(analysis,
                                  storage.join(out_dir, f"logit_gap_alignment{suffix}.png"))]
  files.append(loss_by_position(analysis, storage.join(out_dir, f"loss_by_position{suffix}.png")))
  return files


def fmt(value, spec=".3f"):
  return "—" if value is None else format(value, spec)


def extrapolation(ext: dict, path: str) -> str:
  """Loss by context position at each analysed length, with ratio and gap per length."""
  fig = Figure(layout="constrained", figsize=(8, 4.5))
  ax = fig.subplots()
  for i, row in enumerate(ext["lengths"]):
    label = (f"{row['factor']}× ({row['seq_len']}): ratio {fmt(row['ratio'])}, "
             f"gap {fmt(row.get('gap'))}, logit gap {fmt(row.get('logit_gap'), '+.3f')}")
    plot_position_loss(ax, row, color=f"C{i}", markersize=3, label=label)
  ax.axvline(ext["train_seq_len"], color="0.5", linestyle=":", label="training length")
  ax.set_xlabel("context position (bucket centre)")
  ax.set_ylabel("eval loss (nats/token)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  ax.axvline(ext["train_seq_len"] / 2, color="0.8", linestyle=":")
  ax.set_title(f"Length extrapolation, step {ext['step']}: ratio = loss at context positions "
               f"≥ T / loss at [T/2, T), T = {ext['train_seq_len']}", fontsize=10)
  return save_figure(fig, path)
