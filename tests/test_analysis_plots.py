"""The analysis figures: written, readable PNGs with something drawn in them."""
import os

import numpy as np
import pytest
from matplotlib import image

from hybrid_nope.analysis import plots
from hybrid_nope.model.transformer import BOUNDARIES
from tests.analysis_runs import analyzed_run


def _assert_drawn(path, min_width=500):
  assert os.path.getsize(path) > 10_000, path
  pixels = image.imread(path)
  assert pixels.shape[1] >= min_width and pixels.shape[0] >= 250, (path, pixels.shape)
  rgb = pixels[..., :3]
  # Mostly white background, but a real share of the pixels carries lines, text or colour.
  assert 0.02 < np.mean(rgb.mean(-1) < 0.9) < 0.9, path


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


def _synthetic_analysis(num_layers, heads=4, lags=(1, 2, 4, 8, 16, 32)):
  rng = np.random.default_rng(0)
  records = {"records": [], "init_records": []}
  for key in records:
    for layer in range(num_layers):
      kind = "swa" if layer % 2 == 0 else "global"
      for module in BOUNDARIES:
        profile = np.sort(rng.uniform(0, 1, len(lags)))[::-1]
        r = {"layer": layer, "layer_type": kind, "module": module, "lags": list(lags),
             "profile": profile.tolist(), "floor": profile[-1], "gap": profile[0] - profile[-1]}
        if kind == "global" and module == "pre_mixer_norm":
          r.update(logit_profile=rng.normal(size=(heads, len(lags))).tolist(),
                   logit_gap=rng.normal(size=heads).tolist(),
                   alignment=rng.normal(size=heads).tolist())
        records[key].append(r)
  buckets = 8
  ev = {"seq_len": 128, "bucket_size": 16, "loss": 2.0, "weights": [1.0] * buckets,
        "loss_by_position": [None] + list(np.linspace(3, 2, buckets - 1))}
  return {"step": 100, "seq_len": 128, "train_seq_len": 64, "far_lag": 32, "eval": ev,
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
    a[key] = [{k: v for k, v in r.items() if k not in ("logit_gap", "logit_profile",
                                                       "alignment")} for r in a[key]]
  names = [os.path.basename(p) for p in plots.run_figures(a, str(tmp_path))]
  assert names == ["profiles.png", "floor_gap.png", "loss_by_position.png"]
