# Tiers (pytest.ini): test_no_global_nope_layer_no_logit_figure compiles two more hook
# measurements (~30 s cold on 2 cores), so by cost it is integration, `make test-all` only.
# test-all only: a run without a global NoPE layer draws no logit figure, and one with a global
# RoPE layer no logit figure either (test_no_global_nope_layer_no_logit_figure).
"""Figures of one recency measurement: from the real hook's records on a tiny model, and from
those records with chosen values (to check what the pixels say)."""
import copy
import io
import struct

import numpy as np
import pytest
from matplotlib import colormaps
from PIL import Image

from hybrid_nope.analysis.measure import live_figures, theory
from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.data.pipeline import loader
from hybrid_nope.model.definition import init_model
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from tests.helpers import tiny_config

PANEL = (270, 340)  # plots.panel_grid's 2.7 x 3.4 inch panels at live_figures.DPI.
HEAT, FLOOR = "recency/gap_heatmap", "recency/floor_heatmap"
INPUTS, LOGITS = "recency/global_input_profiles", "recency/logit_profiles"


def measure(**overrides):
  config = tiny_config(model__num_layers=4, **overrides)
  model_def, params = init_model(config.model, seed=0)
  hook = RecencyHook(config, model_def, loader.eval_batches(config), writer=None)
  return config, hook.records(0, params)


@pytest.fixture(scope="module")
def hybrid():
  return measure(model__pattern="SG")


