"""docs/results.md from the sweep's committed records, with no retraining.

`build(records_dir, out_md, figures_dir)` unpacks every `<experiment>/seed<k>.tar.gz` (packed by
hybrid_nope/sweep.py), loads the runs as compare.py does, turns each published finding into one
statistic per seed (`analysis.evidence.findings`), and writes the page: the sweep table (seed means ±
seed-level SEs, init-null z), the verdicts with their statistic, error and null, and figures.
"""
from __future__ import annotations

import collections
import glob
import os
import subprocess
import tempfile
from typing import Callable

import numpy as np

from hybrid_nope import sweep
from hybrid_nope.analysis.evidence import compare, compare_table, run_files
from hybrid_nope.analysis.evidence.findings import Verdict, clustered_correlation, paired
from hybrid_nope.run_dir import RunDir

INPUT = "pre_mixer_norm"  # The normalised input global attention reads.
# The smallest effects the findings mean, for "refuted with the power to have seen it": a
# cosine gap or floor moved by 0.01, an eval loss by 0.01 nats, one more significant flip.
MIN_COSINE, MIN_LOSS, MIN_FLIPS = 0.01, 0.01, 1.0
# configs/small.py's experiments with a local mixer, in the page's order.
LOCAL_EXPERIMENTS = ("swa16", "swa64", "swa256", "nopeswa64", "nopeswa256", "gla", "gdn", "gdn3")
# The local mixers set side by side: (experiment, the one it is compared with), paired by seed.
MIXER_PAIRS = (("gdn", "gla"), ("gdn", "swa16"), ("gdn", "swa64"), ("gla", "swa64"),
               ("gdn3", "gdn"))


def unpack_all(records_dir: str, into: str) -> dict[str, dict[int, str]]:
  """experiment -> seed -> unpacked run directory."""
  runs: dict[str, dict[int, str]] = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(records_dir, "*", "seed*.tar.gz"))):
    experiment = os.path.basename(os.path.dirname(path))
    seed = int(os.path.basename(path)[len("seed"):-len(".tar.gz")])
    runs[experiment][seed] = sweep.unpack_records(path, os.path.join(into, experiment,
                                                                    f"seed{seed}"))
  return dict(runs)


class Run:
  """One run's recency records by step, and its compare summary."""

  def __init__(self, workdir: str, name: str):
    self.summary = compare.load_run(workdir, name)
    self.by_step = collections.defaultdict(list)
    for r in run_files.read_jsonl(RunDir(workdir).recency):
      self.by_step[r["step"]].append(r)
    self.final = max(self.by_step)

  def records(self, step: int, module: str, layer_type: str | None = None) -> list[dict]:
    return [r for r in self.by_step[step] if r["module"] == module
            and (layer_type is None or r["layer_type"] == layer_type)]

  def mean(self, step: int, module: str, key: str, layer_type: str | None = None) -> float:
    values = [float(np.mean(r[key])) for r in self.records(step, module, layer_type) if key in r]
    return float(np.mean(values)) if values else float("nan")

  def local_type(self) -> str:
    """The layer_type of the run's local mixer ("swa", "linear", "delta"); "" for none."""
    types = {r["layer_type"] for r in self.by_step[self.final]} - {"global", "data"}
    return next(iter(types)) if len(types) == 1 else ""

  def global_input(self, step: int, key: str) -> float:
    return self.mean(step, INPUT, key, "global")

  def steepness(self, step: int, lag: int) -> float:
    """f(1) − f(lag) at the global layers' input."""
    values = [r["profile"][0] - r["profile"][r["lags"].index(lag)]
              for r in self.records(step, INPUT, "global") if lag in r["lags"]]
    return float(np.mean(values)) if values else float("nan")


def per_seed(runs: dict[int, Run], fn: Callable[[Run], float]) -> dict[int, float]:
  return {seed: fn(run) for seed, run in sorted(runs.items())}


