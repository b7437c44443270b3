"""The causal test of stage 3: do global NoPE layers read out the recency local layers plant?

`python launch/analyze.py --workdir=DIR --ablate=local` (report.analyze calls `measure`) runs
the probe and the eval rows through the trained model three times:

- clean: no intervention (the analysis's own forward);
- ablated: at every local layer (S, L, D) the mixer's branch output h_BTD is replaced by the
  same vectors with their positions permuted at random within each document (padding stays):
  every token's branch vector is kept, content and norm, but where it sits is random inside
  its document, so the recency the branch carries is gone;
- control: h + (h_perm − h) R with R a fixed Haar-random D x D rotation: the ablation's
  perturbation, of the same norm at every token, turned into directions unrelated to position.

One permutation (PERMUTATION_SEED, over the probe's documents, `probe.document_ids`) serves
every local layer and R is drawn from ROTATION_SEED, so runs and checkpoints pair. Each
condition is measured with the recency hook (its records at each global layer's normalised
input: gap, logit gap and alignment) and scored by context position (`context_loss.
evaluate_by_context`). Differences between conditions share the probe's documents, so their
standard errors are paired over them (`recency.contrast_stderr`). Reading: the global layers
read out the planted recency when ablated − clean logit gap is negative beyond control − clean
(ablated − control, with its paired SE); docs/analysis.md lists every key.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.analysis.checkpoint.checkpoints import AnalysisError
from hybrid_nope.analysis.measure import probe as probe_lib
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure import records as records_lib
from hybrid_nope.model.pattern import KINDS, layer_kinds, layer_type

ABLATE_CHOICES = ("local",)  # What --ablate may name: the local mixers' outputs.
CLEAN, ABLATED, CONTROL = "clean", "ablated", "control"
CONDITIONS = (CLEAN, ABLATED, CONTROL)
DIFFERENCES = (("ablated_minus_clean", ABLATED, CLEAN), ("control_minus_clean", CONTROL, CLEAN),
               ("ablated_minus_control", ABLATED, CONTROL))
PERMUTATION_SEED = 1  # Not the shuffled-token control's (hook.SHUFFLE_SEED = 0).
ROTATION_SEED = 2
BOUNDARY = "mixer"          # Where the branch output is replaced.
READ_AT = "pre_mixer_norm"  # Where a global layer's read-out is measured: its normalised input.
LOSS_KEYS = ("loss", "loss_within", "loss_near", "loss_beyond")


# ---- which layers ------------------------------------------------------------------------------

def check(ablate: str, model_cfg) -> list[int]:
  """The local layers `ablate` names; raises AnalysisError (one line) for another value, a
  pattern with no local mixer (e.g. "G") or one with no global layer to read out."""
  if ablate not in ABLATE_CHOICES:
    raise AnalysisError(f"--ablate={ablate}: expected one of {', '.join(ABLATE_CHOICES)} "
                        f"(local: the outputs of the local mixers S, L and D)")
  pattern = model_cfg.pattern
  kinds = layer_kinds(pattern, model_cfg.num_layers)
  local = [i for i, k in enumerate(kinds) if KINDS[k].local]
  if not local:
    raise AnalysisError(f"--ablate={ablate}: model.pattern={pattern!r} has no local mixer "
                        f"(S, L or D) to ablate; the causal test needs a hybrid such as 'SG'")
  if "G" not in kinds:
    raise AnalysisError(f"--ablate={ablate}: model.pattern={pattern!r} has no global layer (G) "
                        f"whose read-out the causal test measures")
  return local


# ---- the interventions -------------------------------------------------------------------------

def permutation_within_documents(doc_ids_BT: np.ndarray,
                                 seed: int = PERMUTATION_SEED) -> np.ndarray:
  """int32 [B, T]: for each position the position whose vector moves there, a random
  permutation of each row's piece of each document (padding and every other token stay).
  The shuffled-token control's permutation (`probe.shuffled_within_documents`) of the indices."""
  doc_ids_BT = np.asarray(doc_ids_BT)
  index_BT = np.broadcast_to(np.arange(doc_ids_BT.shape[1], dtype=np.int32), doc_ids_BT.shape)
  return probe_lib.shuffled_within_documents(index_BT, doc_ids_BT, seed).astype(np.int32)


