"""How much counting only same-document pairs moves the recency metrics of a trained run.

  python benchmarks/recency_masking.py --workdir=workdirs/demo [--steps=0,180]

On the hook's probe (same rows, lags and query positions), at init (step 0: the model
re-initialised with train.seed) and at each checkpoint step given, prints for every global
layer's normalised input (pre_mixer_norm) and the data control: the gap and floor with
document-aware pairs (what recency.jsonl holds) and with every pair counted (the metric before
issue 12), and the head-mean logit gap both ways.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from hybrid_nope.run.reader import open_readonly  # noqa: E402
from hybrid_nope.model import checkpointed  # noqa: E402
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure.hook import RecencyHook  # noqa: E402
from hybrid_nope.data.pipeline import loader  # noqa: E402
from hybrid_nope.model.definition import init_model  # noqa: E402


def rows(hook, params, step):
  p = hook.probe
  model = hook.model_def.bind(params)
  saved = {}

  def save(layer, name, x):
    if name == "pre_mixer_norm" and layer in hook.readout_layers:
      saved[layer] = x
    return x

  model(p["inputs"], positions_BT=p["positions"], segment_ids_BT=p["segment_ids"], observe=save)
  out = []
  for name, seg in (("same document", p["segment_ids"]), ("every pair", None)):
    match, counts = recency.match_sums(p["inputs"], hook.lags, hook.positions, seg)
    data = np.asarray(match / counts)
    out.append(("data", name, *recency.floor_and_gap(data, hook.lags, far=hook.far), None))
    for layer, x in sorted(saved.items()):
      profile = np.asarray(recency.cosine_profile(x, hook.lags, hook.positions, seg))
      attn = model.blocks[layer].attn
      logit = np.asarray(recency.logit_profile(x, attn.wq_DNH[...], attn.wk_DKH[...],
                                               (1, hook.far), hook.positions, seg))
      out.append((f"layer {layer}", name, *recency.floor_and_gap(profile, hook.lags,
                                                                 far=hook.far),
                  float(np.mean(logit[:, 0] - logit[:, 1]))))
  print(f"\nstep {step}: probe of {len(hook.rows)} rows, {hook.num_docs} documents, far lag "
        f"{hook.far}")
  print("| where | pairs | floor | gap | logit gap (head mean) |")
  print("|---|---|---|---|---|")
  for where, name, floor, gap, logit in sorted(out, key=lambda r: r[0]):
    logit = "—" if logit is None else f"{logit:+.4f}"
    print(f"| {where} | {name} | {floor:.4f} | {gap:.4f} | {logit} |")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", default="0", help="0 = init; others: checkpoint steps")
  args = p.parse_args()
  run = open_readonly(args.workdir)
  config = run.config
  model_def, init_params = init_model(config.model, config.train.seed)
  hook = RecencyHook(config, model_def, loader.probe_pool(config), writer=None)
  for step in (int(s) for s in args.steps.split(",")):
    params = init_params if step == 0 else checkpointed.restore_params(run, step)[2]
    rows(hook, params, step)


if __name__ == "__main__":
  main()
