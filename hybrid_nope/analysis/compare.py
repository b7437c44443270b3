"""A sweep of runs side by side: one markdown table, figures, and the correlation between
recency and length extrapolation.

Reads only files (no model is run): each run's config.json, metrics.jsonl (eval records),
recency.jsonl, and, where `launch/analyze.py` has been run, the latest
analysis/step_<N>/extrapolation.json. The run gap, logit gap and extrapolation ratio are defined
in `report.py`.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
from typing import Any, Sequence

import numpy as np

from hybrid_nope.analysis import checkpoints, plots, report

TABLE_FILE = "compare.md"
ENCODINGS = {"rope": "RoPE", "nope": "NoPE"}
MIN_RUNS_FOR_CORRELATION = 3


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    raise checkpoints.WorkdirError(f"{path} does not exist (written by launch/train.py)")
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _latest_extrapolation(workdir: str) -> dict | None:
  found = []
  for path in glob.glob(os.path.join(workdir, report.ANALYSIS_DIR, "step_*",
                                     report.EXTRAPOLATION_FILE)):
    match = re.search(r"step_(\d+)", os.path.basename(os.path.dirname(path)))
    if match:
      found.append((int(match.group(1)), path))
  if not found:
    return None
  with open(max(found)[1]) as f:
    return json.load(f)


def sign_flips(values: Sequence[float | None]) -> int:
  """How often consecutive non-zero values change sign."""
  signs = [np.sign(v) for v in values if v is not None and v != 0]
  return int(sum(a != b for a, b in zip(signs, signs[1:])))


def load_run(workdir: str, name: str | None = None) -> dict[str, Any]:
  """What compare needs from one workdir, as plain numbers."""
  config = checkpoints.load_config(workdir)
  m = config.model
  swa = "S" in m.pattern
  evals = [r for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval_loss" in r]
  by_step_records = collections.defaultdict(list)
  for r in _read_jsonl(os.path.join(workdir, "recency.jsonl")):
    by_step_records[r["step"]].append(r)
  if not by_step_records:
    raise checkpoints.WorkdirError(f"{os.path.join(workdir, 'recency.jsonl')} has no records")
  by_step = [(s, report.summarize(by_step_records[s])) for s in sorted(by_step_records)]
  final_step, final = by_step[-1]
  last_eval = max(evals, key=lambda r: r["step"]) if evals else None
  size = f"d{m.d_model}×{m.num_layers}"
  run = {
      "name": name or os.path.basename(os.path.normpath(workdir)),
      "workdir": os.path.abspath(workdir), "pattern": m.pattern, "num_layers": m.num_layers,
      "d_model": m.d_model, "window": int(m.window) if swa else None,
      "swa_pos": m.swa_pos if swa else None, "global_pos": m.global_pos,
      "series": f"{size} {ENCODINGS.get(m.swa_pos, m.swa_pos)}-in-SWA" if swa
                else f"{size} no SWA",
      "train_seq_len": int(config.data.seq_len),
      "eval_step": last_eval["step"] if last_eval else None,
      "eval_loss": last_eval["eval_loss"] if last_eval else None,
      "step": final_step, **final,
      "logit_gap_sign_flips": sign_flips([v["logit_gap"] for s, v in by_step if s > 0]),
      "by_step": by_step,
      "extrapolation_step": None, "extrapolation_gap": None, "extrapolation_logit_gap": None,
      "ratio": {},
  }
  ext = _latest_extrapolation(workdir)
  if ext is not None:
    rows = {row["factor"]: row for row in ext["lengths"]}
    at_train = rows.get(1) or report.summarize(by_step_records.get(ext["step"], []))
    run.update(extrapolation_step=ext["step"], extrapolation_gap=at_train["gap"],
               extrapolation_logit_gap=at_train["logit_gap"],
               ratio={k: row["ratio"] for k, row in rows.items() if k > 1})
  return run


def _ranks(x: np.ndarray) -> np.ndarray:
  """Ranks 1..n, ties sharing their mean rank."""
  order = np.argsort(x, kind="stable")
  ranks = np.empty(len(x))
  ranks[order] = np.arange(1, len(x) + 1)
  for value in np.unique(x):
    tied = x == value
    ranks[tied] = ranks[tied].mean()
  return ranks


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
  x, y = x - x.mean(), y - y.mean()
  denom = np.sqrt((x * x).sum() * (y * y).sum())
  return float((x * y).sum() / denom) if denom > 0 else None


def correlation(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
  """Pearson r (values) and Spearman ρ (ranks) of paired values; None when fewer than
  MIN_RUNS_FOR_CORRELATION pairs or a constant input leaves them undefined."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  if len(x) < MIN_RUNS_FOR_CORRELATION:
    return {"n": len(x), "pearson": None, "spearman": None}
  return {"n": len(x), "pearson": _pearson(x, y), "spearman": _pearson(_ranks(x), _ranks(y))}


def correlations(runs: Sequence[dict]) -> dict[int, dict[str, dict]]:
  """Per factor k > 1: correlation of the extrapolation ratio with the run gap and logit gap
  (each measured on the analysed checkpoint at the training length)."""
  factors = sorted({k for r in runs for k in r["ratio"]})
  out = {}
  for k in factors:
    out[k] = {}
    for key, source in (("gap", "extrapolation_gap"), ("logit_gap", "extrapolation_logit_gap")):
      pairs = [(r[source], r["ratio"][k]) for r in runs
               if r[source] is not None and r["ratio"].get(k) is not None]
      out[k][key] = correlation([p[0] for p in pairs], [p[1] for p in pairs])
  return out