def verdicts(runs: dict[str, dict[int, Run]], nulls: dict[str, dict]) -> list[Verdict]:
  """Each published finding (DESIGN.md) that the runs present can decide."""
  out = []
  have = lambda *names: all(n in runs and len(runs[n]) >= 2 for n in names)
  local = [e for e in LOCAL_EXPERIMENTS if have(e)]
  for e in local + (["nope"] if have("nope") else []):
    rs = runs[e]
    out.append(Verdict(
        f"{e}: recency exists at init", "gap − shuffled-token gap at the global layers' "
        "input, step 0", "the same model on tokens shuffled within documents",
        list(per_seed(rs, lambda r: r.global_input(0, "gap")
                      - r.global_input(0, "shuffled_gap")).values()), min_effect=MIN_COSINE))
    out.append(Verdict(
        f"{e}: recency strengthens with training", "gap(final) − gap(step 0), global input",
        "no change (paired within each run)",
        list(per_seed(rs, lambda r: r.global_input(r.final, "gap")
                      - r.global_input(0, "gap")).values()), min_effect=MIN_COSINE))
    depths = list(per_seed(rs, _depth).values())
    if not np.all(np.isnan(depths)):  # One global layer (gdn3's DDDG) has no depth to compare.
      out.append(Verdict(
          f"{e}: recency strengthens with depth", "gap at the last global layer's input − at "
          "the first, final step", "no change with depth", depths, min_effect=MIN_COSINE))
  for e in local:
    rs = runs[e]
    out.append(Verdict(
        f"{e}: norms lower the floor", "floor change of pre_mixer_norm and pre_mlp_norm "
        "(norm output − its input), mean over layers, final", "no change", list(per_seed(
            rs, lambda r: np.mean([r.mean(r.final, m, "floor_change")
                                   for m in ("pre_mixer_norm", "pre_mlp_norm")])).values()),
        sign=-1, min_effect=MIN_COSINE))
    out.append(Verdict(
        f"{e}: norms raise the gap", "gap change of the two norms, mean over layers, final",
        "no change", list(per_seed(rs, lambda r: np.mean([
            r.mean(r.final, m, "gap_change") for m in ("pre_mixer_norm", "pre_mlp_norm")
        ])).values()), min_effect=MIN_COSINE))
    kind = next(iter(rs.values())).local_type()
    out.append(Verdict(
        f"{e}: the local mixer raises the gap most", "gap change of the local mixer branch − "
        "the largest of the other modules' (norms, MLP, global mixer), final",
        "the local mixer is not above the rest", list(per_seed(
            rs, lambda r: r.mean(r.final, "mixer", "gap_change", kind) - max(
                r.mean(r.final, "mixer", "gap_change", "global"),
                r.mean(r.final, "mlp", "gap_change"),
                r.mean(r.final, "pre_mixer_norm", "gap_change"),
                r.mean(r.final, "pre_mlp_norm", "gap_change"))).values()),
        min_effect=MIN_COSINE))
    for module, what in (("residual_1", "the mixer's residual add"),
                         ("residual_2", "the MLP's residual add")):
      out.append(Verdict(
          f"{e}: {what} lowers the gap", f"gap of {module} − gap of the stream it adds to, "
          "mean over layers, final", "no change", list(per_seed(
              rs, lambda r, m=module: r.mean(r.final, m, "gap_change")).values()), sign=-1,
          min_effect=MIN_COSINE))
      out.append(Verdict(
          f"{e}: {what} raises the floor", f"floor of {module} − floor of the stream it adds "
          "to, final", "no change", list(per_seed(
              rs, lambda r, m=module: r.mean(r.final, m, "floor_change")).values()),
          min_effect=MIN_COSINE))
    out.append(Verdict(
        f"{e}: the MLP lowers the gap", "gap of the MLP output − of its normalised input, "
        "final", "no change", list(per_seed(
            rs, lambda r: r.mean(r.final, "mlp", "gap_change")).values()), sign=-1,
        min_effect=MIN_COSINE))
    out.append(Verdict(
        f"{e}: global NoPE attention raises the gap (weakly)", "gap of the global mixer output "
        "− of its normalised input, final", "no change", list(per_seed(
            rs, lambda r: r.mean(r.final, "mixer", "gap_change", "global")).values()),
        min_effect=MIN_COSINE))
  for e in local + (["nope"] if have("nope") else []):
    null = (nulls.get(e) or {}).get("logit_gap") or {}
    mu = null.get("mean") or 0.0
    out.append(Verdict(
        f"{e}: logit recency appears with training", "head- and layer-mean logit gap at the "
        "final step − the init-null mean", f"the empirical init null (mean {mu:+.4f}, SD "
        f"{null.get('sd') or float('nan'):.4f} over fresh initialisations)",
        list(per_seed(runs[e], lambda r: r.summary["logit_gap"] - mu).values()),
        min_effect=null.get("sd")))
  if have("swa16", "swa256"):
    out.append(Verdict(
        "smaller windows give steeper profiles", "f(1) − f(16) at the global input, swa16 − "
        "swa256, paired by seed, final", "no difference",
        paired(per_seed(runs["swa16"], lambda r: r.steepness(r.final, 16)),
               per_seed(runs["swa256"], lambda r: r.steepness(r.final, 16))),
        min_effect=MIN_COSINE))
    out.append(Verdict(
        "smaller windows reach lower loss", "final eval loss, swa16 − swa256, paired by seed",
        "no difference", paired(
            per_seed(runs["swa16"], lambda r: r.summary["eval_loss"]),
            per_seed(runs["swa256"], lambda r: r.summary["eval_loss"])), sign=-1,
        min_effect=MIN_LOSS))
  if have("swa16_flops256", "swa256"):
    out.append(Verdict(
        "smaller windows reach lower loss at equal FLOPs", "final eval loss, swa16 trained for "
        "swa256's FLOPs − swa256, paired by seed", "no difference", paired(
            per_seed(runs["swa16_flops256"], lambda r: r.summary["eval_loss"]),
            per_seed(runs["swa256"], lambda r: r.summary["eval_loss"])), sign=-1,
        min_effect=MIN_LOSS))
  if have("nopeswa256", "swa256"):
    out.append(Verdict(
        "NoPE-in-SWA with a large window: the logit gap swings in sign",
        "significant logit-gap sign flips, nopeswa256 − swa256, paired by seed",
        "no difference", paired(
            per_seed(runs["nopeswa256"], lambda r: r.summary["logit_gap_sign_flips"]),
            per_seed(runs["swa256"], lambda r: r.summary["logit_gap_sign_flips"])),
        min_effect=MIN_FLIPS))
    out.append(Verdict(
        "NoPE-in-SWA with a large window: the loss collapses (is worse)",
        "final eval loss, nopeswa256 − swa256, paired by seed", "no difference", paired(
            per_seed(runs["nopeswa256"], lambda r: r.summary["eval_loss"]),
            per_seed(runs["swa256"], lambda r: r.summary["eval_loss"])), min_effect=MIN_LOSS))
  return out