def rotation(d_model: int, seed: int = ROTATION_SEED) -> np.ndarray:
  """float32 [D, D]: a Haar-random orthogonal matrix (QR of a Gaussian, signs fixed)."""
  q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d_model, d_model)))
  return (q * np.sign(np.diag(r))).astype(np.float32)


def intervention_inputs(permutation_BT, rotation_DD, condition: str) -> dict:
  """The traced arrays `intervene` reads: one compilation serves the ablation and its control."""
  if condition not in (ABLATED, CONTROL):
    raise ValueError(f"condition {condition!r}: expected {ABLATED!r} or {CONTROL!r}")
  return {"permutation": jnp.asarray(permutation_BT, jnp.int32),
          "rotation": jnp.asarray(rotation_DD, jnp.float32),
          "replace": jnp.asarray(condition == ABLATED)}


def _intervene(layers: frozenset, inputs: dict, layer: int, boundary: str, x_BTD):
  if boundary != BOUNDARY or layer not in layers:
    return x_BTD
  rows = jnp.arange(x_BTD.shape[0])[:, None]
  moved_BTD = x_BTD[rows, inputs["permutation"]]
  step_BTD = jnp.einsum("btd,de->bte", moved_BTD.astype(jnp.float32) - x_BTD.astype(jnp.float32),
                        inputs["rotation"], precision=jax.lax.Precision.HIGHEST)
  control_BTD = (x_BTD.astype(jnp.float32) + step_BTD).astype(x_BTD.dtype)
  return jnp.where(inputs["replace"], moved_BTD, control_BTD)


@functools.lru_cache(maxsize=64)
def intervener(layers: tuple[int, ...]) -> Callable:
  """`intervene(inputs, layer, boundary, x_BTD) -> x_BTD` for `RecencyHook.sums`: at `layers`'
  mixer boundary the branch output permuted (inputs["replace"]) or the control; elsewhere the
  stream unchanged. One function per tuple of layers (the hook compiles once per function)."""
  return functools.partial(_intervene, frozenset(layers))


@functools.lru_cache(maxsize=16)
def eval_apply(model_def, layers: tuple[int, ...], condition: str, d_model: int,
               rotation_seed: int = ROTATION_SEED) -> Callable:
  """`apply(params, batch) -> logits` under `condition`, reading the batch's "permutation"
  (`context_loss.evaluate_by_context`'s apply; cached, so its compilation is reused)."""
  intervene, rotation_DD = intervener(layers), rotation(d_model, rotation_seed)

  def apply(params, batch):
    inputs = intervention_inputs(batch["permutation"], rotation_DD, condition)
    return model_def.bind(params)(batch["inputs"], positions_BT=batch["positions"],
                                  segment_ids_BT=batch["segment_ids"],
                                  observe=functools.partial(intervene, inputs))
  return apply


def with_permutations(batches: Sequence[dict], seed: int = PERMUTATION_SEED) -> list[dict]:
  """The eval batches, each with its "permutation" within the documents of its rows."""
  seg = np.concatenate([np.asarray(b["segment_ids"]) for b in batches])
  pos = np.concatenate([np.asarray(b["positions"]) for b in batches])
  perm_RT = permutation_within_documents(probe_lib.document_ids(seg, pos), seed)
  splits = np.split(perm_RT, np.cumsum([len(b["segment_ids"]) for b in batches])[:-1])
  return [{**b, "permutation": p} for b, p in zip(batches, splits)]


# ---- statistics over per-cluster sums ----------------------------------------------------------

