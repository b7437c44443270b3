"""docs/results.md from the sweep's committed records, with no retraining.

`build(corpora, out_md, figures_dir)` unpacks, per corpus, every `<experiment>/seed<k>.tar.gz`
(packed by hybrid_nope/sweep.py) of its records dirs, loads the runs as compare.py does, turns
each published finding into one statistic per seed with its seed × document error and margin
(`evidence.exploratory_verdicts`; which experiment plays which part comes from
`exploratory_experiments`), reads the causal test's files (`evidence.causal`), gives the rows
Benjamini–Hochberg q-values (they are exploratory: the registered primary family, decided first
by `primary_page` from its own runs, is the page's only Holm family), and writes it: per corpus
the sweep table, the verdicts, the causal test, the mixers compared, the sign swing as counts,
extrapolation at fixed loss, propagation through module kinds and figures; then where the
corpora agree (`page_sections`).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from typing import Sequence

import numpy as np

from hybrid_nope import sweep
from hybrid_nope.analysis.evidence import (causal, compare, compare_table, extrapolation,
                                           exploratory_verdicts, flip_counts,
                                           page_sections as sections, primary, primary_page,
                                           propagation, run_files, verdict_rules)
from hybrid_nope.analysis.evidence.exploratory_experiments import Experiments
from hybrid_nope.analysis.evidence.verdict_rules import Verdict
from hybrid_nope.analysis.evidence.finding_statistics import NORMS, Run, paired_paths
from hybrid_nope.analysis.evidence.seed_stats import mean_se
from hybrid_nope.run.reader import RunReader


def sign_swing(runs: dict[str, dict[int, Run]], dirs: dict[str, dict[int, RunReader]],
               experiments: Experiments) -> tuple[Verdict, dict] | None:
  """NoPE-in-SWA against RoPE-in-SWA at the large window, as counts of heads whose logit gap
  flips sign (`flip_counts`): an exact paired permutation test over seeds, in the page's
  family."""
  a, b = experiments.windows.nope_in_swa_large, experiments.windows.large
  if not (a in runs and b in runs and len(set(runs[a]) & set(runs[b])) >= 2):
    return None
  result = flip_counts.compare_flips(
      {s: flip_counts.load_layers(d) for s, d in dirs[a].items()},
      {s: flip_counts.load_layers(d) for s, d in dirs[b].items()}, names=(a, b))
  diff = result["difference"]
  v = Verdict(f"NoPE-in-SWA with a large window: {flip_counts.CLAIM}", "fraction of global "
              f"heads whose logit gap flips sign significantly over training, {a} − {b}, "
              "paired by seed", "exchangeable configs within a seed (exact sign-flip "
              "permutation)", diff["per_seed"], margin=verdict_rules.MARGIN_FRACTION,
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


def extrapolation_points(runs: dict[str, dict[int, Run]],
                         more: Sequence[dict[str, dict[int, Run]]] = ()) -> dict[int, list[dict]]:
  """Per factor k > 1: one point per config (seed means of the gap at the training length,
  the final eval loss and the k× ratio). A config's runs for k are the first of `runs`, then
  `more` (later sweeps of the corpus, e.g. reruns at longer lengths), that measured k."""
  sources = [runs, *more]
  factors = sorted({k for src in sources for rs in src.values() for r in rs.values()
                    for k in r.summary["ratio"]})
  mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
  out = {}
  for k in factors:
    points = []
    for e in sorted({e for src in sources for e in src}):
      rs = next((src[e] for src in sources if e in src and any(
          r.summary["ratio"].get(k) is not None for r in src[e].values())), None)
      if rs is None:
        continue
      ratios = [r.summary["ratio"][k] for r in rs.values()
                if r.summary["ratio"].get(k) is not None]
      points.append({"config": e,
                     "gap": mean([r.summary["extrapolation_gap"] for r in rs.values()
                                  if r.summary["extrapolation_gap"] is not None]),
                     "eval_loss": mean([r.summary["eval_loss"] for r in rs.values()
                                        if r.summary["eval_loss"] is not None]),
                     "ratio": mean(ratios), "ratio_se": mean_se(ratios)[1],
                     "seeds": len(ratios)})
    out[k] = points
  return out


def _git_head() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=sweep.REPO, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


CORPUS_TITLES = {"stdlib": "Python stdlib source (configs/small.py)",
                 "prose": "English prose: the King James Version, byte tokens (configs/"
                          "small_prose.py before its BPE tokenizer)"}


@dataclasses.dataclass
class CorpusEvidence:
  """One corpus's exploratory numbers for the page, before the page-wide q-values."""
  name: str
  records_dirs: list[str]
  rows: list
  found: list[Verdict]
  mixers: list[Verdict]
  swing: tuple | None
  regressions: dict
  corr: dict
  counts: dict[str, int]
  norm_series: dict
  transfer_rows: list[dict]
  causal_rows: list[dict]
  figures_dir: str | None
  experiments: Experiments  # which experiment plays which part in the rows

  @property
  def tests(self) -> list[Verdict]:
    return self.found + self.mixers + [r["verdict"] for r in self.causal_rows]


