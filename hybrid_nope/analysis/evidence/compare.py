"""A sweep of runs side by side: one markdown table, figures, and the correlation between
recency and length extrapolation.

Reads only files (no model is run): each run's config.json, metrics.jsonl (eval records),
recency.jsonl, and, where `launch/analyze.py` has been run, the latest
analysis/step_<N>/extrapolation.json. The run gap, logit gap and extrapolation ratio are defined
in `report.py`.

Runs whose configs differ only in their seeds (`train.seed`, and `data.seed`, which follows
it) are one configuration: `aggregate_seeds` turns
them into one row of seed means ± standard errors (std / sqrt(n), ddof 1). A single-seed row
carries, where the records have it, the measurement standard error over probe documents
instead. Table, figures and correlations are over these rows.
"""
from __future__ import annotations

import collections
import json
import math
import os
import re
import warnings
from typing import Any, Sequence

import numpy as np
import scipy.stats

from hybrid_nope.run import run_config, storage
from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.run import checkpoints
from hybrid_nope.analysis.evidence import run_files, seed_stats
from hybrid_nope.analysis.present import sweep_plots
from hybrid_nope.analysis.evidence.compare_table import cell, table
from hybrid_nope.analysis.evidence.run_files import read_jsonl
from hybrid_nope.model.pattern import layer_type, window_of
from hybrid_nope.run.reader import RunReader

TABLE_FILE = "compare.md"
ENCODINGS = {"rope": "RoPE", "nope": "NoPE"}
MIN_RUNS_FOR_CORRELATION = 3
SIGNIFICANT_SE = 2  # A logit-gap sign counts only beyond this many standard errors from zero.
SEED_KEY = ("train", "seed")
DATA_SEED_KEY = ("data", "seed")
# Row values aggregated over seeds (mean ± SE); for one seed the ± is the measurement standard
# error named here, where the summary has one.
AGGREGATED = ("eval_loss", "gap", "floor", "gap_matched", "shuffled_gap", "gap_since_init",
              "logit_gap",
              "alignment", "data_gap", "logit_gap_sign_flips", "extrapolation_gap",
              "extrapolation_logit_gap", "mean_decay", "mean_beta", "recency_scale")
# Summary statistics shown as z against the empirical init null (analyze.py --init_seeds).
NULL_Z = ("gap", "floor", "logit_gap", "alignment")
MEASUREMENT_SE = {"gap": "gap_stderr", "logit_gap": "logit_gap_stderr",
                  "gap_since_init": "gap_since_init_stderr",
                  "alignment": "alignment_stderr",
                  "extrapolation_gap": "extrapolation_gap_stderr",
                  "extrapolation_logit_gap": "extrapolation_logit_gap_stderr"}
STEP_KEYS = ("gap", "logit_gap")  # The per-step series (gap_vs_step.png).


def sign_flips(values: Sequence[float | None], stderrs: Sequence[float | None]) -> int:
  """How often the sign of a series changes significantly: a value counts only where
  |value| > SIGNIFICANT_SE x its standard error, and a flip is a significant value whose sign
  differs from the last significant one. Values within that band of zero (noise) neither flip
  nor reset the last sign; points whose value or standard error is unknown are skipped."""
  if len(values) != len(stderrs):
    raise ValueError(f"{len(values)} values but {len(stderrs)} standard errors")
  flips, last = 0, 0.0
  for v, se in zip(values, stderrs):
    if not (seed_stats.known(v) and seed_stats.known(se)) or abs(v) <= SIGNIFICANT_SE * se:
      continue
    sign = math.copysign(1.0, v)
    flips += last != 0.0 and sign != last
    last = sign
  return int(flips)


def seed_and_config_key(config) -> tuple[int, str]:
  """A run's seed, and the key its config shares with runs that differ from it only in their
  seeds (the key aggregate_seeds groups by)."""
  # Keys added since older runs were saved count at the value those runs had, so a seed run
  # before a key existed still groups with one after.
  seedless = run_config.with_added_keys(run_config.flat(config))
  seed = seedless.pop(".".join(SEED_KEY))
  seedless.pop(".".join(DATA_SEED_KEY), None)  # Follows train.seed: randomness too.
  return int(seed), json.dumps(seedless, sort_keys=True)