def mixers_compared(runs: dict[str, dict[int, Run]]) -> list[dict]:
  """The local mixers against each other (MIXER_PAIRS present with >= 2 common seeds): final
  eval loss, gap and f(1) − f(16) at the global input, each a − b paired by seed."""
  stats = (("final eval loss", lambda r: r.summary["eval_loss"]),
           ("gap (global input)", lambda r: r.global_input(r.final, "gap")),
           ("f(1) − f(16) (global input)", lambda r: r.steepness(r.final, 16)))
  out = []
  for a, b in MIXER_PAIRS:
    if a not in runs or b not in runs or len(set(runs[a]) & set(runs[b])) < 2:
      continue
    for name, fn in stats:
      v = Verdict(f"{a} − {b}", name, "no difference",
                  paired(per_seed(runs[a], fn), per_seed(runs[b], fn)))
      out.append({"pair": f"{a} − {b}", "statistic": name, "seeds": v.n, "mean": v.mean,
                  "se": v.se, "t": v.t, "critical": v.critical,
                  "reading": reading(a, b, v.t, v.critical, v.n)})
  return out


def _mixers_section(rows: list[dict]) -> list[str]:
  if not rows:
    return []
  lines = ["## The local mixers compared", "",
           "Each row is a − b per seed (same seed: same data order, and the same initialisation "
           "of every weight whose shape the two configs share), then the mean over seeds ± the "
           "seed-level SE, with Student's t against no difference (two-sided, 5%).", "",
           "| pair | statistic | seeds | mean ± seed SE | t (critical) | reading |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['pair']} | {r['statistic']} | {r['seeds']} | {_fmt(r['mean'], '+.4f')} "
                 f"± {_fmt(r['se'], '.4f')} | {_fmt(r['t'], '+.1f')} "
                 f"({_fmt(r['critical'], '.2f')}) | {r['reading']} |")
  return lines + [""]


def reading(a: str, b: str, t: float | None, critical: float | None, seeds: int) -> str:
  """What a − b paired over seeds shows: which side is larger where |t| clears the critical
  value."""
  if t is None or critical is None or not np.isfinite(t) or abs(t) <= critical:
    return f"no difference detected at {seeds} seeds"
  return f"{a} {'>' if t > 0 else '<'} {b}"


def _depth(r: Run) -> float:
  recs = sorted(r.records(r.final, INPUT, "global"), key=lambda x: x["layer"])
  return recs[-1]["gap"] - recs[0]["gap"] if len(recs) >= 2 else float("nan")


