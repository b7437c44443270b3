"""docs/results.md from the sweep's committed records, with no retraining.

`build(records_dir, out_md, figures_dir)` unpacks every `<experiment>/seed<k>.tar.gz` (packed by
hybrid_nope/sweep.py), loads the runs as compare.py does, turns each published finding into one
statistic per seed with its seed × document error and margin (`evidence.verdicts`), Holm-adjusts
the page as one family, and writes it: the sweep table, the verdicts, the mixers compared, the
sign swing as counts, extrapolation at fixed loss, propagation through module kinds, figures.
"""
from __future__ import annotations

import collections
import glob
import os
import subprocess
import tempfile

import numpy as np

from hybrid_nope import sweep
from hybrid_nope.analysis.evidence import (compare, compare_table, extrapolation, findings,
                                           flip_counts, propagation, verdicts)
from hybrid_nope.analysis.evidence.findings import Verdict, adjust
from hybrid_nope.analysis.evidence.published_findings import NORMS, Run, paired_paths


def unpack_all(records_dir: str, into: str) -> dict[str, dict[int, str]]:
  """experiment -> seed -> unpacked run directory."""
  runs: dict[str, dict[int, str]] = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(records_dir, "*", "seed*.tar.gz"))):
    experiment = os.path.basename(os.path.dirname(path))
    seed = int(os.path.basename(path)[len("seed"):-len(".tar.gz")])
    runs[experiment][seed] = sweep.unpack_records(path, os.path.join(into, experiment,
                                                                    f"seed{seed}"))
  return dict(runs)


def sign_swing(runs: dict[str, dict[int, Run]], dirs: dict[str, dict[int, str]]
               ) -> tuple[Verdict, dict] | None:
  """NoPE-in-SWA against RoPE-in-SWA at the large window, as counts of heads whose logit gap
  flips sign (`flip_counts`): an exact paired permutation test over seeds, in the page's
  family."""
  a, b = "nopeswa256", "swa256"
  if not (a in runs and b in runs and len(set(runs[a]) & set(runs[b])) >= 2):
    return None
  result = flip_counts.compare_flips(
      {s: flip_counts.load_layers(d) for s, d in dirs[a].items()},
      {s: flip_counts.load_layers(d) for s, d in dirs[b].items()}, names=(a, b))
  diff = result["difference"]
  v = Verdict(f"NoPE-in-SWA with a large window: {flip_counts.CLAIM}", "fraction of global "
              "heads whose logit gap flips sign significantly over training, nopeswa256 − "
              "swa256, paired by seed", "exchangeable configs within a seed (exact sign-flip "
              "permutation)", diff["per_seed"], margin=findings.MARGIN_FRACTION,
              margin_rule="a tenth of the heads", p_exact=result["permutation"]["p_two_sided"])
  return v, result


def norm_effect_over_training(runs: dict[int, Run]) -> list[tuple[int, float, float | None]]:
  """(step, seed mean, seed SE) of the norms' floor change (mean of pre_mixer_norm and
  pre_mlp_norm over layers) at every step all seeds recorded: when the gains start to act."""
  steps = sorted(set.intersection(*(set(r.by_step) for r in runs.values())))
  def floor_change(r, step):
    return float(np.mean([np.mean(rec["floor_change"]) for m in NORMS
                          for rec in r.records(step, m) if "floor_change" in rec]))
  out = []
  for step in steps:
    v = Verdict("", "", "", [floor_change(r, step) for r in runs.values()])
    out.append((step, v.mean, v.se))
  return out


def extrapolation_points(runs: dict[str, dict[int, Run]]) -> dict[int, list[dict]]:
  """Per factor k > 1: one point per config (seed means of the gap at the training length,
  the final eval loss and the k× ratio)."""
  factors = sorted({k for rs in runs.values() for r in rs.values()
                    for k in r.summary["ratio"]})
  mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
  out = {}
  for k in factors:
    out[k] = [{"config": e,
               "gap": mean([r.summary["extrapolation_gap"] for r in rs.values()
                            if r.summary["extrapolation_gap"] is not None]),
               "eval_loss": mean([r.summary["eval_loss"] for r in rs.values()
                                  if r.summary["eval_loss"] is not None]),
               "ratio": mean([r.summary["ratio"][k] for r in rs.values()
                              if r.summary["ratio"].get(k) is not None])}
              for e, rs in sorted(runs.items())]
  return out


def _git_head() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=sweep.REPO, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _fmt(v, spec):
  return "—" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, spec)