def load_run(run: RunReader, name: str | None = None) -> dict[str, Any]:
  """What compare needs from one run, as plain numbers."""
  config, workdir = run.config, run.workdir
  seed, config_key = seed_and_config_key(config)
  m = config.model
  swa = window_of(m) is not None
  linear = "linear" in {layer_type(k) for k in m.pattern}
  rd = run.layout
  evals = [r for r in read_jsonl(rd.metrics) if "eval_loss" in r]
  by_step_records = collections.defaultdict(list)
  for r in read_jsonl(rd.recency):
    by_step_records[r["step"]].append(r)
  if not by_step_records:
    raise checkpoints.WorkdirError(f"{rd.recency} has no records")
  by_step = [(s, report.summarize(by_step_records[s])) for s in sorted(by_step_records)]
  final_step, final = by_step[-1]
  at_init = dict(by_step).get(0, {})
  last_eval = max(evals, key=lambda r: r["step"]) if evals else None
  size = f"d{m.d_model}×{m.num_layers}"
  loaded = {
      "name": name or os.path.basename(os.path.normpath(workdir)),
      "workdir": workdir if storage.is_url(workdir) else os.path.abspath(workdir),
      "seed": seed, "config_key": config_key, "pattern": m.pattern,
      "num_layers": m.num_layers, "d_model": m.d_model, "window": int(m.window) if swa else None,
      "swa_pos": m.swa_pos if swa else None, "global_pos": m.global_pos,
      "series": (f"{size} {ENCODINGS.get(m.swa_pos, m.swa_pos)}-in-SWA" if swa
                 else f"{size} GLA" if linear else f"{size} no SWA"),
      "train_seq_len": int(config.data.seq_len),
      "eval_step": last_eval["step"] if last_eval else None,
      "eval_loss": last_eval["eval_loss"] if last_eval else None,
      "step": final_step, **final,
      # The data control is only recorded at step 0.
      "data_gap": at_init.get("data_gap"),
      "logit_gap_sign_flips": sign_flips([v["logit_gap"] for s, v in by_step if s > 0],
                                         [v["logit_gap_stderr"] for s, v in by_step if s > 0]),
      "by_step": by_step,
      "extrapolation_step": None, "extrapolation_gap": None, "extrapolation_logit_gap": None,
      "extrapolation_gap_stderr": None, "extrapolation_logit_gap_stderr": None,
      "ratio": {},
      "init_null": run_files.latest_init_null(run),
  }
  loaded.update(run_files.since_init(run, by_step_records))
  ext = run_files.latest_extrapolation(run)
  if ext is not None:
    rows = {row["factor"]: row for row in ext["lengths"]}
    at_train = rows.get(1) or report.summarize(by_step_records.get(ext["step"], []))
    loaded.update(extrapolation_step=ext["step"], extrapolation_gap=at_train["gap"],
                  extrapolation_logit_gap=at_train["logit_gap"],
                  extrapolation_gap_stderr=at_train.get("gap_stderr"),
                  extrapolation_logit_gap_stderr=at_train.get("logit_gap_stderr"),
                  ratio={k: row["ratio"] for k, row in rows.items() if k > 1})
  return loaded


def _statistic(fn, x: np.ndarray, y: np.ndarray) -> float | None:
  """fn(x, y).statistic, None where scipy leaves it undefined (nan: a constant input)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", scipy.stats.ConstantInputWarning)
    value = float(fn(x, y).statistic)
  return value if math.isfinite(value) else None


def correlation(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
  """Pearson r (values) and Spearman ρ (ranks) of paired values; None when fewer than
  MIN_RUNS_FOR_CORRELATION pairs or a constant input leaves them undefined."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  if len(x) < MIN_RUNS_FOR_CORRELATION:
    return {"n": len(x), "pearson": None, "spearman": None}
  return {"n": len(x), "pearson": _statistic(scipy.stats.pearsonr, x, y),
          "spearman": _statistic(scipy.stats.spearmanr, x, y)}


