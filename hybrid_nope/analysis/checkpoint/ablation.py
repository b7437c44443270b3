"""The causal test of stage 3: do global NoPE layers read out the recency local layers plant?

`python launch/analyze.py --workdir=DIR --ablate=local` (report.analyze calls `measure`) runs
the probe and the eval rows through the trained model under each condition (the interventions
are controls.py's; every one replaces the mixer's branch output h at every local layer S, L, D
and leaves padding as it is):

- clean: no intervention (the analysis's own forward);
- ablated: h permuted within each document: content and norms kept, position gone;
- rotated: the first control, h + (h_π − h) R (R Haar); kept for old files, whose name for it
  was "control". Its perturbation keeps ⟨h_t, h_s⟩ and so adds recency: not a null for position;
- noise: i.i.d. Gaussian directions at the ablation's per-token norm: content and position gone;
- other_row: another row's branch at the same positions (a fixed derangement of the forward's
  rows) at the ablation's per-token norm: position kept, content gone;
- added_noise, scattered: h kept, plus a perturbation of the ablation's per-token norm
  ‖h_π − h‖ that carries no position: i.i.d. Gaussian directions, or the ablation's own
  perturbations moved to other tokens of the forward (controls.py);
- noise_matched, other_row_matched, added_noise_matched, scattered_matched: the same four, their
  dial λ bisected on the eval loss so that each costs what the ablation costs (within
  controls.DAMAGE_TOLERANCE nats; `damage` records λ, the loss reached and whether it matched).
  λ < 1 keeps (1 − λ) of h; λ > 1 scales the target's norm up (the added perturbation's, for
  the two that keep h), so a matched control is damage-matched, the λ = 1 one norm-matched.

One permutation (PERMUTATION_SEED, over the probe's documents) serves every local layer, the
noise and derangement are seeded, so runs and checkpoints pair. Each condition is measured with
the recency hook at each global layer's normalised input (gap, logit gap, alignment) and scored
by context position (`context_loss.evaluate_by_context`); every difference shares the probe's
documents, so its standard error is paired over them (`recency.contrast_stderr`).

Reading (docs/analysis.md lists every key):
- the causal statistic is ablated − added_noise_matched (CONTROL): position removed against
  the branch kept plus position-free noise of the same damage (files older than it read
  noise_matched, noise in the branch's place, which removes position as the ablation does).
  `logit_gap` is the raw (unsigned) change;
  `logit_gap_signed` multiplies each layer's by the sign of its clean logit gap (negative: the
  read-out shrinks toward 0 whichever way it pointed). Any destructive intervention shrinks a
  read-out; the matched control's damage is the ablation's, so what is left is position.
- what is specific to position: ablated − noise (both lose position; the ablation keeps content)
  and ablated − other_row (the ablation keeps content, other_row keeps position). Their
  difference, other_row − noise (`other_row_minus_noise`, and at matched damage
  `other_row_matched_minus_noise_matched`), is what the branch's position alone is worth with
  content gone in both: a read-out of planted recency shows a larger logit gap under other_row.
- the controls' own effect on the global input's gap (`<control>_minus_clean.gap`): noise and
  ablated both remove the branch's recency (both fall); rotated raises it (the flaw above);
  other_row keeps it (≈ 0). A local layer's `mixer_gap` per condition is the branch's own
  recency: ≈ 0 under ablated and noise, near clean under other_row.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hybrid_nope.analysis.checkpoint import controls
from hybrid_nope.run.checkpoints import AnalysisError
from hybrid_nope.analysis.checkpoint.controls import (  # noqa: F401  (the module's interface)
    ABLATED, ADDED_NOISE, BOUNDARY, NOISE, OTHER_ROW, PERMUTATION_SEED, ROTATED, ROTATION_SEED,
    SCATTERED, eval_token_losses, for_condition, intervener, intervention_inputs,
    permutation_within_documents, rotation, with_permutations)
from hybrid_nope.analysis.measure import probe as probe_lib
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure import records as records_lib
from hybrid_nope.model.kind_specs import kinds_where
from hybrid_nope.model.pattern import layer_kinds, layer_type

ABLATE_CHOICES = ("local",)  # What --ablate may name: the local mixers' outputs.
CLEAN = "clean"
NOISE_MATCHED, OTHER_ROW_MATCHED = f"{NOISE}_matched", f"{OTHER_ROW}_matched"
ADDED_NOISE_MATCHED, SCATTERED_MATCHED = f"{ADDED_NOISE}_matched", f"{SCATTERED}_matched"
MATCHED = {NOISE_MATCHED: NOISE, OTHER_ROW_MATCHED: OTHER_ROW,  # Damage-matched: its target.
           ADDED_NOISE_MATCHED: ADDED_NOISE, SCATTERED_MATCHED: SCATTERED}
ALL_CONDITIONS = (CLEAN, ABLATED, ROTATED, NOISE, OTHER_ROW, NOISE_MATCHED, OTHER_ROW_MATCHED,
                  ADDED_NOISE, SCATTERED, ADDED_NOISE_MATCHED, SCATTERED_MATCHED)
# The causal verdict's control: the branch kept plus position-free noise at the ablation's
# eval loss (equal damage, the branch's position kept, none added). Older files: NOISE_MATCHED.
CONTROL = ADDED_NOISE_MATCHED
CONDITIONS = (CLEAN, ABLATED, CONTROL)  # What the causal verdict reads (evidence/causal.py).
LEGACY_CONTROL = "control"  # Old files' name for ROTATED.
DIFFERENCES = tuple(
    [(f"{c}_minus_{CLEAN}", c, CLEAN) for c in ALL_CONDITIONS[1:]]
    + [(f"{ABLATED}_minus_{c}", ABLATED, c) for c in ALL_CONDITIONS[2:]]
    + [(f"{OTHER_ROW}_minus_{NOISE}", OTHER_ROW, NOISE),  # Position alone, content gone in both.
       (f"{OTHER_ROW_MATCHED}_minus_{NOISE_MATCHED}", OTHER_ROW_MATCHED, NOISE_MATCHED)])
READ_AT = "pre_mixer_norm"  # Where a global layer's read-out is measured: its normalised input.
LOSS_KEYS = ("loss", "loss_within", "loss_near", "loss_beyond")


def target_of(condition: str) -> str:
  """The controls.MODES target a condition uses (a matched one: its control's)."""
  return MATCHED.get(condition, condition)


# ---- which layers ------------------------------------------------------------------------------

def check(ablate: str, model_cfg) -> list[int]:
  """The local layers `ablate` names; raises AnalysisError (one line) for another value, a
  pattern with no local mixer (e.g. "G") or one with no global layer to read out."""
  if ablate not in ABLATE_CHOICES:
    raise AnalysisError(f"--ablate={ablate}: expected one of {', '.join(ABLATE_CHOICES)} "
                        f"(local: the outputs of the local mixers S, L and D)")
  pattern = model_cfg.pattern
  kinds = layer_kinds(pattern, model_cfg.num_layers)
  local = kinds_where(kinds, lambda spec: spec.local)
  if not local:
    raise AnalysisError(f"--ablate={ablate}: model.pattern={pattern!r} has no local mixer "
                        f"(S, L or D) to ablate; the causal test needs a hybrid such as 'SG'")
  if not kinds_where(kinds, lambda spec: spec.global_attention):
    raise AnalysisError(f"--ablate={ablate}: model.pattern={pattern!r} has no global layer (G) "
                        f"whose read-out the causal test measures")
  return local


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
                       far: int, clean_sign: float) -> dict:
  """a − b of every field, with standard errors paired over the probe's documents (the
  alignment's with each condition's ‖M‖ ‖ΔG‖ held fixed, as in its record);
  `logit_gap_signed`: the head-mean change times `clean_sign` (the clean logit gap's sign)."""
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
        "logit_gap_signed": clean_sign * (a["logit_gap"] - b["logit_gap"]),
        "logit_gap_heads": list(np.subtract(a["logit_gap_heads"], b["logit_gap_heads"])),
        "logit_gap_heads_stderr": _se(terms(ones, ones, False)),
        "alignment": a["alignment"] - b["alignment"],
        "alignment_stderr": _se(terms(inv_a, inv_b, True)),
        "alignment_heads": list(np.subtract(a["alignment_heads"], b["alignment_heads"])),
        "alignment_heads_stderr": _se(terms(inv_a, inv_b, False))})
  return {k: [float(x) for x in v] if isinstance(v, list) else float(v) for k, v in out.items()}