def _norm_section(name: str, series) -> list[str]:
  # Above float32 rounding too: at init the change is ~1e-8 with an even smaller SE.
  moving = next((step for step, m, se in series if se and abs(m) > max(2 * se, 1e-4)), None)
  lines = [f"## When the norm gains move ({name})", "",
           "The norms' effect on the floor (norm output − its input, mean over layers and both "
           "norms), seed mean ± seed SE, at each recorded step; at init the gains are 1 and "
           "RMSNorm leaves every cosine unchanged, so any change is the gains moving. First step "
           f"beyond 2 SE of 0 (and 1e-4): {moving if moving is not None else 'none'}.", "",
           "| step | " + " | ".join(str(s) for s, _, _ in series) + " |",
           "|" + "---|" * (len(series) + 1),
           "| floor change | " + " | ".join(f"{_fmt(m, '+.4f')} ± {_fmt(se, '.4f')}"
                                          for _, m, se in series) + " |", ""]
  return lines


VERDICT_HEADER = ("| finding | statistic (per seed) | null | seeds | mean ± SE (levels) | margin "
                  "(rule) | p / Holm p | verdict | why |")


def verdict_row(v: Verdict) -> str:
  margin = f"±{v.margin:.3g} ({v.margin_rule})" if v.margin is not None else "—"
  return (f"| {v.finding} | {v.statistic} | {v.null} | {v.n} | {_fmt(v.mean, '+.4f')} ± "
          f"{_fmt(v.se, '.4f')} ({v.levels}) | {margin} | {_fmt(v.p, '.2g')} / "
          f"{_fmt(v.p_adjusted, '.2g')} | **{v.verdict}** | {v.note} |")


def _verdicts_section(title: str, intro: str, rows: list[Verdict]) -> list[str]:
  if not rows:
    return []
  return [f"## {title}", "", intro, "", VERDICT_HEADER, "|---|---|---|---|---|---|---|---|---|",
          *(verdict_row(v) for v in rows), ""]


def _extrapolation_section(regressions: dict[int, dict], corr: dict) -> list[str]:
  lines = ["## Length extrapolation and recency, at fixed loss", "",
           "Per factor k (evaluation length / training length): ratio_k = a + b·gap + c·loss "
           "over configs (seed means), b's 95% interval by a bootstrap over whole configs, and "
           "the partial correlation of ratio and gap given loss "
           "(hybrid_nope/analysis/evidence/extrapolation.py).", "",
           "| k | configs | slope b (gap) | 95% interval | partial r | ratios | reading |",
           "|---|---|---|---|---|---|---|"]
  for k, r in sorted(regressions.items()):
    rng = r["ratio_range"] or [None, None]
    lines.append(f"| {k} | {r['n']} | {_fmt(r['slope'], '+.3g')} | [{_fmt(r['low'], '+.3g')}, "
                 f"{_fmt(r['high'], '+.3g')}] | {_fmt(r['partial_r'], '+.2f')} | "
                 f"{_fmt(rng[0], '.3f')}–{_fmt(rng[1], '.3f')} | {extrapolation.decided(r)} |")
  lines += ["", f"For comparison, the raw Pearson r of the 2× ratio with the gap over "
            f"{corr.get('points', 0)} runs in {corr['groups']} configs: {_fmt(corr['r'], '+.3f')}"
            f", 95% [{_fmt(corr['low'], '+.3f')}, {_fmt(corr['high'], '+.3f')}] (configs "
            f"resampled whole); it does not hold the loss fixed.", ""]
  return lines


def _propagation_section(rows: list[dict]) -> list[str]:
  def cell(r, name):
    if r[f"error_{name}"] is None:
      return "— (a kind no other config has)"
    return (f"{_fmt(r[f'error_{name}'], '.1%')} ± {_fmt(r[f'error_{name}_se'], '.1%')} "
            f"({'holds' if r[f'holds_{name}'] else 'fails'})")
  lines = ["## How the gap propagates", "",
           "The gap at each global layer's normalised input predicted from the embedding's, "
           "through a transfer per module kind (gap after / gap before, per boundary and layer "
           "type; hybrid_nope/analysis/evidence/propagation.py), fitted on the other configs "
           "(across) or on the config's other seeds (within); mean relative error over its "
           "global layers ± seed SE, final step. It holds within "
           f"{findings.MARGIN_FRACTION:.0%}.", "",
           "| config | seeds | measured gap | error, transfers from other configs | error, "
           "from its other seeds |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['config']} | {r['seeds']} | {_fmt(r['measured_gap'], '.4f')} | "
                 f"{cell(r, 'across')} | {cell(r, 'within')} |")
  return lines + [""]