def decode(png: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_every_figure_decodes_at_its_size(hybrid):
  config, records = hybrid
  figs = live_figures.figures(records, config)
  assert list(figs) == [HEAT, FLOOR, INPUTS, LOGITS]
  pixels = {name: decode(png) for name, png in figs.items()}
  for name in (HEAT, FLOOR):
    assert pixels[name].shape == (*live_figures.heatmap_pixels(4), 3)
  for name in (INPUTS, LOGITS):  # Two global layers: one row of two panels.
    assert pixels[name].shape == (PANEL[0], 2 * PANEL[1], 3)
  for name, rgb in pixels.items():
    inked = np.mean(rgb.mean(-1) < 230)
    assert 0.03 < inked < 0.9, name
  # Deeper models get taller heat maps, not squeezed rows.
  assert live_figures.heatmap_pixels(24)[0] > live_figures.heatmap_pixels(12)[0] > 300


def with_values(records, key, values, stderr=1e-6):
  """The records in depth order with `key` set to `values` and every standard error tiny."""
  out = copy.deepcopy(records)
  layered = [r for r in out if r["layer"] >= 0]
  for r, v in zip(layered, values, strict=True):
    r[key], r["stderr"] = float(v), [stderr] * len(r["lags"])
  return out, layered


def cell_pixels(fig, rgb, layered, radius=0):
  """The (2r+1)² pixels about each record's cell centre in the rendered heat map."""
  ax = fig.axes[0]
  height = rgb.shape[0]
  modules = BOUNDARIES + (FINAL_BOUNDARY,)
  out = []
  for r in layered:
    x, y = ax.transData.transform((modules.index(r["module"]), r["layer"]))
    row, col = int(round(height - y)), int(round(x))
    out.append(rgb[row - radius:row + radius + 1, col - radius:col + radius + 1].reshape(-1, 3))
  return out


@pytest.mark.parametrize("key", ["gap", "floor"])
def test_heatmap_colours_order_as_the_values(hybrid, key):
  _, records = hybrid
  n = sum(r["layer"] >= 0 for r in records)
  values = np.random.default_rng(1).permutation(np.linspace(-0.2, 0.8, n))
  changed, layered = with_values(records, key, values)
  fig = live_figures.heatmap_figure(changed, key)
  rgb = decode(live_figures.png(fig))
  colours = np.array([p[0] for p in cell_pixels(fig, rgb, layered)], float)
  lut = colormaps[live_figures.CMAPS[key]](np.linspace(0, 1, 256))[:, :3] * 255
  position = np.argmin(((colours[:, None] - lut[None]) ** 2).sum(-1), axis=1)
  np.testing.assert_array_equal(np.argsort(position), np.argsort(values))
  assert np.abs(colours[np.argmax(values)] - lut[-1]).max() <= 2  # The extreme colour.
  if key == "gap":  # Diverging about 0: the scale is ±max |gap|, so 0 is the middle.
    assert abs(position[np.argmin(np.abs(values))] - 128) <= 4


def test_gaps_within_noise_are_hatched(hybrid):
  _, records = hybrid
  n = sum(r["layer"] >= 0 for r in records)
  values = np.linspace(0.3, 0.6, n)
  values[5] = 0.01
  changed, layered = with_values(records, "gap", values)
  layered[5]["stderr"] = [0.05] * len(layered[5]["lags"])
  layered[5]["gap_stderr"] = 0.05  # 0.01 < 2 se: noise.
  fig = live_figures.heatmap_figure(changed, "gap")
  patches = cell_pixels(fig, decode(live_figures.png(fig)), layered, radius=4)
  distinct = [len(np.unique(p, axis=0)) for p in patches]
  assert distinct[5] > 1 and all(d == 1 for i, d in enumerate(distinct) if i != 5)


@pytest.mark.long
@pytest.mark.integration
def test_no_global_nope_layer_no_logit_figure():
  config, records = measure(model__pattern="S")
  assert list(live_figures.figures(records, config)) == [HEAT, FLOOR]
  config, records = measure(model__pattern="SG", model__global_pos="rope")
  assert list(live_figures.figures(records, config)) == [HEAT, FLOOR, INPUTS]


def test_theory_curves_follow_the_mixers_below(hybrid):
  config, records = hybrid
  lags = records[1]["lags"]
  (below_1,) = live_figures.theory_curves(records, config, 1).values()
  assert below_1[0] == "swa"
  np.testing.assert_allclose(below_1[1], theory.swa_cosine(lags, config.model.window))
  curves = live_figures.theory_curves(records, config, 3)
  assert [law for law, _ in curves.values()] == ["swa", "global"]
  # All 64 positions are queries (query_positions 0 >= seq_len): the law's mean over i >= d.
  global_law = curves["global law, mean over query i ≥ d"][1]
  want = [np.mean(theory.global_cosine(d, np.arange(d, 64))) for d in lags]
  np.testing.assert_allclose(global_law, want)
  assert np.all(np.diff(global_law) < 0) and global_law[0] < 1


def as_pattern(hybrid, pattern, **gates):
  """The hybrid's config with `pattern` and a copy of its records in which the SWA layers take
  the pattern's layer types, with `gates` (key -> value) on their records."""
  config, records = copy.deepcopy(hybrid)
  config.model.pattern = pattern
  types = {"L": "linear", "D": "delta"}
  for r in records:
    if r["layer_type"] == "swa":
      r.update(layer_type=types[pattern[r["layer"] % len(pattern)]], **gates)
  return config, records


def test_a_linear_layers_mean_decay_selects_the_linear_law(hybrid):
  records = hybrid[1]
  config, linear = as_pattern(hybrid, "LG")  # No sliding layer: no SWA law.
  assert live_figures.theory_curves(linear, config, 1) == {}  # No decay recorded: no law.
  for r in linear:
    if r["layer"] == 0:
      r["mean_decay"] = [0.7, 0.9]  # Per head: the law takes their mean.
    elif r["layer"] == 2:
      r["mean_decay"] = 0.5
  ((label, (law, curve)),) = live_figures.theory_curves(linear, config, 1).items()
  assert law == "linear" and "α=0.800 (L0)" in label
  np.testing.assert_allclose(curve, theory.linear_cosine(records[1]["lags"], 0.8))
  curves = live_figures.theory_curves(linear, config, 3)
  assert [law for law, _ in curves.values()] == ["global", "linear"]
  # The nearest linear layer below layer 3 is layer 2.
  np.testing.assert_allclose(list(curves.values())[1][1],
                             theory.linear_cosine(records[1]["lags"], 0.5))
  without = live_figures.figures(records, config)[INPUTS]
  assert live_figures.figures(linear, config)[INPUTS] != without


def test_a_delta_layers_mean_decay_and_beta_select_the_delta_law(hybrid):
  records = hybrid[1]
  config, mixed = as_pattern(hybrid, "LGDG", mean_decay=0.9)  # No sliding layer: no SWA law.
  assert [law for law, _ in live_figures.theory_curves(mixed, config, 3).values()] == [
      "global", "linear"]  # The delta layer records no β: no delta law.
  for r in mixed:
    if r["layer"] == 2:
      r["mean_beta"] = [0.4, 0.8]  # Per head: the law takes their mean.
  curves = live_figures.theory_curves(mixed, config, 3)
  assert [law for law, _ in curves.values()] == ["global", "linear", "delta"]
  label, (_, curve) = list(curves.items())[2]
  H = config.model.head_dim
  assert f"α=0.900, β=0.60, H={H} (L2)" in label
  lags = records[3]["lags"]
  np.testing.assert_allclose(curve, theory.delta_cosine(lags, 0.9, 0.6, H))
  assert np.all(curve[1:] < theory.linear_cosine(lags, 0.9)[1:])  # The erase shortens it.
  assert live_figures.theory_curves(mixed, config, 1).keys() == {
      "linear law α^d, α=0.900 (L0)"}  # Layer 2 is above layer 1.

def read_events(path):
  """tensorboardX's event file: TFRecords (length, crc, Event bytes, crc)."""
  from tensorboardX.proto import event_pb2
  data, pos, events = open(path, "rb").read(), 0, []
  while pos < len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
    pos += 12 + length + 4
  return events


def test_figures_reach_tensorboard_as_hwc_images(hybrid, tmp_path):
  """What MetricsWriter.write_images does: decode, then add_image(dataformats="HWC")."""
  from tensorboardX import SummaryWriter
  from hybrid_nope.run.wandb_sink import rgb_array
  config, records = hybrid
  figs = live_figures.figures(records, config)
  writer = SummaryWriter(str(tmp_path))
  for name, png in figs.items():
    writer.add_image(name, rgb_array(png), 7, dataformats="HWC")
  writer.close()
  (path,) = tmp_path.glob("events.out.tfevents.*")
  images = {v.tag: v.image for e in read_events(path) if e.step == 7 for v in e.summary.value}
  assert sorted(images) == sorted(figs)
  for name, png in figs.items():
    height, width, _ = decode(png).shape
    assert (images[name].height, images[name].width) == (height, width)
    np.testing.assert_array_equal(decode(images[name].encoded_image_string), decode(png))