def _summary(sums: dict, layers_out: list[dict], readout: list[int], lags, far: int) -> dict:
  """Means over global layers: the gap at their input, and over global NoPE layers and heads
  the logit gap (unsigned, and signed per layer by its clean logit gap) and alignment, per
  condition and difference (paired SEs over the layers' shared documents)."""
  keys = [f"{g['layer']}/{READ_AT}" for g in layers_out]
  signs = {g["layer"]: float(np.sign(g[CLEAN]["logit_gap"])) for g in layers_out
           if g["layer"] in readout}
  mean = lambda rows, key: float(np.mean([r[key] for r in rows])) if rows else None
  out = {}
  for c in ALL_CONDITIONS:
    rows = [g[c] for g in layers_out]
    nope = [g[c] for g in layers_out if g["layer"] in readout]
    out[c] = {"gap": mean(rows, "gap"), "logit_gap": mean(nope, "logit_gap"),
              "alignment": mean(nope, "alignment")}
  for name, a, b in DIFFERENCES:
    rows = [g[name] for g in layers_out]
    nope = [g[name] for g in layers_out if g["layer"] in readout]
    gap_terms = (records_lib.mean_gap_terms(sums[a], keys, lags, far)
                 + records_lib.mean_gap_terms(sums[b], keys, lags, far, -1.0))

    def logit_terms(signed):
      return [t for layer in readout for s, sign in ((sums[a], 1.0), (sums[b], -1.0))
              for t in _logit_terms(s, layer, lags, far, np.ones(len(s[f"{layer}/m_norms"])),
                                    sign * (signs[layer] if signed else 1.0) / len(readout),
                                    True)]
    out[name] = {"gap": mean(rows, "gap"), "gap_stderr": records_lib.paired_stderr(gap_terms),
                 "logit_gap": mean(nope, "logit_gap"),
                 "logit_gap_stderr": _se(logit_terms(False)) if readout else None,
                 "logit_gap_signed": mean(nope, "logit_gap_signed"),
                 "logit_gap_signed_stderr": _se(logit_terms(True)) if readout else None,
                 "alignment": mean(nope, "alignment")}
  return out