def render_corpus(ev: CorpusEvidence, family: int, h: str, images: str | None) -> list[str]:
  lines = [f"Records: {sum(ev.counts.values())} runs — " + ", ".join(
      f"{e} ×{n}" for e, n in sorted(ev.counts.items())) + ".", "", f"{h} The sweep", "",
      compare_table.table(ev.rows), ""]
  if images is not None:
    lines += [f"![gap and logit gap vs step]({images}/gap_vs_step.png)",
              f"![loss vs window]({images}/loss_vs_window.png)",
              f"![gap vs window]({images}/gap_vs_window.png)", ""]
  lines += sections.verdicts_section(
      "Exploratory rows", f"Exploratory: not registered before these runs. {family} tests over "
      "the page's exploratory sections (these tables, the sign-swing row, the causal rows and "
      "the mixer rows) carry Benjamini–Hochberg q-values in the adjusted column (the "
      "equivalence tests against each row's margin likewise); a kind read at q < 0.05 is a "
      "lead for a registered test, not a verdict. Errors: seed × document where the statistic "
      "is built from the probe's per-document sums, seed alone for eval losses "
      "(hybrid_nope/analysis/evidence/verdict_rules.py defines the kinds, two_level.py the error, "
      "finding_statistics.py the margins' rule).", ev.found, h)
  lines += sections.readout_inversions(ev.found, ev.experiments.baseline)
  if ev.swing is not None:
    lines += [f"Sign swing in detail: "
              f"{flip_counts.verdict_text(ev.swing[1], p=ev.swing[0].p_adjusted)}", ""]
  lines += sections.causal_section(ev.causal_rows, h)
  lines += sections.verdicts_section(
      "The local mixers compared", "Each row is a − b per seed (same seed: same data order, "
      "and the same initialisation of every weight whose shape the two configs share), in the "
      "page's Holm family.", ev.mixers, h)
  for name, series in ev.norm_series.items():
    lines += sections.norm_section(name, series, h)
  lines += sections.extrapolation_section(ev.regressions, ev.corr,
                                          ev.experiments.rope_global_controls, h)
  lines += sections.propagation_section(ev.transfer_rows, h)
  return lines


def render(corpora: list[CorpusEvidence], intro: str, out_md: str,
           primary_lines: Sequence[str] = ()) -> str:
  family = len([v for ev in corpora for v in ev.tests if v.p is not None])
  def images(ev):
    return (None if ev.figures_dir is None else
            os.path.relpath(ev.figures_dir, os.path.dirname(os.path.abspath(out_md))))
  lines = [intro, "", *primary_lines]
  if primary_lines:
    lines += ["## Exploratory: the earlier sweeps", "",
              "Everything below was run before the primary family was registered, or is not in "
              "it: read it as exploratory (Benjamini–Hochberg q-values over these sections).",
              ""]
  if len(corpora) == 1 and not corpora[0].name:
    lines += render_corpus(corpora[0], family, "##", images(corpora[0]))
  else:
    for ev in corpora:
      lines += [f"## {CORPUS_TITLES.get(ev.name, ev.name)}", "",
                "From " + ", ".join(f"`{d}`" for d in ev.records_dirs) + ".", ""]
      lines += render_corpus(ev, family, "###", images(ev))
    lines += sections.agreement_section({ev.name: ev.found + [r["verdict"] for r in
                                                             ev.causal_rows]
                                         for ev in corpora})
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
  return verdict_rules.clustered_correlation(xs, ys)