def _common(values: Sequence):
  """The value all members share, else their range as text (e.g. steps of runs cut short)."""
  if len(set(values)) == 1:
    return values[0]
  known = [v for v in values if v is not None]
  return f"{min(known)}–{max(known)}" if known else None


def _group_name(names: Sequence[str]) -> str:
  """The members' common name without a trailing seed tag ("swa4_seed0", "swa4_seed1" ->
  "swa4"); the first member's name where they share nothing."""
  prefix = os.path.commonprefix(list(names))
  prefix = re.sub(r"([_\-. ]+(seed|s)?[_\-. =]*)?$", "", prefix) if prefix else prefix
  return prefix or names[0]


def _step_series(members: Sequence[dict]) -> list[tuple[int, dict]]:
  """Per step recorded by every member: mean and SE of STEP_KEYS (one member: its
  measurement standard error)."""
  per_member = [dict(m["by_step"]) for m in members]
  steps = sorted(set.intersection(*(set(p) for p in per_member)))
  out = []
  for s in steps:
    point = {}
    for key in STEP_KEYS:
      values = [p[s][key] for p in per_member]
      if len(members) == 1:
        point[key], point[f"{key}_se"] = values[0], per_member[0][s].get(MEASUREMENT_SE[key])
      else:
        point[key], point[f"{key}_se"] = seed_stats.mean_se(values)
    out.append((s, point))
  return out


def _row(members: Sequence[dict]) -> dict[str, Any]:
  """One table row from runs of one configuration: seed means ± SE of AGGREGATED and of the
  extrapolation ratios; for one run its values ± their measurement standard errors."""
  first = members[0]
  n = len(members)
  row = {k: first[k] for k in ("pattern", "num_layers", "d_model", "window", "swa_pos",
                               "global_pos", "series", "train_seq_len")}
  row.update(name=first["name"] if n == 1 else f"{_group_name([m['name'] for m in members])} "
                                               f"({n} seeds)",
             n_seeds=n, seeds=[m["seed"] for m in members],
             members=[m["name"] for m in members], workdirs=[m["workdir"] for m in members],
             **{k: _common([m[k] for m in members])
                for k in ("eval_step", "step", "extrapolation_step")})
  for key in AGGREGATED:
    if n == 1:
      se_key = MEASUREMENT_SE.get(key)
      row[key], row[f"{key}_se"] = first[key], first.get(se_key) if se_key else None
    else:
      row[key], row[f"{key}_se"] = seed_stats.mean_se([m[key] for m in members])
  for key in ("logit_gap_null", "alignment_null"):  # Random-M nulls of one run's head mean.
    row[key] = seed_stats.mean_se([m.get(key) for m in members])[0]
  null = next((m["init_null"] for m in members if m.get("init_null")), None)
  row["init_null"] = null
  for key in NULL_Z:  # Welch's t: the trained seeds' spread and the null's both count.
    row[f"{key}_null_t"] = seed_stats.welch_vs_null([m[key] for m in members],
                                                    (null or {}).get(key))["t"]
  row["members_by_seed"] = {m["seed"]: m for m in members}
  factors = sorted({k for m in members for k in m["ratio"]})
  ratios = {k: seed_stats.mean_se([m["ratio"].get(k) for m in members]) for k in factors}
  row["ratio"] = {k: v[0] for k, v in ratios.items()}
  row["ratio_se"] = {k: v[1] for k, v in ratios.items()}
  row["by_step"] = _step_series(members)
  return row


def aggregate_seeds(runs: Sequence[dict]) -> list[dict]:
  """Rows in order of first appearance: runs with equal `config_key` (configs equal up to
  train.seed) become one row of seed means ± SE, the others one row each (`_row`)."""
  groups: dict[str, list[dict]] = {}
  for run in runs:
    groups.setdefault(run["config_key"], []).append(run)
  return [_row(members) for members in groups.values()]


