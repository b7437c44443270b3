"""Synthetic measured workdirs for the evidence room's tests: per-document recency sums built
from chosen gaps (plus seed and document noise), the records the hook would build from those
sums (records.build), the sums side files, eval losses and the probe description. Statistics of
the page can then be checked against the numbers that made them."""
import json
import os
import zlib

import numpy as np

from hybrid_nope.run import run_dir
from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN, CONTROL
from hybrid_nope.analysis.measure import records
from hybrid_nope.model.pattern import layer_kinds, layer_type
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from hybrid_nope.run.run_dir import RunDir
from tests.helpers import tiny_config

LAGS, FAR, DOCS, HEADS = (1, 4, 16), 16, 24, 2  # 16: the steepness f(1) − f(16)


def _profile(gap: float, floor: float = 0.1) -> np.ndarray:
  return floor + gap * np.array([1.0, 0.5, 0.0])


def counts(rng_seed: int = 123) -> np.ndarray:
  """Pairs per lag and document [Λ, C]: one probe, the same for every run."""
  return np.random.default_rng(rng_seed).integers(20, 80, size=(len(LAGS), DOCS)).astype(float)


def sums_for(pattern: str, num_layers: int, gap: float, local_raise: float, logit_gap: float,
             rng: np.random.Generator, noise: float, doc_effect_C: np.ndarray) -> dict:
  """One measurement's sums: every boundary's profile has `gap` (the local mixer's branch and
  the block after it `local_raise` more), documents shifted by a shared effect, seeds by
  noise."""
  n = counts()
  kinds = layer_kinds(pattern, num_layers)
  seed_shift = rng.normal(0, noise)

  def cos(g):
    p = _profile(g + seed_shift)[:, None] + doc_effect_C[None] * np.array([1, 0.5, 0])[:, None]
    return n * p + np.sqrt(n) * rng.normal(0, noise, n.shape)
  out = {"counts": n, "tokens": n * _profile(0.05)[:, None], "matched_counts": n[0]}
  for layer, kind in enumerate(kinds):
    local = kind != "G"
    for module in BOUNDARIES + ((FINAL_BOUNDARY,) if layer == len(kinds) - 1 else ()):
      raised = local and module in ("mixer", "residual_1")
      key = f"{layer}/{module}"
      out[key] = cos(gap + (local_raise if raised else 0.0))
      out[f"{key}/matched"] = out[key][0]
      out[f"{key}/shuffled"] = np.stack([n[0] * 0.1, n[-1] * 0.1])
    if not local:
      lg = logit_gap + seed_shift
      prof = np.array([lg, lg / 2, 0.0])
      logit_LC = n * (prof[:, None] + rng.normal(0, noise, (len(LAGS), DOCS)))
      out[f"{layer}/logit"] = np.repeat(logit_LC[..., None], HEADS, -1)
      out[f"{layer}/m_norms"] = np.ones(HEADS)
      out[f"{layer}/delta_norm"] = np.float64(1.0)
  return out


