"""PNG figures of one recency measurement, drawn host-side while training (the recency hook
passes them to the writer: TensorBoard images, W&B).

`figures(records, config)` takes the records the hook wrote at one step and returns
name -> PNG bytes:
  recency/gap_heatmap, recency/floor_heatmap   layer x module (BOUNDARIES, then final_norm)
  recency/global_input_profiles                f(d) at each global layer's input, with the
                                               closed-form laws of the mixers before it
  recency/logit_profiles                       ℓ(d) per global NoPE layer (read-out records)
The last two only where the model has such layers. The checkpoint analysis's figures
(`plots.py`, init against a step) share their helpers and styles.
"""
from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from hybrid_nope.analysis.present import plots
from hybrid_nope.analysis.measure import recency, theory
from hybrid_nope.analysis.measure.records import DATA_LAYER
from hybrid_nope.analysis.present.plots import NOISE_SE, nan_array
from hybrid_nope.model.pattern import window_of
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY

DPI = 100  # Grid figures (plots.panel_grid) are 340 x 270 pixels a panel at this DPI.
MODULES = BOUNDARIES + (FINAL_BOUNDARY,)
HEATMAP_WIDTH, HEATMAP_BASE, HEATMAP_ROW = 800, 130, 24  # Pixels: width, height = base + rows.
CMAPS = {"gap": "RdBu_r", "floor": "viridis"}  # The gap's sign matters: diverging about 0.
DEFINITIONS = {"gap": "f(1) − f(L)", "floor": "f(L)"}
LAW_STYLES = {"swa": dict(color="C0", linestyle="--"), "global": dict(color="C2", linestyle="-."),
              "linear": dict(color="C4", linestyle="--"), "delta": dict(color="C5", linestyle=":")}


def png(fig: Figure) -> bytes:
  # No bbox_inches="tight": the image keeps the figure's size, so its pixels are known.
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI)
  return buffer.getvalue()


def _layered(records) -> list[dict]:
  return [r for r in records if r["layer"] != DATA_LAYER]


def _data_control(records) -> dict | None:
  """The data record P(t_i = t_{i-d}) where this measurement has it (the hook writes it at
  step 0 only)."""
  return next((r for r in records if r["layer"] == DATA_LAYER), None)


def heatmap_pixels(num_layers: int) -> tuple[int, int]:
  """(height, width) of a heat map's PNG."""
  return HEATMAP_BASE + HEATMAP_ROW * num_layers, HEATMAP_WIDTH


def heatmap_figure(records, key: str) -> Figure:
  """`key` ("gap" or "floor") per layer (rows, layer 0 on top) and module (columns, depth
  order); hatched: within NOISE_SE standard errors of 0; blank: not measured (final_norm
  exists on the last layer only)."""
  layered = _layered(records)
  layers = sorted({r["layer"] for r in layered})
  kinds = {r["layer"]: r["layer_type"] for r in layered}
  values, se = (np.full((len(layers), len(MODULES)), np.nan) for _ in range(2))
  for r in layered:
    cell = layers.index(r["layer"]), MODULES.index(r["module"])
    values[cell] = np.nan if r[key] is None else r[key]
    se[cell] = plots.floor_gap_se(r, key, r["far_lag"])
  height, width = heatmap_pixels(len(layers))
  fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
  ax = fig.subplots()
  if key == "gap":
    scale = float(np.nanmax(np.abs(values))) or 1.0
    low, high = -scale, scale
  else:
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    low, high = (low - 0.5, high + 0.5) if low == high else (low, high)
  im = ax.imshow(values, cmap=CMAPS[key], vmin=low, vmax=high, aspect="auto",
                 interpolation="nearest")
  # NaN se (unrecorded) never hatches; a hatched cell is one noise cannot be told from 0.
  plots.hatch_cells(ax, im, np.abs(values) <= NOISE_SE * se)
  ax.set_xticks(range(len(MODULES)), MODULES, rotation=25, ha="right", fontsize=8)
  ax.set_yticks(range(len(layers)), [f"L{l} {kinds[l]}" for l in layers], fontsize=8)
  fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01)
  far = layered[0]["far_lag"]
  ax.set_title(f"{key} {DEFINITIONS[key]}, L = {far}, step {layered[0]['step']}; hatched: "
               f"within {NOISE_SE} standard errors of 0", fontsize=9)
  return fig


def _mixers_before(records, layer: int) -> dict[int, str]:
  return {r["layer"]: r["layer_type"] for r in _layered(records) if r["layer"] < layer}


def _gate_mean(records, layer: int, key: str) -> float | None:
  """The head mean of a gate value (`mean_decay`, `mean_beta`: a scalar or per head) that a
  linear or delta layer's records carry."""
  for r in records:
    if r["layer"] == layer and r.get(key) is not None:
      return float(np.mean(r[key]))
  return None


def global_law(lags, config) -> np.ndarray:
  """c_global(d, i) averaged over the probe's query positions i >= d (those a lag's pairs are
  counted at), i from the row start: exact for one document per row under uniform causal
  attention; packed rows have smaller in-document positions, i.e. a lower law."""
  positions = recency.query_positions(config.data.seq_len, config.metrics.query_positions)
  positions = np.arange(config.data.seq_len) if positions is None else np.asarray(positions)
  return np.array([np.mean(theory.global_cosine(d, positions[positions >= d]))
                   if np.any(positions >= d) else np.nan for d in lags])


