# Tiers (pytest.ini): test_analyze_writes_every_figure draws every figure of an analysed run (~14 s
# cold on 2 cores), so by cost it is integration, `make test-all` only.
# test-all only: the analysis writes every figure it names (test_analyze_writes_every_figure; the
# figures' contents are checked here in `make test`).
"""The analysis figures: written, readable PNGs with something drawn in them."""
import os

import numpy as np
import pytest
from matplotlib import image

from hybrid_nope.analysis.present import plots
from hybrid_nope.analysis.measure.hook import DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from tests.analysis_runs import analyzed_run


def _assert_drawn(path, min_width=500):
  assert os.path.getsize(path) > 10_000, path
  pixels = image.imread(path)
  assert pixels.shape[1] >= min_width and pixels.shape[0] >= 250, (path, pixels.shape)
  rgb = pixels[..., :3]
  # Mostly white background, but a real share of the pixels carries lines, text or colour.
  assert 0.02 < np.mean(rgb.mean(-1) < 0.9) < 0.9, path


@pytest.mark.integration
def test_analyze_writes_every_figure(tmp_path_factory):
  _, result = analyzed_run(tmp_path_factory)
  names = sorted(os.path.basename(p) for p in result["files"])
  assert names == sorted([
      "analysis_T64.json", "extrapolation.json", "extrapolation.png", "floor_gap_T64.png",
      "logit_gap_alignment_T64.png", "logit_profiles_T64.png", "loss_by_position_T64.png",
      "profiles_T64.png"])
  for p in result["files"]:
    assert os.path.dirname(p) == result["out_dir"]
    if p.endswith(".png"):
      _assert_drawn(p)


def _record(rng, layer, kind, module, lags, far_lag):
  profile = np.sort(rng.uniform(0, 1, len(lags)))[::-1]
  stderr = rng.uniform(0.005, 0.02, len(lags))
  profile[2], stderr[2] = np.nan, np.nan  # A lag without pairs.
  far = lags.index(far_lag)
  return {"layer": layer, "layer_type": kind, "module": module, "lags": list(lags),
          "far_lag": far_lag, "profile": profile.tolist(), "floor": float(profile[far]),
          "gap": float(profile[0] - profile[far]), "pairs": [50] * len(lags),
          "stderr": stderr.tolist()}


def _synthetic_analysis(num_layers, heads=4, lags=(1, 2, 4, 8, 16, 32), d_model=16):
  """An analysis dict in report.analyze's shape: records at every boundary, the final norm,
  the data control record first, readouts on every record of a global layer."""
  rng = np.random.default_rng(0)
  far_lag = lags[-1]
  records = {"records": [], "init_records": []}
  for key in records:
    records[key].append(_record(rng, DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE, lags, far_lag))
    for layer in range(num_layers):
      kind = "swa" if layer % 2 == 0 else "global"
      readout = {}
      if kind == "global":
        # Alignment of order the null 1/d_model: some heads significant, some not.
        readout = dict(logit_profile=rng.normal(size=(heads, len(lags))).tolist(),
                       logit_gap=rng.normal(size=heads).tolist(),
                       logit_gap_stderr=rng.uniform(0.1, 1.0, heads).tolist(),
                       alignment=rng.normal(scale=2.5 / d_model, size=heads).tolist(),
                       alignment_null=[1 / d_model] * heads)
      modules = BOUNDARIES + ((FINAL_BOUNDARY,) if layer == num_layers - 1 else ())
      for module in modules:
        records[key].append({**_record(rng, layer, kind, module, lags, far_lag), **readout})
  buckets = 8
  ev = {"seq_len": 128, "bucket_size": 16, "loss": 2.0, "weights": [1.0] * buckets,
        "loss_by_position": [None] + list(np.linspace(3, 2, buckets - 1))}
  return {"step": 100, "seq_len": 128, "train_seq_len": 64, "far_lag": far_lag, "eval": ev,
          **records}


@pytest.mark.parametrize("num_layers", [4, 10])  # 10: past the per-boundary tick labels
def test_run_figures_at_depth(tmp_path, num_layers):
  files = plots.run_figures(_synthetic_analysis(num_layers), str(tmp_path), suffix="_x")
  assert [os.path.basename(p) for p in files] == [
      "profiles_x.png", "floor_gap_x.png", "logit_profiles_x.png", "logit_gap_alignment_x.png",
      "loss_by_position_x.png"]
  for p in files:
    _assert_drawn(p)