def correlations(runs: Sequence[dict]) -> dict[int, dict[str, dict]]:
  """Per factor k > 1: correlation of the extrapolation ratio with the run gap and logit gap
  (each measured on the analysed checkpoint at the training length), one point per run or
  row (`aggregate_seeds`: seed means)."""
  factors = sorted({k for r in runs for k in r["ratio"]})
  out = {}
  for k in factors:
    out[k] = {}
    for key, source in (("gap", "extrapolation_gap"), ("logit_gap", "extrapolation_logit_gap")):
      pairs = [(r[source], r["ratio"][k]) for r in runs
               if r[source] is not None and r["ratio"].get(k) is not None]
      out[k][key] = correlation([p[0] for p in pairs], [p[1] for p in pairs])
  return out


def markdown(rows: Sequence[dict], corr: dict, command: str | None = None) -> str:
  """`command`: what regenerates the page (default: launch/compare.py over the rows' workdirs;
  results.py names itself, as its workdirs are temporary)."""
  command = command or "python launch/compare.py " + " ".join(
      w for r in rows for w in r["workdirs"])
  parts = [
      "# Sweep comparison", "",
      f"Generated by `{command}`.", "",
      "- final eval loss: the last eval record of metrics.jsonl.",
      "- gap, floor: mean over global layers at `pre_mixer_norm` (the normalised input global "
      "attention reads) at the last step of recency.jsonl; logit gap, alignment: mean over "
      "global NoPE layers and heads; random-M nulls: the standard deviation of that head mean "
      "for a Haar-rotated M of each head's norm (alignment: 1/(d_model sqrt(heads))); data gap: "
      "the gap of P(t_i = t_{i-d}) on the probe at step 0, a description of the data (a "
      "probability, never a baseline for cosines).",
      "- gap, queries with far lag: f(1) over the queries that also have the far lag, minus "
      "f(L), so both terms average the same queries; shuffled-token gap: the same model and "
      "step on the probe with tokens shuffled inside each document (the like-for-like "
      "control).",
      "- gap − gap at init: the run gap's change over training; for one run ± its SE paired "
      "over the probe's documents (recency_sums/ of step 0 and the last step).",
      "- z (init null): (row mean − mean over fresh initialisations) / (their SD / sqrt(n "
      "seeds)), from `launch/analyze.py --init_seeds=K` on the probe; — where not measured.",
      f"- logit-gap sign flips: over the recorded steps after init, how often the logit gap "
      f"changes sign by more than {SIGNIFICANT_SE} standard errors: only values with |logit gap| "
      f"> {SIGNIFICANT_SE}·se count, and one flips when its sign differs from the last such "
      f"value (values nearer zero are noise: they neither flip nor reset).",
      "- ±: for a row of n seeds (runs whose configs differ only in train.seed) the mean over "
      "seeds ± its standard error (std / sqrt(n), ddof 1); for a single run the value ± its "
      "measurement standard error over probe documents, where recorded (gap, logit gap). "
      "Correlations and figures use one point per row.",
      "- ratio k×: eval loss at context positions ≥ T (the training length) / at positions in "
      "[T/2, T), on rows of k × T (analysis/step_<extrap. step>/extrapolation.json).", "",
      table(rows), "",
      f"## Correlation with length extrapolation (across rows; Spearman ρ on ranks, Pearson r "
      f"on values; needs ≥ {MIN_RUNS_FOR_CORRELATION} rows)", "",
  ]
  reference = seed_stats.reference_row(rows)
  if reference is not None:
    parts += [f"## Paired by seed against {reference['name']}", "",
              "Each cell: mean over the seeds both rows hold of (row − baseline) ± its standard "
              "error; seeds pair initialisations where shapes agree.", "",
              "| run | " + " | ".join(seed_stats.PAIRED_KEYS) + " | seeds |",
              "|" + "---|" * (len(seed_stats.PAIRED_KEYS) + 2)]
    for r in rows:
      if r is reference or r["n_seeds"] < 2:
        continue
      cells = [seed_stats.paired_difference(r, reference, key)
               for key in seed_stats.PAIRED_KEYS]
      parts.append(f"| {r['name']} | " + " | ".join(cell(c["mean"], "+.4f", c["se"])
                                                    for c in cells)
                   + f" | {', '.join(map(str, cells[0]['seeds']))} |")
    parts.append("")
  missing = [r["name"] for r in rows if r["extrapolation_step"] is None]
  if missing:
    parts.append(f"No extrapolation analysis for {', '.join(missing)}: run `python "
                 f"launch/analyze.py --workdir=DIR` on each first.")
    parts.append("")
  if not corr:
    parts.append("No run has an extrapolation ratio (analysis with a factor > 1).")
  for k, by_key in corr.items():
    for key, c in by_key.items():
      parts.append(f"- {k}×, {key.replace('_', ' ')} vs ratio: Spearman ρ = "
                   f"{cell(c['spearman'], '+.3f')}, Pearson r = {cell(c['pearson'], '+.3f')} "
                   f"(n = {c['n']})")
  return "\n".join(parts) + "\n"