def measured_run(root: str, name: str, *, pattern: str = "SG", num_layers: int = 4,
                 seed: int = 0, gaps=(0.05, 0.3), local_raise=(0.1, 0.2), logit_gaps=(0.0, 0.2),
                 loss: float = 2.5, noise: float = 0.002, final_step: int = 8) -> str:
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  rd = RunDir(workdir)
  config = tiny_config(model__pattern=pattern, model__num_layers=num_layers, train__seed=seed)
  with open(rd.config, "w") as f:
    f.write(config.to_json_best_effort())
  with open(rd.metrics, "w") as f:
    for row in ({"step": final_step, "loss": loss + 0.1}, {"step": final_step, "eval_loss": loss}):
      f.write(json.dumps(row) + "\n")
  rng = np.random.default_rng(1000 * seed + sum(map(ord, name)))
  doc_effect = np.random.default_rng(7).normal(0, 0.01, DOCS)  # the probe's own documents
  kinds = layer_kinds(pattern, num_layers)
  os.makedirs(rd.recency_sums)
  lines = []
  for step, gap, raise_, logit in zip((0, final_step), gaps, local_raise, logit_gaps):
    sums = sums_for(pattern, num_layers, gap, raise_, logit, rng, noise, doc_effect)
    with open(rd.recency_sums_file(step), "wb") as f:
      f.write(records.encode_sums(sums, LAGS, FAR))
    recs = records.build(step, sums, kinds=kinds, layer_types=[layer_type(k) for k in kinds],
                         boundaries=BOUNDARIES, final_boundary=FINAL_BOUNDARY, lags=LAGS,
                         far=FAR, d_model=config.model.d_model,
                         readout_layers={i for i, k in enumerate(kinds) if k == "G"},
                         linear_layers=set(), data_control=step == 0)
    lines += [json.dumps(r) for r in recs]
  with open(rd.recency, "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(rd.recency_probe, "w") as f:
    json.dump({"rows": list(range(8)), "documents": DOCS}, f)
  return workdir


def ablation_result(counts_2C, means_by_condition, rows=(0, 1), layers=(1, 3)):
  """An ablation_T<T>.json (analysis/checkpoint/ablation.py) holding `logit_sums` whose per-document, per-head logit means are
  `means_by_condition[c]` ([C, N] at lag 1; the far lag's are 0), the same for every layer."""
  n_near, n_far = counts_2C
  sums = {"counts": {"near": n_near.tolist(), "far": n_far.tolist()}, "layers": list(layers)}
  conditions = list(means_by_condition)
  for c in conditions:
    m_CN = np.asarray(means_by_condition[c], np.float64)
    sums[c] = {str(i): {"near": (m_CN * n_near[:, None]).tolist(),
                        "far": np.zeros_like(m_CN).tolist()} for i in layers}
  gaps = {c: float(np.mean(np.sum(np.asarray(means_by_condition[c]) * n_near[:, None], 0)
                           / n_near.sum())) for c in conditions}
  controls = [c for c in conditions if c not in (CLEAN, ABLATED)]
  summary = {CLEAN: {"logit_gap": gaps[CLEAN]},
             **{f"{a}_minus_{b}": {"logit_gap": gaps[a] - gaps[b]}
                for a, b in [(c, CLEAN) for c in conditions if c != CLEAN]
                + [(ABLATED, c) for c in controls]}}
  loss = {"ablated_minus_control": {"loss": 0.01}}
  return {"logit_sums": sums, "summary": summary, "loss_delta": loss,
          "probe": {"rows": list(rows)}, "seq_len": 1024, "far_lag": 512}


def write_ablation(workdir: str, effect: float, *, step: int = 8, seq_len: int = 64,
                   clean: float = 0.1) -> str:
  """The causal test's file in a measured run: per document and head an ablated − control
  logit gap of `effect` plus document noise shared by every seed (the probe's own documents)
  and seed noise; returns its path."""
  rng = np.random.default_rng(zlib.crc32(os.path.basename(workdir).encode()))
  counts = np.random.default_rng(3).integers(20, 80, size=(2, DOCS)).astype(float)
  doc = np.random.default_rng(7).normal(0, 0.005, DOCS)
  base = np.full((DOCS, HEADS), clean)
  ablated = base + (effect + doc + rng.normal(0, 0.002) + rng.normal(0, 0.002, DOCS))[:, None]
  result = ablation_result(counts, {CLEAN: base, CONTROL: base, ABLATED: ablated}, layers=(1,))
  out_dir = RunDir(workdir).analysis_dir(step)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, run_dir.ABLATION_FILE.format(seq_len=seq_len))
  with open(path, "w") as f:
    json.dump(result, f)
  return path


def with_control_gaps(result, *, input_gap, branch_gap, loss, lam, control=CONTROL):
  """`result` with what control_effects reads: per condition of `input_gap` (clean, ablated,
  `control`, and others) the global input's gap (summary), the local branches' own gap (one
  local layer), the eval loss and the damage dial."""
  conditions = list(input_gap)
  result["summary"].update({c: {"gap": input_gap[c]} for c in conditions})
  for c in conditions:
    if c != CLEAN:
      result["summary"].setdefault(f"{c}_minus_{CLEAN}", {}).update(
          gap=input_gap[c] - input_gap[CLEAN], gap_stderr=0.001)
  result["summary"].setdefault(f"{ABLATED}_minus_{control}", {}).update(
      gap=input_gap[ABLATED] - input_gap[control], gap_stderr=0.001)
  result["local_layers"] = [{"layer": 0, "mixer_gap": dict(branch_gap)}]
  result["eval"] = {c: {"loss": loss[c]} for c in conditions}
  result["damage"] = {c: {"lam": lam[c]} for c in lam}
  return result