def test_no_logit_figures_without_global_nope_layers(tmp_path):
  a = _synthetic_analysis(2)
  for key in ("records", "init_records"):
    a[key] = [{k: v for k, v in r.items() if k not in (
        "logit_gap", "logit_profile", "alignment", "logit_gap_stderr", "alignment_null")}
        for r in a[key]]
  names = [os.path.basename(p) for p in plots.run_figures(a, str(tmp_path))]
  assert names == ["profiles.png", "floor_gap.png", "loss_by_position.png"]


@pytest.fixture
def figures(monkeypatch):
  """The Figure objects the plot functions save, by path (they still write the PNG)."""
  saved = {}
  save = plots.save_figure

  def capture(fig, path):
    saved[os.path.basename(path)] = fig
    return save(fig, path)

  monkeypatch.setattr(plots, "save_figure", capture)
  return saved


def _lines(ax):
  return {line.get_label(): line for line in ax.get_lines()}


def test_data_record_is_no_layer():
  a = _synthetic_analysis(4)
  assert sorted(plots.records_by_layer(a["records"], "residual_2")) == [0, 1, 2, 3]
  assert plots.records_by_layer(a["records"], DATA_MODULE) == {}
  assert sorted(plots.readout_by_layer(a["records"])) == [1, 3]
  assert plots._data(a)["layer"] == DATA_LAYER


def test_floor_gap_places_the_final_norm_last_and_draws_the_data_control(tmp_path, figures):
  num_layers = 4
  a = _synthetic_analysis(num_layers)
  _assert_drawn(plots.floor_gap_by_boundary(a, str(tmp_path / "fg.png")))
  data = plots._data(a)
  final = [r for r in a["records"] if r["module"] == FINAL_BOUNDARY][0]
  last_residual = [r for r in a["records"] if r["layer"] == num_layers - 1
                   and r["module"] == "residual_2"][0]
  for ax, key in zip(figures["fg.png"].axes, ("floor", "gap")):
    lines = _lines(ax)
    x, y = lines["step 100"].get_data()
    # Every boundary of every layer, then the final norm; the data record (layer -1) is none.
    assert list(x) == list(range(num_layers * len(BOUNDARIES) + 1))
    assert y[-1] == pytest.approx(final[key]) and y[-2] == pytest.approx(last_residual[key])
    assert y[0] == pytest.approx(a["records"][1][key])  # Layer 0's input, not the data record.
    assert len(lines["init"].get_data()[0]) == len(x)
    assert np.all(np.asarray(lines[plots.DATA_LABEL].get_data()[1]) == data[key])
  labels = [t.get_text() for t in figures["fg.png"].axes[1].get_xticklabels()]
  assert labels[0] == "in" and labels[-1] == "final norm" and len(labels) == len(x)
  # Without a data record (a run recorded before the control existed) the line is absent.
  for key in ("records", "init_records"):
    a[key] = [r for r in a[key] if r["layer"] != DATA_LAYER]
  _assert_drawn(plots.floor_gap_by_boundary(a, str(tmp_path / "fg2.png")))
  assert plots.DATA_LABEL not in _lines(figures["fg2.png"].axes[0])


def test_profiles_draw_the_data_control_and_a_noise_band(tmp_path, figures):
  a = _synthetic_analysis(2)
  _assert_drawn(plots.cosine_profiles(a, str(tmp_path / "p.png")))
  ax = figures["p.png"].axes[0]
  lines = _lines(ax)
  data = plots._data(a)
  np.testing.assert_array_equal(lines[plots.DATA_LABEL].get_data()[1],
                                np.array(data["profile"], float))
  assert lines[plots.DATA_LABEL].get_linestyle() == ":"
  # The band spans profile ± 2 stderr at a measured lag.
  r = plots.records_by_layer(a["records"], "residual_2")[0]
  (band,) = ax.collections
  vertices = band.get_paths()[0].vertices
  at_lag1 = vertices[np.isclose(vertices[:, 0], 1.0), 1]
  assert at_lag1.min() == pytest.approx(r["profile"][0] - 2 * r["stderr"][0])
  assert at_lag1.max() == pytest.approx(r["profile"][0] + 2 * r["stderr"][0])


