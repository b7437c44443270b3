"""Time analysis.measure.live_figures.figures on one measurement of a 120m-shaped (or 350m) model.

  python benchmarks/live_figures.py                  # 12 layers SG, 12 heads, 20 lags
  python benchmarks/live_figures.py --size=350m      # 24 layers, 16 heads

The figures depend only on the records' shape: layers, modules, heads and lags. The records are
the real recency hook's, measured on the size's pattern, depth and heads with a narrow model and
a 64-token probe (`--lags` lags in [1, 32]), so the benchmark runs in seconds on a CPU. Prints
the best of --reps wall times of the whole call and of each figure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=wrong-import-position

from configs import base  # pylint: disable=wrong-import-position
from hybrid_nope.analysis.measure import live_figures  # pylint: disable=wrong-import-position
from hybrid_nope.analysis.measure.hook import RecencyHook  # pylint: disable=wrong-import-position
from hybrid_nope.data.pipeline import loader  # pylint: disable=wrong-import-position
from hybrid_nope.model.definition import init_model  # pylint: disable=wrong-import-position
from tests.helpers import tiny_config  # pylint: disable=wrong-import-position


def records_for(size: str, num_lags: int):
  shape = base.SIZES[size]
  heads = shape["num_heads"]
  config = tiny_config(model__num_layers=shape["num_layers"], model__pattern="SG",
                       model__num_heads=heads, model__num_kv_heads=heads, model__d_model=32)
  lags = [*range(1, min(num_lags, 32)), 32]  # Far lag 32 (the tiny config's), below seq_len 64.
  model_def, params = init_model(config.model, seed=0)
  hook = RecencyHook(config, model_def, loader.probe_pool(config), writer=None, lags=lags)
  return config, hook.records(0, params)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="120m", choices=sorted(base.SIZES))
  parser.add_argument("--lags", type=int, default=20)
  parser.add_argument("--reps", type=int, default=3)
  args = parser.parse_args()
  config, records = records_for(args.size, args.lags)
  live_figures.figures(records, config)  # Warm-up: fonts and matplotlib's caches.
  best = {}
  for _ in range(args.reps):
    start = time.perf_counter()
    built = {"recency/gap_heatmap": lambda: live_figures.heatmap_figure(records, "gap"),
             "recency/floor_heatmap": lambda: live_figures.heatmap_figure(records, "floor"),
             "recency/global_input_profiles": lambda: live_figures.global_input_figure(
                 records, config),
             "recency/logit_profiles": lambda: live_figures.logit_figure(records)}
    for name, make in built.items():
      t = time.perf_counter()
      png = live_figures.png(make())
      best[name] = min(best.get(name, (np.inf, 0)), (time.perf_counter() - t, len(png)))
    best["figures() total"] = min(best.get("figures() total", (np.inf, 0)),
                                  (time.perf_counter() - start, 0))
  layers = {r["layer"] for r in records if r["layer"] >= 0}
  print(f"{args.size} shape: {len(layers)} layers, {len(records)} records, "
        f"{len(records[-1]['lags'])} lags, {config.model.num_heads} heads; best of {args.reps}")
  for name, (seconds, size) in best.items():
    print(f"  {name:32s} {seconds * 1e3:7.0f} ms" + (f"  {size / 1e3:6.0f} kB" if size else ""))


if __name__ == "__main__":
  main()
