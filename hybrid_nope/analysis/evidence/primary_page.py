"""docs/results.md's primary section: per corpus of the registry (docs/results/primary.toml),
the runs present against those registered, whether the claims were registered before them, the
data's own repetition profile, and the family's verdicts (Holm inside the family alone)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from hybrid_nope.analysis.evidence import causal, primary, primary_statistics, run_files
from hybrid_nope.analysis.evidence.verdict_rules import Verdict
from hybrid_nope.analysis.evidence.page_sections import causal_details, fmt
from hybrid_nope.analysis.evidence.finding_statistics import Run, paired_paths
from hybrid_nope.data import repetition

HEADER = ("| claim | statistic (per seed or draw) | configs | null | n | mean ± SE (df) | margin | "
          "p / Holm p | verdict | why |")


@dataclasses.dataclass
class PrimaryCorpus:
  corpus: primary.Corpus
  verdicts: list[Verdict]
  counts: dict[str, int]        # experiment -> seeds packed
  registration: dict
  data_profile: dict | None     # lags and P(t_i = t_{i−d}) at the probe, step 0
  pending: list[bool]           # per claim: fewer values than registered (`primary.pending`)
  causal_rows: list[dict] = dataclasses.field(default_factory=list)  # causal.row per config


def data_profile(runs: dict[str, dict[int, Run]]) -> dict | None:
  """The probe's own repetition P(t_i = t_{i−d}) by lag, from the data control's per-document
  counts at step 0 (the same probe for every run, so one run tells it), and whether it falls
  with the lag: no rise between consecutive lags beyond `repetition.Z` paired standard errors
  (`repetition.rises_of_counts`, the rule `make prose` prints)."""
  for rs in runs.values():
    for r in rs.values():
      try:
        reps = r.at(0)
      except FileNotFoundError:
        continue
      if not reps.has("tokens"):
        continue
      matches_CL = np.asarray(reps.sums["tokens"], np.float64).T
      pairs_CL = reps.counts.T
      rise, se = repetition.rises_of_counts(matches_CL, pairs_CL)
      profile = matches_CL.sum(0) / pairs_CL.sum(0)
      return {"lags": list(reps.lags), "profile": [float(p) for p in profile],
              "rise_z": [float(d / s) if s > 0 else None for d, s in zip(rise, se)],
              "monotone": repetition.monotone_rises(rise, se)}
  return None


def evidence(corpus: primary.Corpus, tmp: str) -> tuple[primary_statistics.Evidence, list[str]]:
  """The corpus's primary packs unpacked and loaded, and their paths."""
  dirs = (run_files.unpack_all(corpus.records_dir, os.path.join(tmp, "primary", corpus.name))
          if os.path.isdir(corpus.records_dir) else {})
  paired_paths([d for by_seed in dirs.values() for d in by_seed.values()])
  runs = {e: {s: Run(d, f"{e}_seed{s}") for s, d in by_seed.items()} for e, by_seed in dirs.items()}
  init_nulls = {e: f for e, by_seed in dirs.items()
                if (f := next((x for s in sorted(by_seed)
                               if (x := run_files.init_null_file(by_seed[s]))), None))}
  ablations = {e: {s: a for s in sorted(by_seed) if (a := run_files.latest_ablation(by_seed[s]))}
               for e, by_seed in dirs.items()}
  packs = [os.path.join(corpus.records_dir, e, f"seed{s}.tar.gz")
           for e, by_seed in sorted(dirs.items()) for s in sorted(by_seed)]
  return primary_statistics.Evidence(runs, init_nulls, ablations), packs


def decide(registry: primary.Registry, tmp: str) -> list[PrimaryCorpus]:
  out = []
  for corpus in registry.corpora.values():
    ev, packs = evidence(corpus, tmp)
    verdicts = primary.decide(registry, ev)
    out.append(PrimaryCorpus(corpus, verdicts, {e: len(rs) for e, rs in ev.runs.items()},
                             primary.registration(registry.path, packs), data_profile(ev.runs),
                             primary.pending(registry, verdicts), causal_rows(ev)))
  return out


