"""Checkpoint analysis of one run: recency at any length, loss by position, length extrapolation.

`analyze(run, step=, seq_len=, lengths=)` restores a checkpoint (`checkpoints.py`), measures
it with the in-loop `RecencyHook` on eval data of length `seq_len` (the training length by
default, longer allowed), next to the same measurement of the model re-initialised with the
run's seed (= step 0 of recency.jsonl), scores the eval data by context position, and for each
factor k in `lengths` scores k x the training length (length extrapolation). It writes JSON and
PNG figures to WORKDIR/analysis/step_<N>/ (docs/analysis.md lists them).

Definitions used here and by `compare.py`:
- context position of a token = how many earlier tokens of its own document its row holds
  (attention stays inside a document). On TextbookChapters (one chapter per row from its first
  token) it is the row index, as in the training loop's eval_loss_by_position; on the packed
  stdlib demo rows it is smaller wherever a row starts mid-document or holds several documents.
- run gap = mean over global layers of the gap at `pre_mixer_norm`, the normalised input that
  global attention reads (DESIGN.md stage 3); run logit gap / alignment = mean over global NoPE
  layers and heads.
- extrapolation loss ratio at k x = loss over tokens at context positions >= T (the training
  length) / loss over tokens at context positions in [T/2, T), both in the same k x rows: loss
  beyond the trained length against loss just before it (comparing with all positions < T would
  mix in the short-context positions, which are harder whatever the model). Above 1: the model
  gets worse beyond the length it trained on.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from hybrid_nope.run import run_dir, storage
from hybrid_nope.analysis.checkpoint import ablation, init_null
from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.analysis.checkpoint.context_loss import evaluate_by_context
from hybrid_nope.analysis.present import plots
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure.hook import DATA_LAYER_TYPE, RecencyHook
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import registry
from hybrid_nope.model.definition import ModelDef, init_model
from hybrid_nope.model.pattern import window_of
from hybrid_nope.run.reader import RunReader

DEFAULT_LENGTHS = (1, 2, 4)
SUMMARY_MODULE = "pre_mixer_norm"  # Where the run gap is read: global attention's input.
GATE_KEYS = ("mean_decay", "mean_beta", "recency_scale")  # Recurrent layers' gate summaries.


# ---- summaries and lags (pure functions over records and lengths) ---------------------------

def summarize(records: Sequence[dict]) -> dict[str, float | None]:
  """Run gap, floor, logit gap and alignment (see module docstring), their noise levels, and
  the data control's gap; None where undefined.

  gap_stderr: the layers' paired (per-document) gap SEs averaged, the bound for fully correlated
  layers (they share the probe); likewise logit_gap_stderr over heads and layers.
  logit_gap_null and alignment_null: the random-M null standard deviation of the mean that is
  shown (over every head of every global NoPE layer, `recency.null_of_mean`), not one head's.
  shuffled_gap: the same model on the probe with tokens shuffled in each document.
  GATE_KEYS: the recurrent layers' means where the pattern has one kind of recurrent mixer;
  with GLA and delta layers both, per kind (`linear_mean_decay`, ...) and None unprefixed.
  """
  inputs = [r for r in records if r["layer_type"] == "global" and r["module"] == SUMMARY_MODULE]
  readout = [r for r in inputs if "logit_gap" in r]
  data = [r for r in records if r["layer_type"] == DATA_LAYER_TYPE]
  gated = [r for r in records if "mean_decay" in r and r["module"] == SUMMARY_MODULE]
  by_kind = {kind: [r for r in gated if r["layer_type"] == kind]
             for kind in sorted({r["layer_type"] for r in gated})}
  one_kind = next(iter(by_kind.values())) if len(by_kind) == 1 else []

  def mean(values):
    return float(np.mean(values)) if len(values) else None

  def field(key, rs=inputs):
    return mean([r[key] for r in rs if key in r])

  def heads(key):
    return [v for r in readout for v in r.get(key, [])]

  return {"gap": field("gap"), "floor": field("floor"), "gap_stderr": field("gap_stderr"),
          "gap_matched": field("gap_matched"), "shuffled_gap": field("shuffled_gap"),
          "shuffled_floor": field("shuffled_floor"),
          "logit_gap": mean(heads("logit_gap")),
          "logit_gap_stderr": mean(heads("logit_gap_stderr")),
          "logit_gap_null": (recency.null_of_mean(heads("logit_gap_null"))
                             if heads("logit_gap_null") else None),
          "alignment": mean(heads("alignment")),
          "alignment_stderr": mean(heads("alignment_stderr")),
          "alignment_null": (recency.null_of_mean(heads("alignment_null"))
                             if heads("alignment_null") else None),
          "data_gap": field("gap", data),
          # The recurrent layers' gates: the mean α, the delta rule's mean β and the recency
          # scale (1/(1 − α) for GLA, 1/(1 − α(1 − β/H)) for the delta rule). A pattern with
          # both kinds gets them per kind below and None here: their α mean different things.
          **{key: field(key, one_kind) for key in GATE_KEYS},
          **({f"{kind}_{key}": field(key, rs) for kind, rs in by_kind.items()
              for key in GATE_KEYS if any(key in r for r in rs)} if len(by_kind) > 1 else {})}


def analysis_lags(seq_len: int, far_lag: int, window: int | None) -> tuple[int, ...]:
  """The hook's lags (powers of two to far_lag, far_lag, window) extended by every power of two
  below seq_len, so a longer analysis length gives a longer profile; floor and gap stay at
  far_lag, as in training."""
  longest = 1 << (seq_len - 1).bit_length() - 1  # Largest power of two < seq_len.
  lags = set(recency.default_lags(far_lag, window)) | set(recency.default_lags(longest))
  if window is not None and window < seq_len:
    lags.add(window)
  return tuple(sorted(lags))


# ---- measurement -----------------------------------------------------------------------------

_HOOKS: dict = {}  # (model_def, config JSON, lags) -> hook: one compilation per model and length.


def _hook(config, model_def: ModelDef, eval_batches: Sequence[dict], lags) -> RecencyHook:
  """The in-loop hook with a longer list of lags (floor, gap and alignment still at far_lag),
  cached; the config (which fixes the eval data, hence the probe) is part of the key."""
  key = (model_def, config.to_json(sort_keys=True), tuple(lags))
  if key not in _HOOKS:
    if len(_HOOKS) >= 8:
      _HOOKS.pop(next(iter(_HOOKS)))
    _HOOKS[key] = RecencyHook(config, model_def, eval_batches, writer=None, lags=lags)
  return _HOOKS[key]


def _with_seq_len(config, seq_len: int) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(config.to_dict())
  # The probe's pool keeps its tokens (so its documents) at any length: rows scale inversely.
  pool = config.metrics.probe_pool_rows * config.data.seq_len // seq_len
  config.metrics.probe_pool_rows = max(pool, config.metrics.probe_batch_size)
  config.data.seq_len = seq_len
  far = config.metrics.far_lag
  if not 1 <= far < seq_len:
    raise checkpoints.AnalysisError(
        f"metrics.far_lag={far} must be < the analysis length {seq_len} (floor = f(far_lag)); "
        f"analyse at a longer --seq_len or pass --config.metrics.far_lag=")
  return config


def measure(config, seq_len: int, model_def: ModelDef, params, *, step: int,
            init_params=None, train_seq_len: int | None = None,
            rows_per_call: int | None = None, recency: bool = True) -> dict[str, Any]:
  """Recency records (and init records if `init_params`) and eval loss at `seq_len`; with
  `recency` False the eval loss alone."""
  config = _with_seq_len(config, seq_len)
  batches = loader.eval_batches(config)
  evaluate = lambda: evaluate_by_context(model_def, params, batches,
                                         bucket_size=config.eval.bucket_size,
                                         train_seq_len=train_seq_len or seq_len,
                                         rows_per_call=rows_per_call)
  if not recency:
    return {"seq_len": seq_len, "eval": evaluate()}
  lags = analysis_lags(seq_len, config.metrics.far_lag,
                       window_of(config.model))
  hook = _hook(config, model_def, loader.probe_pool(config), lags)
  result = {"seq_len": seq_len, "lags": list(lags),
            "probe_sequences": len(hook.rows), "probe": hook.describe(),
            "records": hook.records(step, params, data_control=True)}
  if init_params is not None:
    result["init_records"] = hook.records(0, init_params)
  result["eval"] = evaluate()
  return result


def check_data(config) -> None:
  """Fails early, naming the key, when the eval data a source needs is not on this machine."""
  if "eval.path" in registry.named(config).path_keys:
    path = config.eval.get("path", "")
    if not path:
      raise checkpoints.DataPathError(
          "config.eval.path is empty: the run evaluates on TextbookChapters (data.source='mds'); "
          "pass --config.eval.path=/path/to/textbook_chapters")
    if not os.path.exists(path):
      raise checkpoints.DataPathError(
          f"config.eval.path={path} does not exist on this machine: pass the prepared "
          f"TextbookChapters directory with --config.eval.path=")


def check_eval_tokenizer(run: RunReader, config) -> None:
  """An imported model (it carries its tokenizer) on prepared eval data: fails early, naming
  both files, when the data was tokenised with another vocabulary (textbook_chapters copies
  the tokenizer.json it used into the prepared directory)."""
  carried = run.tokenizer_path()
  if (carried is None or "eval.path" not in registry.named(config).path_keys
      or not config.eval.get("path", "")):
    return
  import tokenizers  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.sources import textbook_chapters  # pylint: disable=g-import-not-at-top
  used = os.path.join(textbook_chapters.dataset_dir(config.eval.path),
                      textbook_chapters.TOKENIZER_BASENAME)
  vocab = lambda path: tokenizers.Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
  if os.path.isfile(used) and vocab(used) != vocab(carried):
    raise checkpoints.DataPathError(
        f"config.eval.path={config.eval.path} was tokenised with {used}, whose vocabulary is "
        f"not the model's ({carried}): prepare the text again with "
        f"python -m hybrid_nope.data.sources.textbook_chapters --tokenizer={carried}")


def _write_json(path: str, obj) -> str:
  storage.write_text(path, storage.to_json(obj) + "\n")  # NaN as null
  return path


def analyze(run: RunReader, *, step: int | None = None, seq_len: int | None = None,
            lengths: Sequence[int] = DEFAULT_LENGTHS,
            overrides: Mapping[str, Any] | None = None, out_dir: str | None = None,
            rows_per_call: int | None = None, figures: bool = True,
            init_seeds: int = 0, ablate: str | None = None,
            recency_lengths: Sequence[int] | None = None) -> dict[str, Any]:
  """Analyses checkpoint `step` (None = latest) of `run`.

  `init_seeds`: also measure K fresh initialisations on the same probe (the empirical init
  null, `analysis.checkpoint.init_null`), written to init_null_T<seq_len>.json; 0 = skip.
  `ablate`: "local" also runs the causal test (`analysis.checkpoint.ablation`: the local
  mixers' outputs permuted within documents, against controls matched in norm and eval loss) at
  seq_len,
  written to ablation_T<seq_len>.json; None = skip. A pattern without a local mixer fails
  before anything is restored.

  `seq_len`: analysis length (None = the training length); `lengths`: factors of the training
  length to score for extrapolation (empty = skip); `overrides`: {"eval.path": ...} applied to
  the run's config (not data.seq_len: use `seq_len`); `recency_lengths`: the factors of
  `lengths` whose rows also carry the recency records (None = all; the others are scored for
  loss alone: the hook's cost grows with the length, the loss's barely); `rows_per_call`: eval
  rows per forward pass (None = eval.batch_size), to bound memory at long lengths; `out_dir`:
  default WORKDIR/analysis/step_<N>. Returns {"step", "out_dir", "files", "analysis", "extrapolation"}.
  """
  if overrides and "data.seq_len" in overrides:
    raise checkpoints.AnalysisError(
        "config override data.seq_len: the run's config keeps its training length (the base of "
        "the extrapolation factors); pass the analysis length as seq_len (--seq_len=)")
  config = checkpoints.apply_overrides(run.config, overrides)
  train_T = int(config.data.seq_len)
  seq_len = int(seq_len or train_T)
  lengths = [int(k) for k in lengths]
  if any(k < 1 for k in lengths):
    raise checkpoints.AnalysisError(f"lengths={lengths}: factors must be integers >= 1")
  recency_at = set(lengths if recency_lengths is None else (int(k) for k in recency_lengths))
  if not recency_at <= set(lengths):
    raise checkpoints.AnalysisError(
        f"recency_lengths={sorted(recency_at)}: each must be one of lengths={lengths}")
  ablated_layers = ablation.check(ablate, config.model) if ablate else None
  check_data(config)
  check_eval_tokenizer(run, config)
  _with_seq_len(config, seq_len)  # Fails on far_lag before anything is restored.
  step, model_def, params = checkpointed.restore_params(run.with_config(config), step)
  # On the restored params' device, so both share one compilation.
  init_params = jax.device_put(init_model(config.model, config.train.seed)[1],
                               jax.tree.leaves(params)[0].sharding)

  out_dir = out_dir or run.layout.analysis_dir(step)
  storage.makedirs(out_dir)
  main = measure(config, seq_len, model_def, params, step=step, init_params=init_params,
                 train_seq_len=train_T, rows_per_call=rows_per_call)
  where = run.workdir if storage.is_url(run.workdir) else os.path.abspath(run.workdir)
  analysis = {"workdir": where, "step": step, "train_seq_len": train_T,
              "far_lag": int(config.metrics.far_lag),
              "summary": {"init": summarize(main["init_records"]),
                          "step": summarize(main["records"])}, **main}
  if init_seeds:
    at_length = _with_seq_len(config, seq_len)
    hook = _hook(at_length, model_def, loader.probe_pool(at_length), main["lags"])
    place = init_null.on_device_of(params)
    null = init_null.measure(lambda p: hook.records(0, p),
                             lambda seed: place(init_model(config.model, seed)[1]),
                             summarize, init_seeds)
    analysis["init_null"] = null["summary"]
    _write_json(storage.join(out_dir, run_dir.INIT_NULL_FILE.format(seq_len=seq_len)), null)
  files = [_write_json(storage.join(out_dir, run_dir.ANALYSIS_FILE.format(seq_len=seq_len)),
                       analysis)]
  causal = None
  if ablated_layers:
    at_length = _with_seq_len(config, seq_len)
    hook = _hook(at_length, model_def, loader.probe_pool(at_length), main["lags"])
    evaluate = lambda batches, token_losses: evaluate_by_context(
        model_def, params, batches, bucket_size=config.eval.bucket_size, train_seq_len=train_T,
        rows_per_call=rows_per_call, token_losses=token_losses)
    causal = {"workdir": where, "train_seq_len": train_T,
              **ablation.measure(hook, params, loader.eval_batches(at_length), evaluate,
                                 step=step, layers=ablated_layers)}
    files.append(_write_json(
        storage.join(out_dir, run_dir.ABLATION_FILE.format(seq_len=seq_len)), causal))
  if figures:
    files += plots.run_figures(analysis, out_dir, suffix=f"_T{seq_len}")

  extrapolation = None
  if lengths:
    rows = []
    for k in sorted(set(lengths)):
      at = main if k * train_T == seq_len else measure(
          config, k * train_T, model_def, params, step=step, train_seq_len=train_T,
          rows_per_call=rows_per_call, recency=k in recency_at)
      rows.append({"factor": k, **at["eval"],
                   **(summarize(at["records"]) if "records" in at else {})})
    extrapolation = {"workdir": where, "step": step,
                     "train_seq_len": train_T, "lengths": rows}
    files.append(_write_json(storage.join(out_dir, run_dir.EXTRAPOLATION_FILE), extrapolation))
    if figures:
      files.append(plots.extrapolation(extrapolation, storage.join(out_dir, "extrapolation.png")))
  return {"step": step, "out_dir": out_dir, "files": files, "analysis": analysis,
          "extrapolation": extrapolation, "ablation": causal}


def summary_text(result: dict) -> str:
  """A few lines for the terminal: what was measured and where it went."""
  a = result["analysis"]

  def fmt(value, spec=".4f"):
    return "—" if value is None else format(value, spec)

  init, now = a["summary"]["init"], a["summary"]["step"]
  lines = [f"step {a['step']} at seq_len {a['seq_len']} (trained at {a['train_seq_len']}): "
           f"eval loss {a['eval']['loss']:.4f}",
           f"  gap {fmt(init['gap'])} -> {fmt(now['gap'])}, floor {fmt(init['floor'])} -> "
           f"{fmt(now['floor'])}, logit gap {fmt(init['logit_gap'], '+.4f')} -> "
           f"{fmt(now['logit_gap'], '+.4f')} ± {fmt(now['logit_gap_stderr'])} (init -> step; "
           f"global layers' input)",
           f"  alignment {fmt(now['alignment'], '+.4f')} (a random M: ± "
           f"{fmt(now['alignment_null'])}); data control P(t_i = t_i-d) gap "
           f"{fmt(now['data_gap'])}; probe {a['probe']['documents']} documents in "
           f"{len(a['probe']['rows'])} rows"]
  null = a.get("init_null")
  if null:
    z = {k: init_null.zscore(now.get(k), null.get(k)) for k in ("gap", "logit_gap", "alignment")}
    lines.append(f"  against {null['gap']['draws']} fresh initialisations (init null): z gap "
                 f"{fmt(z['gap'], '+.1f')}, logit gap {fmt(z['logit_gap'], '+.1f')}, alignment "
                 f"{fmt(z['alignment'], '+.1f')}; random-M null of the head-mean logit gap ± "
                 f"{fmt(now['logit_gap_null'])}")
  for row in (result["extrapolation"] or {}).get("lengths", []):
    lines.append(f"  {row['factor']}x ({row['seq_len']}): loss {row['loss']:.4f}, positions "
                 f"[T/2, T) {fmt(row['loss_near'])}, >= T {fmt(row['loss_beyond'])}, ratio "
                 f"{fmt(row['ratio'])}, gap {fmt(row.get('gap'))}")
  if result.get("ablation"):
    lines += ablation.summary_lines(result["ablation"])
  lines.append(f"  outputs in {result['out_dir']}")
  return "\n".join(lines)