def _logit_terms(sums: dict, layer: int, lags, far: int, weight_N, sign: float, head_mean: bool):
  """The logit gap Σ w_h ℓ_h(1) − ℓ_h(L) per head (or its head mean) as contrast terms."""
  near_i, far_i = records_lib.near_far(lags, far)
  n = np.asarray(sums["counts"], np.float64)
  s_NLC = np.moveaxis(np.asarray(sums[f"{layer}/logit"], np.float64), -1, 0)
  s_NLC = s_NLC * np.asarray(weight_N, np.float64)[:, None, None]
  s = s_NLC.mean(0) if head_mean else s_NLC
  return [(sign, s[..., near_i, :], n[near_i]), (-sign, s[..., far_i, :], n[far_i])]


def _scale(sums: dict, layer: int):
  """‖M_h‖ ‖ΔG‖ per head: logit gap / alignment (records.readout_fields)."""
  return (np.asarray(sums[f"{layer}/m_norms"], np.float64)
          * float(sums[f"{layer}/delta_norm"]))


def _se(terms) -> float | list:
  value = recency.contrast_stderr(terms)
  return float(value) if np.ndim(value) == 0 else [float(v) for v in value]


def _condition_fields(record: dict, sums: dict, layer: int, lags, far: int) -> dict:
  out = {"gap": record["gap"], "floor": record["floor"], "gap_stderr": record["gap_stderr"]}
  if "logit_gap" in record:
    ones = np.ones(len(record["logit_gap"]))
    out.update({"logit_gap": float(np.mean(record["logit_gap"])),
                "logit_gap_stderr": _se(_logit_terms(sums, layer, lags, far, ones, 1.0, True)),
                "logit_gap_heads": record["logit_gap"],
                "logit_gap_heads_stderr": record["logit_gap_stderr"],
                "logit_gap_null": record["logit_gap_mean_null"],
                "alignment": float(np.mean(record["alignment"])),
                "alignment_heads": record["alignment"]})
  return out


def _difference_fields(a: dict, b: dict, sums_a: dict, sums_b: dict, layer: int, lags,
                       far: int) -> dict:
  """a − b of every field, with standard errors paired over the probe's documents (the
  alignment's with each condition's ‖M‖ ‖ΔG‖ held fixed, as in its record)."""
  near_i, far_i = records_lib.near_far(lags, far)
  n = np.asarray(sums_a["counts"], np.float64)
  key = f"{layer}/{READ_AT}"
  out = {"gap": a["gap"] - b["gap"], "gap_stderr": records_lib.paired_stderr(
      records_lib.gap_terms(np.asarray(sums_a[key], np.float64), n, near_i, far_i)
      + records_lib.gap_terms(np.asarray(sums_b[key], np.float64), n, near_i, far_i, -1.0))}
  if "logit_gap" in a:
    ones = np.ones(len(a["logit_gap_heads"]))
    inv_a, inv_b = 1.0 / _scale(sums_a, layer), 1.0 / _scale(sums_b, layer)

    def terms(weight_a, weight_b, head_mean):
      return (_logit_terms(sums_a, layer, lags, far, weight_a, 1.0, head_mean)
              + _logit_terms(sums_b, layer, lags, far, weight_b, -1.0, head_mean))
    out.update({
        "logit_gap": a["logit_gap"] - b["logit_gap"],
        "logit_gap_stderr": _se(terms(ones, ones, True)),
        "logit_gap_heads": list(np.subtract(a["logit_gap_heads"], b["logit_gap_heads"])),
        "logit_gap_heads_stderr": _se(terms(ones, ones, False)),
        "alignment": a["alignment"] - b["alignment"],
        "alignment_stderr": _se(terms(inv_a, inv_b, True)),
        "alignment_heads": list(np.subtract(a["alignment_heads"], b["alignment_heads"])),
        "alignment_heads_stderr": _se(terms(inv_a, inv_b, False))})
  return {k: [float(x) for x in v] if isinstance(v, list) else float(v) for k, v in out.items()}


