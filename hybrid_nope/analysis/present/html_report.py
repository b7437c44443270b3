"""One self-contained HTML page per run or sweep: `python launch/report.py DIR... --out=FILE`.

Reads only a run's files (metrics.jsonl, recency.jsonl, recency_probe.json, config.json), all
through `hybrid_nope.run.storage`, so DIR may be a gs:// URL and the run may still be training: a
torn last line is dropped (`storage.read_jsonl`), and a recency step still being written is
passed over for the last complete one. Figures are the PNGs of `plots.py`, `training_plots.py`
and (sweeps) `compare.py`, inlined as base64; the page has no script. Whatever a run did not
record is said on the page ("not recorded: ..."), never left out silently. Tables are
`html_tables.py`'s (split into column groups that fit a 1280 px window); the throughput, MFU
and config section is `html_throughput.py`.
"""
from __future__ import annotations

import base64
import collections
import dataclasses
import json
import os
import tempfile
import time
from typing import Sequence

import ml_collections

from hybrid_nope.run import run_dir, storage
from hybrid_nope.analysis.checkpoint import init_null
from hybrid_nope.run import checkpoints
from hybrid_nope.analysis.evidence import compare
from hybrid_nope.analysis.present import html_tables, html_throughput
from hybrid_nope.analysis.present import plots, training_plots
from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.analysis.evidence import run_files
from hybrid_nope.analysis.evidence.compare_table import cell
from hybrid_nope.analysis.present.html_tables import esc as _esc, markdown_html, missing as _missing
from hybrid_nope.analysis.present.html_tables import table as _table
from hybrid_nope.analysis.measure.records import DATA_LAYER
from hybrid_nope.run.run_dir import CONFIG, METRICS, RECENCY, RECENCY_PROBE
from hybrid_nope.run.reader import RunReader

READOUT_MODULE = "pre_mixer_norm"  # Where the logit read-out of a global NoPE layer is measured.
# Extra keys of gated linear attention (L) and delta rule (D: mean_beta too) records.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1360px; color: #222;
       padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 19px; border-bottom: 1px solid #ccc; }