def render(rows, found: list[Verdict], mixers: list[Verdict], swing, regressions, corr: dict,
           counts: dict[str, int], intro: str, norm_series: dict | None = None,
           transfer_rows: list[dict] | None = None) -> str:
  family = len([v for v in found + mixers if v.p is not None])
  lines = [intro, "", f"Records: {sum(counts.values())} runs — " + ", ".join(
      f"{e} ×{n}" for e, n in sorted(counts.items())) + ".", "", "## The sweep", "",
      compare_table.table(rows), "",
      "![gap and logit gap vs step](results/gap_vs_step.png)",
      "![loss vs window](results/loss_vs_window.png)",
      "![gap vs window](results/gap_vs_window.png)", ""]
  lines += _verdicts_section(
      "Verdicts", f"One family of {family} tests (this table, the sign-swing row and the "
      "mixer rows), Holm-adjusted; a second family of the equivalence (TOST) tests against "
      "each row's margin. Errors: seed × document where the statistic is built from the "
      "probe's per-document sums, seed alone for eval losses (hybrid_nope/analysis/evidence/"
      "findings.py defines the verdict kinds, two_level.py the error, published_findings.py "
      "the margins' rule).", found)
  if swing is not None:
    lines += [f"Sign swing in detail: {flip_counts.verdict_text(swing[1], p=swing[0].p_adjusted)}",
              ""]
  lines += _verdicts_section(
      "The local mixers compared", "Each row is a − b per seed (same seed: same data order, "
      "and the same initialisation of every weight whose shape the two configs share), in the "
      "page's Holm family.", mixers)
  for name, series in (norm_series or {}).items():
    lines += _norm_section(name, series)
  lines += _extrapolation_section(regressions, corr)
  lines += _propagation_section(transfer_rows or [])
  return "\n".join(lines) + "\n"


def extrapolation_correlation(runs: dict[str, dict[int, Run]]) -> dict:
  """Pearson r of the 2x extrapolation ratio with the gap, over all runs, seeds clustered by
  config in the bootstrap (the raw association, beside the regression at fixed loss)."""
  xs, ys = [], []
  for rs in runs.values():
    pairs = [(r.summary["extrapolation_gap"], r.summary["ratio"].get(2)) for r in rs.values()]
    pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
    xs.append([p[0] for p in pairs])
    ys.append([p[1] for p in pairs])
  return findings.clustered_correlation(xs, ys)


def build(records_dir: str, out_md: str, figures_dir: str | None, intro: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    dirs = unpack_all(records_dir, tmp)
    if not dirs:
      raise FileNotFoundError(f"no <experiment>/seed<k>.tar.gz under {records_dir}")
    workdirs = [d for by_seed in dirs.values() for d in by_seed.values()]
    paired_paths(workdirs)
    runs = {e: {s: Run(d, f"{e}_seed{s}") for s, d in by_seed.items()}
            for e, by_seed in dirs.items()}
    names = [f"{e}_seed{s}" for e, by_seed in dirs.items() for s in by_seed]
    packs = [os.path.join(records_dir, e, f"seed{s}.tar.gz")
             for e, by_seed in dirs.items() for s in by_seed]
    result = compare.compare(workdirs, out_dir=figures_dir or os.path.join(tmp, "compare"),
                             figures=figures_dir is not None, names=names,
                             command="python launch/results.py", sources=packs)
    nulls = {e: next((r.summary["init_null"] for r in rs.values() if r.summary["init_null"]),
                     None) for e, rs in runs.items()}
    found, mixers = verdicts.all_verdicts(runs, nulls)
    swing = sign_swing(runs, dirs)
    if swing is not None:
      found.append(swing[0])
    adjust(found + mixers)
    regressions = {k: extrapolation.regression(points)
                   for k, points in extrapolation_points(runs).items()}
    corr = extrapolation_correlation(runs)
    norm_series = {e: norm_effect_over_training(rs) for e, rs in runs.items()
                   if e in ("swa16", "swa64") and len(rs) >= 2}
    transfer_rows = propagation.account(
        {e: [propagation.gaps(r.by_step[r.final]) for r in rs.values()] for e, rs in runs.items()})
    text = render(result["rows"], found, mixers, swing, regressions, corr,
                  {e: len(v) for e, v in runs.items()}, intro.replace("{commit}", _git_head()),
                  norm_series, transfer_rows)
  with open(out_md, "w") as f:
    f.write(text)
  return {"rows": result["rows"], "verdicts": [v.row() for v in found],
          "mixers": [v.row() for v in mixers], "sign_swing": swing[1] if swing else None,
          "extrapolation": regressions, "correlation": corr, "propagation": transfer_rows}