def _summary(sums: dict, layers_out: list[dict], readout: list[int], lags, far: int) -> dict:
  """Means over global layers: the gap at their input, and over global NoPE layers and heads
  the logit gap and alignment, per condition and difference (paired SEs over the layers'
  shared documents)."""
  keys = [f"{g['layer']}/{READ_AT}" for g in layers_out]
  mean = lambda rows, key: float(np.mean([r[key] for r in rows])) if rows else None
  out = {}
  for c in CONDITIONS:
    rows = [g[c] for g in layers_out]
    nope = [g[c] for g in layers_out if g["layer"] in readout]
    out[c] = {"gap": mean(rows, "gap"), "logit_gap": mean(nope, "logit_gap"),
              "alignment": mean(nope, "alignment")}
  for name, a, b in DIFFERENCES:
    rows = [g[name] for g in layers_out]
    nope = [g[name] for g in layers_out if g["layer"] in readout]
    gap_terms = (records_lib.mean_gap_terms(sums[a], keys, lags, far)
                 + records_lib.mean_gap_terms(sums[b], keys, lags, far, -1.0))
    logit_terms = [t for layer in readout for s, sign in ((sums[a], 1.0), (sums[b], -1.0))
                   for t in _logit_terms(s, layer, lags, far, np.ones(len(s[f"{layer}/m_norms"])),
                                         sign / len(readout), True)]
    out[name] = {"gap": mean(rows, "gap"), "gap_stderr": records_lib.paired_stderr(gap_terms),
                 "logit_gap": mean(nope, "logit_gap"),
                 "logit_gap_stderr": _se(logit_terms) if readout else None,
                 "alignment": mean(nope, "alignment")}
  return out


def _loss_delta(a: dict, b: dict) -> dict:
  sub = lambda x, y: None if x is None or y is None else float(x - y)
  return {**{k: sub(a[k], b[k]) for k in LOSS_KEYS},
          "loss_by_position": [sub(x, y) for x, y in zip(a["loss_by_position"],
                                                         b["loss_by_position"])]}


# ---- the measurement ---------------------------------------------------------------------------

def measure(hook, params, eval_batches: Sequence[dict], evaluate: Callable, *, step: int,
            layers: Sequence[int], permutation_seed: int = PERMUTATION_SEED,
            rotation_seed: int = ROTATION_SEED) -> dict:
  """The three conditions on `hook`'s probe (`RecencyHook`) and on `eval_batches`;
  `evaluate(batches, apply)`: loss by context position (`context_loss.evaluate_by_context` with
  its model, params and buckets; apply None = the clean forward). `layers`: the local layers
  ablated (`check`). Returns the dict ablation_T<T>.json holds (docs/analysis.md)."""
  layers = tuple(sorted(int(i) for i in layers))
  permutation_BT = permutation_within_documents(hook.doc_ids_BT, permutation_seed)
  rotation_DD = rotation(hook.d_model, rotation_seed)
  sums = {CLEAN: hook.sums(params)}
  for c in (ABLATED, CONTROL):
    sums[c] = hook.sums(params, intervener(layers),
                        intervention_inputs(permutation_BT, rotation_DD, c))
  records = {c: {(r["layer"], r["module"]): r
                 for r in hook.build_records(step, s, data_control=False)}
             for c, s in sums.items()}
  lags, far = hook.lags, hook.far
  globals_out = []
  for layer in [i for i, k in enumerate(hook.kinds) if k == "G"]:
    fields = {c: _condition_fields(records[c][(layer, READ_AT)], sums[c], layer, lags, far)
              for c in CONDITIONS}
    globals_out.append({"layer": layer, "layer_type": layer_type("G"),
                        "nope": layer in hook.readout_layers, **fields,
                        **{name: _difference_fields(fields[a], fields[b], sums[a], sums[b],
                                                    layer, lags, far)
                           for name, a, b in DIFFERENCES}})
  local_out = [{"layer": i, "layer_type": layer_type(hook.kinds[i]),
                # The branch's own recency (its output's cosine gap): gone when ablated.
                "mixer_gap": {c: records[c][(i, BOUNDARY)]["gap"] for c in CONDITIONS},
                "mixer_gap_stderr": {c: records[c][(i, BOUNDARY)]["gap_stderr"]
                                     for c in CONDITIONS}} for i in layers]
  moved = with_permutations(eval_batches, permutation_seed)
  d_model, model_def = hook.d_model, hook.model_def
  evals = {CLEAN: evaluate(list(eval_batches), None),
           **{c: evaluate(moved, eval_apply(model_def, layers, c, d_model, rotation_seed))
              for c in (ABLATED, CONTROL)}}
  return {"step": int(step), "seq_len": int(hook.probe["inputs"].shape[1]), "ablate": "local",
          "conditions": list(CONDITIONS), "far_lag": int(far), "lags": list(lags),
          "permutation_seed": int(permutation_seed), "rotation_seed": int(rotation_seed),
          "local_layers": local_out, "global_layers": globals_out,
          "summary": _summary(sums, globals_out, sorted(hook.readout_layers), lags, far),
          "eval": evals,
          "loss_delta": {name: _loss_delta(evals[a], evals[b]) for name, a, b in DIFFERENCES},
          "probe": {"rows": hook.rows.tolist(), "documents": int(hook.num_docs)},
          "logit_sums": logit_sums(sums, sorted(hook.readout_layers), lags, far)}