def _cell(value, spec: str) -> str:
  if value is None:
    return "—"
  return format(value, spec) if isinstance(value, float) else str(value)


# (column header, run key or function, format)
COLUMNS = (
    ("run", "name", ""), ("pattern", "pattern", ""), ("layers", "num_layers", ""),
    ("d_model", "d_model", ""), ("window", "window", ""), ("SWA pos", "swa_pos", ""),
    ("eval step", "eval_step", ""), ("final eval loss", "eval_loss", ".4f"),
    ("recency step", "step", ""), ("gap", "gap", ".4f"), ("floor", "floor", ".4f"),
    ("logit gap", "logit_gap", "+.4f"), ("alignment", "alignment", "+.4f"),
    ("logit-gap sign flips", "logit_gap_sign_flips", ""),
)


def table(runs: Sequence[dict]) -> str:
  factors = sorted({k for r in runs for k in r["ratio"]})
  header = [c[0] for c in COLUMNS] + ["extrap. step"] + [f"ratio {k}×" for k in factors]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in runs:
    cells = [_cell(r[key], spec) for _, key, spec in COLUMNS]
    cells += [_cell(r["extrapolation_step"], "")]
    cells += [_cell(r["ratio"].get(k), ".4f") for k in factors]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown(runs: Sequence[dict], corr: dict) -> str:
  parts = [
      "# Sweep comparison", "",
      "Generated by `python launch/compare.py " + " ".join(r["workdir"] for r in runs) + "`.", "",
      "- final eval loss: the last eval record of metrics.jsonl.",
      "- gap, floor: mean over global layers at `pre_mixer_norm` (the normalised input global "
      "attention reads) at the last step of recency.jsonl; logit gap, alignment: mean over "
      "global NoPE layers and heads; sign flips: sign changes of the logit gap over the "
      "recorded steps after init.",
      "- ratio k×: eval loss at context positions ≥ T (the training length) / at positions in "
      "[T/2, T), on rows of k × T (analysis/step_<extrap. step>/extrapolation.json).", "",
      table(runs), "",
      f"## Correlation with length extrapolation (across runs; Spearman ρ on ranks, Pearson r "
      f"on values; needs ≥ {MIN_RUNS_FOR_CORRELATION} runs)", "",
  ]
  missing = [r["name"] for r in runs if r["extrapolation_step"] is None]
  if missing:
    parts.append(f"No extrapolation analysis for {', '.join(missing)}: run `python "
                 f"launch/analyze.py --workdir=DIR` on each first.")
    parts.append("")
  if not corr:
    parts.append("No run has an extrapolation ratio (analysis with a factor > 1).")
  for k, by_key in corr.items():
    for key, c in by_key.items():
      parts.append(f"- {k}×, {key.replace('_', ' ')} vs ratio: Spearman ρ = "
                   f"{_cell(c['spearman'], '+.3f')}, Pearson r = {_cell(c['pearson'], '+.3f')} "
                   f"(n = {c['n']})")
  return "\n".join(parts) + "\n"


def compare(workdirs: Sequence[str], out_dir: str | None = None,
            figures: bool = True) -> dict[str, Any]:
  """Loads every run, writes compare.md, compare.json and figures to `out_dir` (default:
  <common parent of the workdirs>/compare). Returns {"runs", "correlations", "markdown",
  "files"}."""
  if not workdirs:
    raise checkpoints.AnalysisError("compare needs at least one workdir")
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(set(names)) < len(names):
    names = [os.path.normpath(w) for w in workdirs]
  runs = [load_run(w, n) for w, n in zip(workdirs, names)]
  corr = correlations(runs)
  out_dir = out_dir or os.path.join(
      os.path.commonpath([os.path.abspath(w) for w in workdirs]), "compare")
  os.makedirs(out_dir, exist_ok=True)
  text = markdown(runs, corr)
  files = [os.path.join(out_dir, TABLE_FILE), os.path.join(out_dir, "compare.json")]
  with open(files[0], "w") as f:
    f.write(text)
  with open(files[1], "w") as f:
    json.dump({"runs": runs, "correlations": {str(k): v for k, v in corr.items()}}, f)
  if figures:
    files.append(plots.metrics_vs_window(
        runs, [("eval_loss", "final eval loss")], os.path.join(out_dir, "loss_vs_window.png"),
        "Final eval loss vs window (solid: RoPE in SWA, dashed: NoPE in SWA)"))
    files.append(plots.metrics_vs_window(
        runs, [("gap", "gap at global layers' input"), ("logit_gap", "logit gap (head mean)")],
        os.path.join(out_dir, "gap_vs_window.png"),
        "Recency vs window at the last recorded step"))
    files.append(plots.metrics_vs_step(runs, os.path.join(out_dir, "gap_vs_step.png")))
    if corr:
      files.append(plots.extrapolation_vs_gap(runs, sorted(corr), corr,
                                              os.path.join(out_dir, "extrapolation_vs_gap.png")))
  return {"runs": runs, "correlations": corr, "markdown": text, "files": files}