def test_heat_maps_hatch_what_noise_explains(tmp_path, figures):
  a = _synthetic_analysis(4)
  _assert_drawn(plots.logit_gap_alignment(a, str(tmp_path / "h.png")))
  readout = plots.readout_by_layer(a["records"])
  alignment = np.array([readout[l]["alignment"] for l in sorted(readout)])
  gap = np.array([readout[l]["logit_gap"] for l in sorted(readout)])
  gap_se = np.array([readout[l]["logit_gap_stderr"] for l in sorted(readout)])
  weak_alignment = np.abs(alignment) <= 2 / 16
  weak_gap = np.abs(gap) <= 2 * gap_se
  assert 0 < weak_alignment.sum() < alignment.size  # The fixture has both kinds.
  heat = [ax for ax in figures["h.png"].axes if ax.get_images()]
  # Axes order: logit gap init, logit gap step, alignment init, alignment step.
  hatched = [sorted((round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches
                    if p.get_hatch()) for ax in heat]
  assert hatched[1] == sorted(zip(*np.nonzero(weak_gap)))
  assert hatched[3] == sorted(zip(*np.nonzero(weak_alignment)))
  assert "null ±0.125" in heat[3].get_title()


def _contrast(a, b):
  """WCAG 2 contrast ratio of two sRGB colours, computed independently of plots.ink."""
  def luminance(rgb):
    c = np.asarray(rgb, float)[:3]
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
  high, low = sorted((luminance(a), luminance(b)), reverse=True)
  return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("cmap", ["RdBu_r", "viridis"])
def test_ink_reads_on_every_colormap_value(cmap):
  from matplotlib import colormaps, colors
  for rgba in colormaps[cmap](np.linspace(0, 1, 64)):
    ink = colors.to_rgb(plots.ink(rgba))
    other = colors.to_rgb("w" if plots.ink(rgba) == "k" else "k")
    # The better of black and white, which always reaches 4.5:1 (WCAG AA for text).
    assert _contrast(ink, rgba) >= max(_contrast(other, rgba), 4.5)


def test_hatching_is_drawn_in_ink_that_reads_on_each_cell(tmp_path):
  """Rendered: inside every hatched cell, from the palest to the darkest colour and the NaN
  cell, the hatch lines' pixels contrast with the cell's colour at 4.5:1 or more."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  values = np.array([[-1.0, -0.6, -0.2, 0.0, 0.3, 0.7, 1.0, np.nan]])
  fig = Figure(figsize=(8, 1.2), dpi=100)
  canvas = FigureCanvasAgg(fig)
  ax = fig.add_axes((0, 0, 1, 1))
  image = ax.imshow(values, cmap=plots.HEATMAP_CMAP, vmin=-1, vmax=1, aspect="auto")
  weak = np.ones(values.shape, bool)
  weak[0, 1] = False  # One plain cell: no hatch there.
  plots.hatch_cells(ax, image, weak)
  ax.set_axis_off()
  canvas.draw()
  rgb = np.asarray(canvas.buffer_rgba())[..., :3].astype(float) / 255
  for j, value in enumerate(values[0]):
    x, y = ax.transData.transform((j, 0))
    row, col = int(round(rgb.shape[0] - y)), int(round(x))
    cell = rgb[row - 25:row + 25, col - 25:col + 25].reshape(-1, 3)
    colour = plots.HEATMAP_CMAP.get_bad() if np.isnan(value) else image.cmap(image.norm(value))
    contrast = np.array([_contrast(p, colour) for p in cell])
    if not weak[0, j]:
      assert contrast.max() < 1.05  # Plain colour.
      continue
    assert 0.05 < np.mean(contrast >= 4.5) < 0.6, (value, np.mean(contrast >= 4.5))
    assert np.mean(contrast < 1.05) > 0.3  # The cell's colour still shows between the lines.


def test_weak_and_missing_values_are_labelled_in_contrasting_ink(tmp_path, figures):
  a = _synthetic_analysis(4)
  for r in a["records"]:
    if "logit_gap" in r:
      r["logit_gap"] = [float("nan"), 50.0, -50.0, 0.0]  # NaN, darkest red and blue, pale.
      r["logit_gap_stderr"] = [1.0] * 4
  plots.logit_gap_alignment(a, str(tmp_path / "h.png"))
  ax = [ax for ax in figures["h.png"].axes if ax.get_images()][1]  # The logit gap now.
  image = ax.get_images()[0]
  hatched = {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches
             if p.get_hatch()}
  assert hatched == {(0, 0), (0, 3), (1, 0), (1, 3)}  # NaN and 0: within 2 se of 0.
  for text in ax.texts:
    j, i = (round(c) for c in text.get_position())
    value = image.get_array().data[i, j]
    colour = plots.HEATMAP_CMAP.get_bad() if np.isnan(value) else image.cmap(image.norm(value))
    assert _contrast(text.get_color() == "k" and (0, 0, 0) or (1, 1, 1), colour) >= 4.5
    assert text.get_text() == ("—" if np.isnan(value) else f"{value:+.2g}")