def logit_sums(sums: dict, readout: Sequence[int], lags, far: int) -> dict:
  """Per-document sums of each global NoPE layer's logits at lags 1 and L, per condition, and
  their pair counts: what a cross-run verdict needs to put documents in its error
  (analysis.evidence.causal), as the recency sums are for the in-loop records."""
  near_i, far_i = records_lib.near_far(lags, far)
  n = np.asarray(sums[CLEAN]["counts"], np.float64)
  return {"counts": {"near": n[near_i].tolist(), "far": n[far_i].tolist()},
          "layers": [int(i) for i in readout],
          **{c: {str(i): {"near": np.asarray(sums[c][f"{i}/logit"], np.float64)[near_i].tolist(),
                          "far": np.asarray(sums[c][f"{i}/logit"], np.float64)[far_i].tolist()}
                 for i in readout} for c in CONDITIONS}}


def summary_lines(result: dict) -> list[str]:
  """A line per global layer (and one for the loss) for the terminal."""
  def fmt(value, spec="+.4f"):
    return "—" if value is None else format(value, spec)

  locals_ = ", ".join(f"{r['layer']} {r['layer_type']}" for r in result["local_layers"])
  lines = [f"ablation (--ablate=local) of the mixers of layers {locals_} at seq_len "
           f"{result['seq_len']} (permutation seed {result['permutation_seed']}, rotation "
           f"seed {result['rotation_seed']}); differences ± paired SE over "
           f"{result['probe']['documents']} documents:"]
  for g in result["global_layers"]:
    ab, co, ac = (g[name] for name, _, _ in DIFFERENCES)
    text = (f"  layer {g['layer']} global: gap at input {fmt(g[CLEAN]['gap'], '.4f')}, "
            f"ablated − clean {fmt(ab['gap'])} ± {fmt(ab['gap_stderr'], '.4f')}, control − "
            f"clean {fmt(co['gap'])} ± {fmt(co['gap_stderr'], '.4f')}")
    if g["nope"]:
      text += (f" | logit gap {fmt(g[CLEAN]['logit_gap'])}, ablated − clean "
               f"{fmt(ab['logit_gap'])} ± {fmt(ab['logit_gap_stderr'], '.4f')}, control − clean "
               f"{fmt(co['logit_gap'])} ± {fmt(co['logit_gap_stderr'], '.4f')}, ablated − "
               f"control {fmt(ac['logit_gap'])} ± {fmt(ac['logit_gap_stderr'], '.4f')} | "
               f"alignment {fmt(g[CLEAN]['alignment'])} -> {fmt(g[ABLATED]['alignment'])} "
               f"(ablated), {fmt(g[CONTROL]['alignment'])} (control)")
    lines.append(text)
  ev, delta = result["eval"], result["loss_delta"]
  lines.append(f"  eval loss {ev[CLEAN]['loss']:.4f} clean, ablated − clean "
               f"{fmt(delta['ablated_minus_clean']['loss'])}, control − clean "
               f"{fmt(delta['control_minus_clean']['loss'])}")
  return lines