def theory_curves(records, config, layer: int) -> dict[str, tuple[str, np.ndarray]]:
  """label -> (law, c(d) at the layer's lags) for the kinds of mixer below `layer`: SWA with
  model.window, uniform causal attention (`global_law`), the constant-decay linear law α^d
  (long prefix) with the mean decay of the nearest linear layer below that records one, and the
  delta rule's law (α(1 − β/H))^d (theory.delta_cosine, long prefix, H = model.head_dim) with
  the mean α and β of the nearest delta layer below that records them."""
  lags = next(r["lags"] for r in _layered(records) if r["layer"] == layer)
  below = _mixers_before(records, layer)
  curves = {}
  window = window_of(config.model)
  if "swa" in below.values() and window is not None:
    curves[f"SWA law [1 − d/w]₊, w={window}"] = ("swa", theory.swa_cosine(lags, window))
  if "global" in below.values():
    curves["global law, mean over query i ≥ d"] = ("global", global_law(lags, config))

  def nearest(kind, keys):
    """(layer, *gate means) of the nearest layer of `kind` below that records all `keys`."""
    found = [(l, *(_gate_mean(records, l, key) for key in keys))
             for l, mixer in sorted(below.items()) if mixer == kind]
    found = [g for g in found if None not in g]
    return found[-1] if found else None

  if linear := nearest("linear", ("mean_decay",)):
    l, alpha = linear
    curves[f"linear law α^d, α={alpha:.3f} (L{l})"] = ("linear",
                                                      theory.linear_cosine(lags, alpha))
  if delta := nearest("delta", ("mean_decay", "mean_beta")):
    l, alpha, beta = delta
    H = config.model.head_dim
    curves[f"delta law (α(1 − β/H))^d, α={alpha:.3f}, β={beta:.2f}, H={H} (L{l})"] = (
        "delta", theory.delta_cosine(lags, alpha, beta, H))
  return curves


def global_input_figure(records, config) -> Figure | None:
  """f(d) ± NOISE_SE se at the input of every global layer, the laws of `theory_curves`, and
  the data control where measured; None without global layers."""
  inputs = {l: r for l, r in plots.records_by_layer(records, "input").items()
            if r["layer_type"] == "global"}
  if not inputs:
    return None
  data = _data_control(records)
  fig, axes = plots.panel_grid(len(inputs))
  for ax, layer in zip(axes, sorted(inputs)):
    r = inputs[layer]
    profile, band = nan_array(r["profile"]), NOISE_SE * nan_array(r["stderr"])
    ax.plot(r["lags"], profile, color="C3", marker=".", label="measured")
    ax.fill_between(r["lags"], profile - band, profile + band, color="C3", alpha=0.2,
                    linewidth=0, label=f"± {NOISE_SE} se")
    for label, (law, curve) in theory_curves(records, config, layer).items():
      ax.plot(r["lags"], curve, label=label, linewidth=1.1, **LAW_STYLES[law])
    if data is not None:
      ax.plot(data["lags"], nan_array(data["profile"]), label=plots.DATA_LABEL,
              **plots.DATA_STYLE)
    plots.log2_lag_axis(ax, r["lags"])
    ax.set_title(f"layer {layer} (global) input: gap {r['gap']:.3f}", fontsize=9)
    ax.set_xlabel("lag d")
  axes[-1].legend(fontsize=6)  # The deepest panel: the most kinds of mixer below it.
  fig.suptitle(f"f(d) at global layers' inputs, step {r['step']}, T={config.data.seq_len}\n"
               "dashed: laws of the mixers below (uniform weights, uncorrelated values)",
               fontsize=9)
  return fig


def logit_figure(records) -> Figure | None:
  """ℓ(d) per global NoPE layer: heads thin grey, the head mean black, the band ℓ(L) ±
  NOISE_SE standard errors of the logit gap; None without read-out records."""
  readout = plots.readout_by_layer(records)
  if not readout:
    return None
  fig, axes = plots.panel_grid(len(readout))
  for ax, layer in zip(axes, sorted(readout)):
    r = readout[layer]
    logit = plots.nan_rows(r["logit_profile"])
    ax.plot(r["lags"], logit.T, color="0.7", linewidth=0.6)
    mean = logit.mean(0)
    ax.plot(r["lags"], mean, color="k", linewidth=1.8, label="head mean")
    se = plots.head_mean_se(r)
    far = mean[r["lags"].index(r["far_lag"])]
    if se is not None:
      ax.axhspan(far - NOISE_SE * se, far + NOISE_SE * se, color="C1", alpha=0.25,
                 linewidth=0, label=f"ℓ(L) ± {NOISE_SE} se")
    ax.axhline(0, color="0.6", linewidth=0.8)
    plots.log2_lag_axis(ax, r["lags"])
    null = np.mean(r["alignment_null"]) if "alignment_null" in r else float("nan")
    ax.set_title(f"layer {layer}: gap {np.mean(r['logit_gap']):+.3f} ± {np.nan if se is None else se:.3f}, "
                 f"align {np.mean(r['alignment']):+.3f} (null {null:.3f})", fontsize=8)
    ax.set_xlabel("lag d")
    ax.legend(fontsize=7)
  fig.suptitle(f"ℓ(d) = mean q_i·k_(i−d)/√H per global NoPE layer, step {r['step']}\n"
               "grey: heads; gap ± se, alignment: head means", fontsize=9)
  return fig


def figures(records, config) -> dict[str, bytes]:
  """name -> PNG of one measurement's records (one step of recency.jsonl)."""
  built = {"recency/gap_heatmap": heatmap_figure(records, "gap"),
           "recency/floor_heatmap": heatmap_figure(records, "floor"),
           "recency/global_input_profiles": global_input_figure(records, config),
           "recency/logit_profiles": logit_figure(records)}
  return {name: png(fig) for name, fig in built.items() if fig is not None}