def _loss_delta(a: dict, b: dict) -> dict:
  sub = lambda x, y: None if x is None or y is None else float(x - y)
  return {**{k: sub(a[k], b[k]) for k in LOSS_KEYS},
          "loss_by_position": [sub(x, y) for x, y in zip(a["loss_by_position"],
                                                         b["loss_by_position"])]}


# ---- the measurement ---------------------------------------------------------------------------

def evaluate_conditions(eval_batches: Sequence[dict], evaluate: Callable,
                        token_losses: Callable, *,
                        permutation_seed: int = PERMUTATION_SEED,
                        tolerance: float = controls.DAMAGE_TOLERANCE) -> tuple[dict, dict]:
  """Every condition's loss by context position, the damage-matched ones' λ found by
  `controls.match_damage` on the eval loss. Returns (evals by condition, damage: per matched
  condition {"lam", "loss", "target", "matched", "trace", "tolerance"}; every condition's λ is
  in "lams")."""
  moved = with_permutations(eval_batches, permutation_seed)
  run = lambda c, lam=1.0: evaluate(for_condition(moved, c, lam), token_losses)
  evals = {CLEAN: evaluate(list(eval_batches), None)}
  # other_row first: a forward of one row (rows_per_call=1) has no other row and fails here.
  evals.update({c: run(c) for c in (OTHER_ROW, *(m for m in controls.MODES if m != OTHER_ROW))})
  damage = {}
  for name, c in MATCHED.items():
    seen = {1.0: evals[c]}

    def loss_at(lam, c=c, seen=seen):
      seen[lam] = run(c, lam)
      return seen[lam]["loss"]
    found = controls.match_damage(loss_at, evals[ABLATED]["loss"], tolerance=tolerance,
                                  known={1.0: evals[c]["loss"]})
    evals[name] = seen[found["lam"]]
    damage[name] = {**found, "tolerance": float(tolerance)}
  damage["lams"] = {c: (damage[c]["lam"] if c in MATCHED else 1.0) for c in ALL_CONDITIONS[1:]}
  return evals, damage