def parse_corpora(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
  """--corpus values "NAME=DIR[,DIR...]" as (name, dirs); a malformed or repeated one fails
  naming it."""
  out = []
  for spec in specs:
    name, sep, dirs = spec.partition("=")
    paths = [d for d in dirs.split(",") if d]
    if not sep or not name or not paths:
      raise ValueError(f"--corpus={spec!r}: expected NAME=DIR[,DIR...]")
    if name in [n for n, _ in out]:
      raise ValueError(f"--corpus={spec!r}: corpus {name!r} named twice")
    out.append((name, paths))
  return out


def _runs(dirs: dict[str, dict[int, RunReader]]) -> dict[str, dict[int, Run]]:
  return {e: {s: Run(d, f"{e}_seed{s}") for s, d in by_seed.items()} for e, by_seed in dirs.items()}


def causal_rows(unpacked: Sequence[dict[str, dict[int, RunReader]]]) -> list[dict]:
  """Per config with ablation files: its causal verdict and numbers. A config's seeds come
  from the last of `unpacked` (the corpus's record dirs in order) that holds any."""
  ablations: dict[str, list[dict]] = {}
  for dirs in unpacked:
    for e, by_seed in dirs.items():
      found = [r for s in sorted(by_seed) if (r := run_files.latest_ablation(by_seed[s]))]
      if found:
        ablations[e] = found
  return [causal.row(e, rs, causal.verdict(e, rs)) for e, rs in sorted(ablations.items())]


def corpus_evidence(name: str, records_dirs: Sequence[str], tmp: str, figures_dir: str | None,
                    experiments: Experiments) -> CorpusEvidence:
  """Everything the page says about one corpus: its first records dir is the sweep every
  finding reads; later ones (reruns with new measurements) add causal tests and lengths.
  `experiments`: which experiment plays which part in the rows."""
  unpacked = [run_files.unpack_all(d, os.path.join(tmp, name or "corpus", str(i)))
              for i, d in enumerate(records_dirs)]
  dirs = unpacked[0]
  if not dirs:
    raise FileNotFoundError(f"no <experiment>/seed<k>.tar.gz under {records_dirs[0]}")
  readers = [d for by_seed in dirs.values() for d in by_seed.values()]
  paired_paths(readers)
  runs = _runs(dirs)
  names = [f"{e}_seed{s}" for e, by_seed in dirs.items() for s in by_seed]
  packs = [os.path.join(records_dirs[0], e, f"seed{s}.tar.gz")
           for e, by_seed in dirs.items() for s in by_seed]
  result = compare.compare(readers, out_dir=figures_dir or os.path.join(tmp, name, "compare"),
                           figures=figures_dir is not None, names=names,
                           command="python launch/results.py", sources=packs)
  nulls = {e: next((r.summary["init_null"] for r in rs.values() if r.summary["init_null"]),
                   None) for e, rs in runs.items()}
  found, mixers = exploratory_verdicts.all_verdicts(runs, nulls, experiments)
  swing = sign_swing(runs, dirs, experiments)
  if swing is not None:
    found.append(swing[0])
  more = [_runs(u) for u in unpacked[1:]]
  regressions = {k: extrapolation.regression(points)
                 for k, points in extrapolation_points(runs, more).items()}
  norm_series = {e: norm_effect_over_training(rs) for e, rs in runs.items()
                 if e in experiments.norm_series and len(rs) >= 2}
  transfer_rows = propagation.account(
      {e: [propagation.gaps(r.by_step[r.final]) for r in rs.values()] for e, rs in runs.items()})
  return CorpusEvidence(name, list(records_dirs), result["rows"], found, mixers, swing,
                        regressions, extrapolation_correlation(runs),
                        {e: len(v) for e, v in runs.items()}, norm_series, transfer_rows,
                        causal_rows(unpacked), figures_dir, experiments)


def _summary(ev: CorpusEvidence) -> dict:
  return {"rows": ev.rows, "verdicts": [v.row() for v in ev.found],
          "mixers": [v.row() for v in ev.mixers], "causal": [r["verdict"].row()
                                                             for r in ev.causal_rows],
          "sign_swing": ev.swing[1] if ev.swing else None, "extrapolation": ev.regressions,
          "correlation": ev.corr, "propagation": ev.transfer_rows}


def build(corpora: str | Sequence[tuple[str, Sequence[str]]], out_md: str,
          figures_dir: str | None, intro: str, registry: primary.Registry | None = None, *,
          experiments: Experiments) -> dict:
  """The page from packed records. `registry`: the primary family, decided first from its own
  runs (Holm inside it, `primary_page`). `corpora`: the exploratory sweeps, one records dir (a
  page without corpus sections), or (name, [records dirs]) per corpus, each corpus's figures
  under figures_dir/<name> but the first's; Benjamini–Hochberg q-values over all of them.
  `experiments`: which experiment plays which part in the exploratory rows."""
  if isinstance(corpora, str):
    corpora = [("", [corpora])]
  with tempfile.TemporaryDirectory() as tmp:
    evidence = [corpus_evidence(name, dirs, tmp, None if figures_dir is None else
                                figures_dir if i == 0 else os.path.join(figures_dir, name),
                                experiments)
                for i, (name, dirs) in enumerate(corpora)]
    primary.adjust_exploratory([v for ev in evidence for v in ev.tests])
    decided = primary_page.decide(registry, tmp) if registry else []
    primary_lines = primary_page.render(registry, decided) if registry else []
    text = render(evidence, intro.replace("{commit}", _git_head()), out_md, primary_lines)
  with open(out_md, "w") as f:
    f.write(text)
  return {**_summary(evidence[0]), "corpora": {ev.name: _summary(ev) for ev in evidence},
          "primary": {pc.corpus.name: [
              dict(v.row(), claim=c.id, pending=w,
                   verdict=primary_page.verdict_text(registry, c, v, w)[0])
              for c, v, w in zip(registry.claims, pc.verdicts, pc.pending)] for pc in decided}}