h3 { font-size: 16px; margin-top: 22px; }
img { max-width: 100%; display: block; margin: 8px 0; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; white-space: nowrap; }
th { background: #f0f0f0; } td.num { text-align: right; }
tr.global { background: #fdf0f0; }  /* As the figures shade global layers. */
.scroll { overflow-x: auto; } .missing { color: #a33; font-style: italic; }
.meta { color: #555; font-size: 13px; } code { font-size: 12px; }
details > summary { font-size: 18px; font-weight: bold; cursor: pointer; margin: 14px 0; }
""" + html_tables.STYLE


@dataclasses.dataclass
class Run:
  name: str
  reader: RunReader
  metrics: list[dict]
  recency: dict[int, list[dict]]  # Complete steps only (`complete_steps`).
  config: ml_collections.ConfigDict | None
  probe: dict | None
  notes: list[str]  # What the page says about files still being written.

  @property
  def workdir(self) -> str:
    return self.reader.workdir

  @property
  def evals(self) -> list[dict]:
    return [r for r in self.metrics if "eval_loss" in r]

  @property
  def seq_len(self) -> int | None:
    return int(self.config.data.seq_len) if self.config is not None else None


def complete_steps(records: Sequence[dict]) -> tuple[dict[int, list[dict]], list[str]]:
  """Records by step without a last step still being written (the hook appends a step's
  records one by one), and a note saying so where one was left out."""
  by_step = collections.defaultdict(list)
  for r in records:
    by_step[r["step"]].append(r)

  def keys(step):
    return {(r["layer"], r["module"]) for r in by_step[step] if r["layer"] != DATA_LAYER}

  if len(by_step) < 2:
    return dict(by_step), []
  last, expected = max(by_step), keys(min(by_step))
  written = keys(last)
  if written == expected:
    return dict(by_step), []
  del by_step[last]
  return dict(by_step), [f"recency step {last} is still being written ({len(written)} of "
                         f"{len(expected)} records): showing step {max(by_step)}"]


def _optional(path: str, read):
  return read(path) if storage.exists(path) else None


def load_run(run: RunReader, name: str | None = None) -> Run:
  """What the page shows of one run; fails naming the path if there is no run there."""
  workdir = run.workdir
  if not storage.isdir(workdir):
    raise checkpoints.WorkdirError(f"workdir {workdir} does not exist or is not a directory")
  if not storage.listdir(workdir):
    raise checkpoints.WorkdirError(f"workdir {workdir} is empty: expected {METRICS} from "
                                   f"`python launch/train.py --workdir={workdir}`")
  rd = run.layout
  metrics = run_files.read_jsonl(rd.metrics)
  recency, notes = complete_steps(_optional(rd.recency, storage.read_jsonl) or [])
  has_config = storage.exists(rd.config)
  return Run(name=name or os.path.basename(workdir.rstrip("/")), reader=run,
             metrics=metrics, recency=recency,
             config=run.config if has_config else None,
             probe=_optional(rd.recency_probe, lambda p: json.loads(storage.read_text(p))),
             notes=notes)


# ---- figures ---------------------------------------------------------------------------------

class Figures:
  """Draws figures into a scratch directory and returns each as an inline <img>."""

  def __init__(self, directory: str):
    self.directory, self.count = directory, 0

  def __call__(self, draw, *args, alt: str) -> str:
    """draw(*args, path) is any figure function here, in plots.py or training_plots.py."""
    self.count += 1
    return self.embed(draw(*args, os.path.join(self.directory, f"figure_{self.count}.png")), alt)

  @staticmethod
  def embed(path: str, alt: str) -> str:
    with open(path, "rb") as f:
      data = base64.b64encode(f.read()).decode()
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


# ---- one run -----------------------------------------------------------------------------------

def _pm(r: dict, key: str, se, spec: str = ".4f") -> str:
  return cell(r.get(key), spec, se)


def _mean(value):
  """A per-head list as its mean (one cell per record); a scalar as it is."""
  if isinstance(value, list):
    return float(plots.nan_array(value).mean())
  return value


def module_table(records: Sequence[dict], far_lag: int) -> str:
  """One row per (layer, module) record in depth order: floor and gap ± se; the logit
  read-out (head means) on global NoPE layers' read-out rows; GLA and delta layers' gate keys
  where present."""
  layered = sorted((r for r in records if r["layer"] != DATA_LAYER), key=plots.depth_order)
  extra = [k for k in report.GATE_KEYS if any(k in r for r in layered)]
  header = ["layer", "type", "module", "floor f(L)", "gap f(1) − f(L)",
            "effect on gap (vs what it receives)", "shuffled-token gap", *extra,
            "logit gap (head mean)", "logit gap random-M null", "alignment (head mean)",
            "alignment null (head mean)"]
  rows = []
  for r in layered:
    readout = r["module"] == READOUT_MODULE and "logit_gap" in r
    change = (f"{cell(r['gap_change'], '+.4f', r.get('gap_change_stderr'))} "
              f"(vs {r['compared_with']})" if "gap_change" in r else "")
    rows.append([
        r["layer"], r["layer_type"], r["module"],
        _pm(r, "floor", plots.floor_gap_se(r, "floor", far_lag)),
        _pm(r, "gap", plots.floor_gap_se(r, "gap", far_lag)), change,
        _pm(r, "shuffled_gap", r.get("shuffled_gap_stderr")),
        *(plots.fmt(_mean(r.get(k)), ".4g") for k in extra),
        cell(_mean(r["logit_gap"]), "+.4f", plots.head_mean_se(r)) if readout else "",
        cell(r.get("logit_gap_mean_null"), ".3g") if readout else "",
        cell(_mean(r["alignment"]), "+.4f", _mean(r.get("alignment_stderr")))
        if readout else "",
        cell(r.get("alignment_mean_null"), ".3g") if readout else ""])
  return _table(header, rows, [r["layer_type"] for r in layered], key_columns=3)


def _overview(run: Run) -> str:
  parts = [f'<p class="meta">{_esc(run.workdir)}</p>']
  trained = max((r["step"] for r in run.metrics if "loss" in r), default=None)
  if run.config is None:
    parts.append(_missing(f"{CONFIG} (the run's config)"))
  else:
    m, c = run.config.model, run.config
    parts.append(_table(
        ["pattern", "layers", "d_model", "heads", "window", "SWA pos", "global pos", "seq_len",
         "batch", "step", "of steps"],
        [[m.pattern, m.num_layers, m.d_model, m.num_heads, m.window, m.swa_pos, m.global_pos,
          c.data.seq_len, c.data.batch_size, plots.fmt(trained, ""), c.train.steps]]))
  if run.probe is None:
    parts.append(_missing(f"{RECENCY_PROBE} (the recency probe)"))
  else:
    p = run.probe
    parts.append(f'<p class="meta">recency probe: {p["documents"]} documents, {p["tokens"]} '
                 f'tokens in {len(p["rows"])} eval rows; pairs at lag 1: {p["pairs"][0]}, at '
                 f'lag {p["lags"][-1]}: {p["pairs"][-1]}</p>')
  parts += [f'<p class="missing">{_esc(n)}</p>' for n in run.notes]
  return "\n".join(parts)


def _analysed_multiples(run: Run, fig: Figures) -> list[str]:
  """The newest checkpoint analysis's lengths (`launch/analyze.py --lengths`), if one ran."""
  ext = run_files.latest_extrapolation(run.reader)
  if not ext or not ext.get("lengths"):
    return []
  keys = ("loss", "loss_near", "loss_beyond", "ratio", "gap")
  rows = [[f"{r['factor']}×", r["seq_len"], *(plots.fmt(r.get(k), ".4f") for k in keys),
           plots.fmt(r.get("logit_gap"), "+.4f")] for r in ext["lengths"]]
  return [f"<p>checkpoint analysis of step {ext['step']} (<code>launch/analyze.py</code>, "
          f"{run_dir.EXTRAPOLATION_FILE}):</p>",
          _table(["length", "seq_len", "eval loss", "loss [T/2, T)", "loss ≥ T", "ratio", "gap",
                  "logit gap"], rows),
          fig(plots.extrapolation, ext, alt="length extrapolation of the checkpoint analysis")]


def _multiples_section(run: Run, fig: Figures) -> list[str]:
  """Training's eval records at eval.length_multiples, then the checkpoint analysis's; "not
  recorded" only where neither has any."""
  analysed = _analysed_multiples(run, fig)
  if analysed and not training_plots.multiples(run.evals):
    return analysed
  return _training_multiples(run, fig) + analysed


def _training_multiples(run: Run, fig: Figures) -> list[str]:
  evals, T = run.evals, run.seq_len
  ks = training_plots.multiples(evals)
  if not ks:
    return [_missing("eval_loss@{k}x (eval loss at k × the training length; set "
                     "eval.length_multiples, or run launch/analyze.py --lengths=1,2,4)")]
  parts = [_table(["step", "eval loss (1×)", *(f"eval loss @{k}×" for k in ks)],
                  [[r["step"], plots.fmt(r["eval_loss"], ".4f"),
                    *(plots.fmt(r.get(f"eval_loss@{k}x"), ".4f") for k in ks)] for r in evals])]
  latest = evals[-1]
  missing = [k for k in ks if not latest.get(f"eval_loss_by_position@{k}x")]
  if missing or not latest.get("eval_loss_by_position") or T is None:
    return parts + [_missing(f"per-bucket eval losses at step {latest['step']} for "
                             f"{', '.join(f'{k}×' for k in missing) or '1×'}, or the training "
                             f"length (config.json)")]
  rows = [{"factor": k, "seq_len": k * T, "bucket_size": latest["eval_bucket_size"],
           "loss_by_position": latest["eval_loss_by_position" + ("" if k == 1 else f"@{k}x")],
           "ratio": None, "gap": None, "logit_gap": None} for k in [1, *ks]]
  ext = {"step": latest["step"], "train_seq_len": T, "lengths": rows}
  return parts + ["<p>ratio, gap and logit gap per length come from <code>launch/analyze.py"
                  "</code> (checkpoint analysis), not from training's eval records.</p>",
                  fig(plots.extrapolation, ext, alt="eval loss by position at each multiple")]


def _loss_sections(run: Run, fig: Figures) -> list[str]:
  parts = ["<h3>Loss and eval curves</h3>"]
  if not any("loss" in r for r in run.metrics):
    parts.append(_missing(f"training loss: {METRICS} has no record with a loss yet"))
  else:
    parts.append(fig(training_plots.loss_curves, [(run.name, run.metrics)], alt="loss curves"))
  parts.append("<h3>Eval loss by position bucket</h3>")
  if any(r.get("eval_loss_by_position") for r in run.evals):
    parts.append(fig(training_plots.eval_by_position, run.evals, run.seq_len,
                     alt="eval loss by position"))
  else:
    parts.append(_missing("eval_loss_by_position (no eval record carries per-bucket losses)"))
  return parts + ["<h3>Eval loss at length multiples</h3>", *_multiples_section(run, fig)]


def _analysis(run: Run) -> dict:
  """The latest complete recency step in the shape plots.py draws (report.analyze's)."""
  step = max(run.recency)
  records = run.recency[step]
  return {"step": step, "records": records, "init_records": run.recency[min(run.recency)],
          "far_lag": records[0]["far_lag"], "seq_len": plots.fmt(run.seq_len, "")}


def _recency_sections(run: Run, fig: Figures) -> list[str]:
  if not run.recency:
    return ["<h3>Recency</h3>", _missing(f"{RECENCY} is missing or empty (the recency "
                                         f"hook writes it at step 0 and every "
                                         f"metrics.every_steps)")]
  a = _analysis(run)
  parts = [f"<h3>Per-layer cosine profiles (step {a['step']})</h3>",
           fig(plots.cosine_profiles, a, alt="cosine profiles"),
           "<h3>Floor and gap over training</h3>",
           fig(training_plots.floor_gap_over_steps, run.recency, a["far_lag"],
               alt="floor and gap over steps"),
           fig(plots.floor_gap_by_boundary, a, alt="floor and gap by module"),
           f"<h3>Floor and gap by layer and module (step {a['step']}, ± 1 standard error over "
           f"probe documents)</h3>", module_table(a["records"], a["far_lag"]),
           _null_line(run, a["records"]), "<h3>Logit gap and alignment</h3>"]
  if not plots.readout_by_layer(a["records"]):
    return parts + [_missing("logit gap and alignment: the model has no global NoPE layer")]
  return parts + [fig(training_plots.readout_over_steps, run.recency, alt="read-out over steps"),
                  fig(plots.logit_profiles, a, alt="logit profiles"),
                  fig(plots.logit_gap_alignment, a, alt="logit gap and alignment by head")]


def _null_line(run: Run, records: Sequence[dict]) -> str:
  """The run summary as z against the empirical init null, where analyze.py measured one."""
  null = run_files.latest_init_null(run.reader)
  if not null:
    return _missing("init null (run `launch/analyze.py --init_seeds=K` to set this step "
                    "against K fresh initialisations)")
  now = report.summarize(records)
  cells = [f"{key.replace('_', ' ')} {plots.fmt(now.get(key), '+.4f')} (z "
           f"{plots.fmt(init_null.zscore(now.get(key), null.get(key)), '+.1f')})"
           for key in compare.NULL_Z]
  draws = next(iter(null.values()))["draws"]
  return (f'<p class="meta">against {draws} fresh initialisations on the same probe: '
          f'{_esc(", ".join(cells))}</p>')


def run_html(run: Run, fig: Figures) -> str:
  return "\n".join([_overview(run), *html_throughput.section(run), *_loss_sections(run, fig),
                    *_recency_sections(run, fig)])


# ---- the page ----------------------------------------------------------------------------------

def _sweep_html(runs: Sequence[Run], fig: Figures, scratch: str) -> str:
  """compare.py's table (seed means ± se), notes and figures, and all runs' loss curves."""
  result = compare.compare([r.reader for r in runs], out_dir=scratch)
  images = [fig.embed(p, os.path.basename(p)) for p in result["files"] if p.endswith(".png")]
  return "\n".join([markdown_html(result["markdown"]),
                    fig(training_plots.loss_curves, [(r.name, r.metrics) for r in runs],
                        alt="loss curves of every run"), *images])


def page(readers: Sequence[RunReader]) -> str:
  """The report of one run, or of a sweep (several runs: the compare table first, then
  each run in a folded section)."""
  if not readers:
    raise checkpoints.AnalysisError("report needs at least one workdir")
  workdirs = [r.workdir for r in readers]
  names = [os.path.basename(w.rstrip("/")) for w in workdirs]
  names = names if len(set(names)) == len(names) else workdirs
  runs = [load_run(r, n) for r, n in zip(readers, names)]
  title = runs[0].name if len(runs) == 1 else f"sweep of {len(runs)} runs"
  with tempfile.TemporaryDirectory(prefix="hybrid_nope_report_") as scratch:
    fig = Figures(scratch)
    if len(runs) == 1:
      body = run_html(runs[0], fig)
    else:
      body = "\n".join([_sweep_html(runs, fig, os.path.join(scratch, "compare"))] + [
          f"<details><summary>{_esc(r.name)}</summary>{run_html(r, fig)}</details>"
          for r in runs])
  return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{_esc(title)}</title>'
          f"<style>{STYLE}</style></head><body><h1>hybrid_nope report: {_esc(title)}</h1>"
          f'<p class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S %Z")} from the run '
          f"files by <code>launch/report.py</code>; a live run shows what was written so far"
          f"</p>\n{body}\n</body></html>\n")


def write(readers: Sequence[RunReader], out: str) -> str:
  storage.write_text(out, page(readers))
  return out