def extrapolation_correlation(runs: dict[str, dict[int, Run]]) -> dict:
  """Pearson r of the 2x extrapolation ratio with the gap, over all runs, seeds clustered by
  config in the bootstrap."""
  xs, ys = [], []
  for rs in runs.values():
    pairs = [(r.summary["extrapolation_gap"], r.summary["ratio"].get(2)) for r in rs.values()]
    pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
    xs.append([p[0] for p in pairs])
    ys.append([p[1] for p in pairs])
  return clustered_correlation(xs, ys)


def norm_effect_over_training(runs: dict[int, Run]) -> list[tuple[int, float, float | None]]:
  """(step, seed mean, seed SE) of the norms' floor change (mean of pre_mixer_norm and
  pre_mlp_norm over layers) at every step all seeds recorded: when the gains start to act."""
  steps = sorted(set.intersection(*(set(r.by_step) for r in runs.values())))
  out = []
  for step in steps:
    v = Verdict("", "", "", [float(np.mean([r.mean(step, m, "floor_change")
                                            for m in ("pre_mixer_norm", "pre_mlp_norm")]))
                             for r in runs.values()])
    out.append((step, v.mean, v.se))
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


def render(rows, found: list[Verdict], corr: dict, counts: dict[str, int], intro: str,
           norm_series: dict | None = None, mixers: list[dict] | None = None) -> str:
  lines = [intro, "", f"Records: {sum(counts.values())} runs — " + ", ".join(
      f"{e} ×{n}" for e, n in sorted(counts.items())) + ".", "", "## The sweep", "",
      compare_table.table(rows), "",
      "![gap and logit gap vs step](results/gap_vs_step.png)",
      "![loss vs window](results/loss_vs_window.png)",
      "![gap vs window](results/gap_vs_window.png)", "", "## Verdicts", "",
      "| finding | statistic (per seed) | null | seeds | mean ± seed SE | verdict | why |",
      "|---|---|---|---|---|---|---|"]
  for v in found:
    lines.append(f"| {v.finding} | {v.statistic} | {v.null} | {v.n} | "
                 f"{_fmt(v.mean, '+.4f')} ± {_fmt(v.se, '.4f')} | **{v.verdict}** | {v.note} |")
  lines.append("")
  lines += _mixers_section(mixers or [])
  for name, series in (norm_series or {}).items():
    lines += _norm_section(name, series)
  lines += ["## Length extrapolation and recency", "",
            f"Pearson r of the 2× extrapolation ratio with the gap (global input, training "
            f"length), over {corr.get('points', 0)} runs in {corr['groups']} configs: "
            f"{_fmt(corr['r'], '+.3f')}, 95% interval [{_fmt(corr['low'], '+.3f')}, "
            f"{_fmt(corr['high'], '+.3f')}] by a bootstrap that resamples whole configs "
            f"(seeds of one config are not independent evidence about configs; undefined below "
            f"3 configs).", ""]
  return "\n".join(lines) + "\n"


def build(records_dir: str, out_md: str, figures_dir: str | None, intro: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    dirs = unpack_all(records_dir, tmp)
    if not dirs:
      raise FileNotFoundError(f"no <experiment>/seed<k>.tar.gz under {records_dir}")
    runs = {e: {s: Run(d, f"{e}_seed{s}") for s, d in by_seed.items()}
            for e, by_seed in dirs.items()}
    workdirs = [d for by_seed in dirs.values() for d in by_seed.values()]
    names = [f"{e}_seed{s}" for e, by_seed in dirs.items() for s in by_seed]
    packs = [os.path.join(records_dir, e, f"seed{s}.tar.gz")
             for e, by_seed in dirs.items() for s in by_seed]
    result = compare.compare(workdirs, out_dir=figures_dir or os.path.join(tmp, "compare"),
                             figures=figures_dir is not None, names=names,
                             command="python launch/results.py", sources=packs)
    nulls = {e: next((r.summary["init_null"] for r in rs.values() if r.summary["init_null"]),
                     None) for e, rs in runs.items()}
    found = verdicts(runs, nulls)
    corr = extrapolation_correlation(runs)
    norm_series = {e: norm_effect_over_training(rs) for e, rs in runs.items()
                   if e in ("swa16", "swa64") and len(rs) >= 2}
    text = render(result["rows"], found, corr, {e: len(v) for e, v in runs.items()},
                  intro.replace("{commit}", _git_head()), norm_series, mixers_compared(runs))
  with open(out_md, "w") as f:
    f.write(text)
  return {"rows": result["rows"], "verdicts": [v.row() for v in found], "correlation": corr}