def measure(hook, params, eval_batches: Sequence[dict], evaluate: Callable, *, step: int,
            layers: Sequence[int], permutation_seed: int = PERMUTATION_SEED,
            rotation_seed: int = ROTATION_SEED) -> dict:
  """Every condition (module docstring) on `hook`'s probe (`RecencyHook`) and on
  `eval_batches`; `evaluate(batches, token_losses)`: loss by context position
  (`context_loss.evaluate_by_context` with its model, params and buckets; None = the
  clean forward). `layers`: the local layers ablated (`check`). The eval losses come first: the
  matched controls' λ is found on them, then used on the probe. Returns the dict
  ablation_T<T>.json holds (docs/analysis.md)."""
  layers = tuple(sorted(int(i) for i in layers))
  token_losses = eval_token_losses(hook.model_def, layers, hook.d_model, rotation_seed)
  evals, damage = evaluate_conditions(eval_batches, evaluate, token_losses,
                                      permutation_seed=permutation_seed)
  permutation_BT = permutation_within_documents(hook.doc_ids_BT, permutation_seed)
  in_document_BT = np.asarray(hook.doc_ids_BT) != probe_lib.NOT_A_DOCUMENT
  rotation_DD = rotation(hook.d_model, rotation_seed)
  sums = {CLEAN: hook.sums(params)}
  for c in ALL_CONDITIONS[1:]:
    sums[c] = hook.sums(params, intervener(layers), intervention_inputs(
        permutation_BT, in_document_BT, rotation_DD, target_of(c), damage["lams"][c]))
  records = {c: {(r["layer"], r["module"]): r
                 for r in hook.build_records(step, s, data_control=False)}
             for c, s in sums.items()}
  lags, far = hook.lags, hook.far
  globals_out = []
  for layer in kinds_where(hook.kinds, lambda spec: spec.global_attention):
    fields = {c: _condition_fields(records[c][(layer, READ_AT)], sums[c], layer, lags, far)
              for c in ALL_CONDITIONS}
    sign = float(np.sign(fields[CLEAN].get("logit_gap", 0.0)))
    globals_out.append({"layer": layer, "layer_type": layer_type(hook.kinds[layer]),
                        "nope": layer in hook.readout_layers, **fields,
                        **{name: _difference_fields(fields[a], fields[b], sums[a], sums[b],
                                                    layer, lags, far, sign)
                           for name, a, b in DIFFERENCES}})
  local_out = [{"layer": i, "layer_type": layer_type(hook.kinds[i]),
                # The branch's own recency (its output's cosine gap): gone when ablated.
                "mixer_gap": {c: records[c][(i, BOUNDARY)]["gap"] for c in ALL_CONDITIONS},
                "mixer_gap_stderr": {c: records[c][(i, BOUNDARY)]["gap_stderr"]
                                     for c in ALL_CONDITIONS}} for i in layers]
  return {"step": int(step), "seq_len": int(hook.probe["inputs"].shape[1]), "ablate": "local",
          "conditions": list(ALL_CONDITIONS), "control": CONTROL, "far_lag": int(far),
          "lags": list(lags), "permutation_seed": int(permutation_seed),
          "rotation_seed": int(rotation_seed), "noise_seed": controls.NOISE_SEED,
          "derangement_seed": controls.DERANGEMENT_SEED,
          "added_noise_seed": controls.ADDED_NOISE_SEED, "scatter_seed": controls.SCATTER_SEED,
          "damage": damage,
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
                 for i in readout} for c in sums}}


def summary_lines(result: dict) -> list[str]:
  """A line per global layer and control (and the losses) for the terminal."""
  def fmt(value, spec="+.4f"):
    return "—" if value is None else format(value, spec)

  control = result.get("control", LEGACY_CONTROL)
  controls_ = [c for c in result["conditions"] if c not in (CLEAN, ABLATED)]
  locals_ = ", ".join(f"{r['layer']} {r['layer_type']}" for r in result["local_layers"])
  lines = [f"ablation (--ablate=local) of the mixers of layers {locals_} at seq_len "
           f"{result['seq_len']} (permutation seed {result['permutation_seed']}); the causal "
           f"statistic is ablated − {control}; differences ± paired SE over "
           f"{result['probe']['documents']} documents:"]
  for g in result["global_layers"]:
    ab = g[f"{ABLATED}_minus_{CLEAN}"]
    text = (f"  layer {g['layer']} global: gap at input {fmt(g[CLEAN]['gap'], '.4f')}, "
            f"ablated − clean {fmt(ab['gap'])} ± {fmt(ab['gap_stderr'], '.4f')}")
    if g["nope"]:
      ac = g[f"{ABLATED}_minus_{control}"]
      text += (f" | logit gap {fmt(g[CLEAN]['logit_gap'])}, ablated − clean "
               f"{fmt(ab['logit_gap'])} ± {fmt(ab['logit_gap_stderr'], '.4f')}, ablated − "
               f"{control} {fmt(ac['logit_gap'])} ± {fmt(ac['logit_gap_stderr'], '.4f')} "
               f"(signed by the clean gap {fmt(ac.get('logit_gap_signed'))})")
    lines.append(text)
    for c in controls_:
      co, ac = g[f"{c}_minus_{CLEAN}"], g[f"{ABLATED}_minus_{c}"]
      text = (f"    {c:<17} − clean: gap {fmt(co['gap'])} ± {fmt(co['gap_stderr'], '.4f')}")
      if g["nope"]:
        text += (f", logit gap {fmt(co['logit_gap'])} ± {fmt(co['logit_gap_stderr'], '.4f')}"
                 f"; ablated − {c}: logit gap {fmt(ac['logit_gap'])} ± "
                 f"{fmt(ac['logit_gap_stderr'], '.4f')}")
      lines.append(text)
  ev = result["eval"]
  damage = result.get("damage", {})
  losses = ", ".join(
      f"{c} {ev[c]['loss']:.4f}" + (f" (λ {damage[c]['lam']:.3f}"
                                    f"{'' if damage[c]['matched'] else ', not matched'})"
                                    if c in damage else "")
      for c in result["conditions"])
  lines.append(f"  eval loss: {losses}")
  return lines