def causal_rows(ev: primary_statistics.Evidence) -> list[dict]:
  """`causal.row` of each config with causal-test files (its seeds in order)."""
  rows = []
  for e, by_seed in sorted(ev.ablations.items()):
    files = [by_seed[s] for s in sorted(by_seed)]
    if files:
      rows.append(causal.row(e, files, causal.verdict(e, files)))
  return rows


def verdict_text(registry: primary.Registry, claim: primary.Claim, v: Verdict,
                 waiting: bool, amended: bool = False) -> tuple[str, str]:
  """(kind, why) as the page shows them: a pending claim is not decided; an amended one says
  so (`primary.registration`)."""
  if waiting:
    kind, why = "pending", (f"{v.n} of the {primary.required(registry, claim)} registered "
                            "values are in; decided when all are")
  else:
    kind, why = v.verdict, v.note
  return kind, why + (" (claim amended after its first runs: see the registration line)"
                      if amended else "")


def _row(registry: primary.Registry, claim: primary.Claim, v: Verdict, waiting: bool,
         amended: bool) -> str:
  df = f", {v.df:.3g} df" if v.df else ""
  kind, why = verdict_text(registry, claim, v, waiting, amended)
  return (f"| {claim.claim} | {v.statistic} | {', '.join(claim.configs)} | {claim.null} | {v.n} "
          f"| {fmt(v.mean, '+.4f')} ± {fmt(v.se, '.4f')} ({claim.level}{df}) | ±{claim.margin:g} "
          f"{claim.unit} | {fmt(v.p, '.2g')} / {fmt(v.p_adjusted, '.2g')} | **{kind}** | "
          f"{why} |")


def render(registry: primary.Registry, decided: list[PrimaryCorpus]) -> list[str]:
  lines = ["## The primary family (registered)", "",
           f"The claims of `{registry.path}`, decided per corpus from their own runs "
           f"({len(registry.seeds)} seeds per trained config, {registry.init_draws} init draws), "
           f"Holm-adjusted inside the family of {len(registry.claims)} alone (differences, and "
           "the equivalence tests against each registered margin as a second family). The "
           "verdict kinds: hybrid_nope/analysis/evidence/verdict_rules.py.", ""]
  for pc in decided:
    wanted = len(registry.seeds) * len(registry.configs)
    have = sum(pc.counts.get(e, 0) for e in registry.configs)
    lines += [f"### {pc.corpus.title}", "",
              primary.registration_line(pc.registration), "",
              f"Runs: {have} of {wanted} registered (`{pc.corpus.records_dir}`): " + ", ".join(
                  f"{e} ×{pc.counts.get(e, 0)}" for e in registry.configs) + ".", ""]
    if pc.data_profile:
      p = pc.data_profile
      lines += ["The probe's own repetition, P(t_i = t_{i−d}) (a description of the data, not a "
                "baseline for cosines): " + ", ".join(
                    f"d={lag}: {v:.4f}" for lag, v in zip(p["lags"], p["profile"]))
                + (f". No rise between consecutive lags beyond {repetition.Z:g} SE: it falls "
                   "with the lag." if p["monotone"] else
                   ". **It rises with the lag somewhere** (rise / SE between consecutive lags: "
                   + ", ".join(fmt(z, "+.1f") for z in p["rise_z"]) + f"; rule: none beyond "
                   f"{repetition.Z:g}): f(1) − f(L) mixes the data's own repetition with the "
                   "recency the model plants, so read the gaps against the shuffled-token control "
                   "and the init null, not against zero."), ""]
    lines += [HEADER, "|---|---|---|---|---|---|---|---|---|---|",
              *(_row(registry, c, v, w, c.id in pc.registration.get("amended", ()))
                for c, v, w in zip(registry.claims, pc.verdicts, pc.pending)), ""]
    if pc.causal_rows:
      configs = ", ".join(r["config"] for r in pc.causal_rows)
      lines += [f"#### The causal test in detail ({configs})",
                "", "Beside the registered statistic (unsigned, against the damage-matched "
                "control that keeps the branch and adds position-free noise): the same signed "
                "by each layer's clean logit gap, per layer, and what each intervention does on "
                "its own.", "",
                *causal_details(pc.causal_rows)]
  return lines