def _json_run(run: dict) -> dict:
  return {k: v for k, v in run.items() if k != "config_key"}  # The whole config, repeated.


def _json_row(row: dict) -> dict:
  return {k: v for k, v in row.items() if k != "members_by_seed"}  # The runs, repeated.


def compare(runs: Sequence[RunReader], out_dir: str | None = None,
            figures: bool = True, names: Sequence[str] | None = None,
            command: str | None = None, sources: Sequence[str] | None = None
            ) -> dict[str, Any]:
  """Loads every run, aggregates seeds into rows, writes compare.md, compare.json and figures
  to `out_dir` (default: <common parent of the workdirs>/compare). Returns {"runs" (one per
  workdir), "rows" (the table's, `aggregate_seeds`), "correlations" (over rows), "markdown",
  "files"}. `command` and `sources` (one per workdir) are what the written files say
  regenerates them and where each run came from, when the workdirs are temporary copies."""
  if not runs:
    raise checkpoints.AnalysisError("compare needs at least one workdir")
  workdirs = [r.workdir for r in runs]
  names = list(names or [os.path.basename(os.path.normpath(w)) for w in workdirs])
  if len(set(names)) < len(names):
    names = [os.path.normpath(w) for w in workdirs]
  loaded = [load_run(r, n) for r, n in zip(runs, names)]
  if sources is not None:  # Temporary unpacked copies name the records they came from.
    for run, source in zip(loaded, sources, strict=True):
      run["workdir"] = source
  rows = aggregate_seeds(loaded)
  corr = correlations(rows)
  out_dir = out_dir or os.path.join(
      os.path.commonpath([os.path.abspath(w) for w in workdirs]), "compare")
  os.makedirs(out_dir, exist_ok=True)
  text = markdown(rows, corr, command)
  files = [os.path.join(out_dir, TABLE_FILE), os.path.join(out_dir, "compare.json")]
  with open(files[0], "w") as f:
    f.write(text)
  with open(files[1], "w") as f:
    f.write(storage.to_json({"runs": [_json_run(r) for r in loaded],
                             "rows": [_json_row(r) for r in rows],
                             "correlations": {str(k): v for k, v in corr.items()}}))
  if figures:
    files.append(sweep_plots.metrics_vs_window(
        rows, [("eval_loss", "final eval loss")], os.path.join(out_dir, "loss_vs_window.png"),
        "Final eval loss vs window (solid: RoPE in SWA, dashed: NoPE in SWA)"))
    files.append(sweep_plots.metrics_vs_window(
        rows, [("gap", "gap at global layers' input"), ("logit_gap", "logit gap (head mean)")],
        os.path.join(out_dir, "gap_vs_window.png"),
        "Recency vs window at the last recorded step"))
    files.append(sweep_plots.metrics_vs_step(rows, os.path.join(out_dir, "gap_vs_step.png")))
    if corr:
      files.append(sweep_plots.extrapolation_vs_gap(rows, sorted(corr), corr,
                                                    os.path.join(out_dir, "extrapolation_vs_gap.png")))
  return {"runs": loaded, "rows": rows, "correlations": corr, "markdown": text, "files": files}
