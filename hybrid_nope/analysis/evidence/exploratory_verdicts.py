"""Decides the exploratory verdict table of docs/results.md: every published finding the runs
present can decide, as `verdict_rules.Verdict`s built from `finding_statistics` statistics, adjusted
as one family. Which experiment plays which part comes from `exploratory_experiments`."""
from __future__ import annotations

import numpy as np

from hybrid_nope.analysis.evidence.exploratory_experiments import Experiments
from hybrid_nope.analysis.evidence.verdict_rules import Verdict, adjust
from hybrid_nope.analysis.evidence.finding_statistics import (INPUT, RESIDUALS, References, Run,
                                                               against_null, by_seed,
                                                               data_findings, depth_trend,
                                                               mixer_most, norm_change, verdict)

RunsBySeed = dict[int, Run]


def _init_findings(experiment: str, runs: RunsBySeed, baseline: str,
                   baseline_runs: RunsBySeed | None, references: References) -> list[Verdict]:
  margin, margin_rule = references.cosine_margin(experiment)
  out = []
  if baseline_runs:
    out.append(verdict(
        f"{experiment}: the local layers plant recency at init (paired with {baseline})",
        f"gap at the global layers' input, step 0, config − {baseline} at the same layers",
        "no difference (same seed, same shared weights)", by_seed(runs, baseline_runs),
        lambda a, b: a.global_input_gap(0) - b.global_input_gap(0, a.global_layers),
        reference=margin, rule=margin_rule))
  out.append(verdict(
      f"{experiment}: the local layers plant recency at init (the local block's own step)",
      "gap of the stream after the local mixer's residual add − before it, step 0, local layers",
      "no change", by_seed(runs), lambda r: r.change("gap", 0, "residual_1", "input",
                                                     r.local_layers),
      reference=margin, rule=margin_rule))
  return out


def _growth_findings(experiment: str, runs: RunsBySeed, baseline: str,
                     baseline_runs: RunsBySeed | None, references: References) -> list[Verdict]:
  margin, margin_rule = references.cosine_margin(experiment)
  grow = lambda r, layers=None: r.global_input_gap(r.final, layers) - r.global_input_gap(
      0, layers)
  against_baseline = bool(baseline_runs) and experiment != baseline
  out = [verdict(f"{experiment}: recency strengthens with training", "gap(final) − gap(step 0), "
                 "global input", "no change (paired within each run)", by_seed(runs), grow,
                 reference=margin, rule=margin_rule)]
  if against_baseline:
    out.append(verdict(
        f"{experiment}: the local layers' part of the strengthening", "[gap(final) − gap(0)] "
        f"config − {baseline}, global input at the config's global layers", "no difference",
        by_seed(runs, baseline_runs), lambda a, b: grow(a) - grow(b, a.global_layers),
        reference=margin, rule=margin_rule))
  first = next(iter(runs.values()))
  if len(first.global_layers) >= 2:  # A pattern with one global layer (DDDG) has no depth.
    out.append(verdict(f"{experiment}: recency strengthens with depth", "gap at the last global "
                       "layer's input − at the first, final step", "no change with depth",
                       by_seed(runs), depth_trend, reference=margin, rule=margin_rule))
    if against_baseline:
      out.append(verdict(
          f"{experiment}: the local layers' part of the depth trend", "[last − first global "
          f"layer's gap] config − {baseline} at the same layers, final", "no difference",
          by_seed(runs, baseline_runs),
          lambda a, b: depth_trend(a) - depth_trend(b, a.global_layers),
          reference=margin, rule=margin_rule))
  return out


def _residual_findings(experiment: str, runs: RunsBySeed, margin: dict) -> list[Verdict]:
  """Both readings of each residual add (against the stream, against the branch)."""
  out = []
  for module, (what, stream, branch) in RESIDUALS.items():
    for against, before in ((stream, "the stream it adds to"), (branch, "the branch it adds")):
      for kind, sign, verb in (("gap", -1, "lowers the gap"), ("floor", +1, "raises the floor")):
        out.append(verdict(
            f"{experiment}: {what} {verb} (against {before})", f"{kind} of {module} − {kind} of "
            f"{against}, mean over layers, final", "no change", by_seed(runs),
            lambda r, k=kind, mod=module, a=against: r.change(k, r.final, mod, a,
                                                              sorted(r.layer_types)),
            sign=sign, **margin))
  return out


def _module_findings(experiment: str, runs: RunsBySeed, references: References
                     ) -> list[Verdict]:
  cosine_margin, cosine_rule = references.cosine_margin(experiment)
  margin = dict(reference=cosine_margin, rule=cosine_rule)
  floor_margin, floor_rule = references.norm_margin(experiment, "floor")
  gap_margin, gap_rule = references.norm_margin(experiment, "gap")
  out = [verdict(f"{experiment}: norms lower the floor", "floor change of the two norms (output "
                 "− input), mean over layers, final", "no change", by_seed(runs),
                 norm_change("floor"), sign=-1, reference=floor_margin, rule=floor_rule),
         verdict(f"{experiment}: norms raise the gap", "gap change of the two norms, mean over "
                 "layers, final", "no change", by_seed(runs), norm_change("gap"),
                 reference=gap_margin, rule=gap_rule),
         verdict(f"{experiment}: the local mixer raises the gap most", "gap change of the local "
                 "mixer − the largest of the other modules' (norms, MLP, global mixer), final",
                 "the local mixer is not above the rest", by_seed(runs), mixer_most, **margin)]
  out += _residual_findings(experiment, runs, margin)
  out.append(verdict(f"{experiment}: the MLP lowers the gap", "gap of the MLP output − of its "
                     "normalised input, final", "no change", by_seed(runs), lambda r: r.change(
                         "gap", r.final, "mlp", "pre_mlp_norm", sorted(r.layer_types)),
                     sign=-1, **margin))
  out.append(verdict(f"{experiment}: global NoPE attention raises the gap (weakly)", "gap of the "
                     "global mixer output − of its normalised input, final", "no change",
                     by_seed(runs), lambda r: r.change("gap", r.final, "mixer", INPUT,
                                                       r.global_layers), **margin))
  return out


def _logit_findings(experiment: str, runs: RunsBySeed, init_nulls: dict, baseline: str,
                    baseline_runs: RunsBySeed | None, references: References) -> list[Verdict]:
  null = (init_nulls.get(experiment) or {}).get("logit_gap") or {}
  margin, margin_rule = references.logit_margin(experiment)
  appears = verdict(
      f"{experiment}: logit recency appears with training", "head- and layer-mean logit gap at "
      "the final step − the init-null mean", f"the empirical init null (mean "
      f"{null.get('mean', float('nan')):+.4f}, SD {null.get('sd') or float('nan'):.4f} "
      f"over {null.get('draws', 0)} fresh initialisations; Welch)", by_seed(runs),
      lambda r: r.logit_gap(r.final), reference=margin, rule=margin_rule)
  out = [against_null(appears, null)]
  if baseline_runs and experiment != baseline:
    out.append(verdict(
        f"{experiment}: the hybrid reads out more recency than {baseline}", "head- and "
        f"layer-mean logit gap, final, config − {baseline} at the config's global layers, paired "
        "by seed", "no difference (a negative value: the global-only model, with recency from "
        "its causal mask alone, reads out more)", by_seed(runs, baseline_runs),
        lambda a, b: a.logit_gap(a.final) - b.logit_gap(b.final, a.global_layers),
        reference=margin, rule=margin_rule))
  if all(r.has_shuffled_readout() for r in runs.values()):
    out.append(verdict(
        f"{experiment}: the read-out is of position, not content matching", "logit gap − "
        "shuffled-token logit gap, head and layer mean, final", "the same model on tokens "
        "shuffled within documents", by_seed(runs), lambda r: r.logit_gap(r.final) - np.mean(
            [r.at(r.final).shuffled_logit_gap(g) for g in r.global_layers], axis=0),
        reference=margin, rule=margin_rule))
  return out


def _window_findings(runs: dict[str, RunsBySeed], experiments: Experiments,
                     references: References) -> list[Verdict]:
  windows = experiments.windows
  small, large = windows.small, windows.large
  loss = lambda a, b: a.summary["eval_loss"] - b.summary["eval_loss"]
  loss_margin, loss_rule = references.loss_margin(large)
  out = []
  if small in runs and large in runs:
    margin, margin_rule = references.cosine_margin(large)
    out.append(verdict("smaller windows give steeper profiles", "f(1) − f(16) at the global "
                       f"input, {small} − {large}, paired by seed, final", "no difference",
                       by_seed(runs[small], runs[large]),
                       lambda a, b: a.steepness(a.final, 16) - b.steepness(b.final, 16),
                       reference=margin, rule=margin_rule))
    out.append(verdict("smaller windows reach lower loss", f"final eval loss, {small} − {large}, "
                       "paired by seed", "no difference", by_seed(runs[small], runs[large]),
                       loss, sign=-1, reference=loss_margin, rule=loss_rule))
  if windows.small_at_large_flops in runs and large in runs:
    out.append(verdict("smaller windows reach lower loss at equal FLOPs", "final eval loss, "
                       f"{small} trained for {large}'s FLOPs − {large}, paired by seed",
                       "no difference", by_seed(runs[windows.small_at_large_flops],
                                                runs[large]),
                       loss, sign=-1, reference=loss_margin, rule=loss_rule))
  if windows.nope_in_swa_large in runs and large in runs:
    out.append(verdict("NoPE-in-SWA with a large window: the loss collapses (is worse)",
                       f"final eval loss, {windows.nope_in_swa_large} − {large}, paired by seed",
                       "no difference", by_seed(runs[windows.nope_in_swa_large], runs[large]),
                       loss, reference=loss_margin, rule=loss_rule))
  return out


def mixer_verdicts(runs: dict[str, RunsBySeed], mixer_pairs, references: References
                   ) -> list[Verdict]:
  """The local mixers against each other (`mixer_pairs`: (config, compared with)): loss (seed
  level), gap and steepness at the global input (seed × document), a − b paired by seed; they
  join the page's family."""
  out = []
  for a, b in mixer_pairs:
    if a not in runs or b not in runs or len(set(runs[a]) & set(runs[b])) < 2:
      continue
    cosine_margin, cosine_rule = references.cosine_margin(b)
    loss_margin, loss_rule = references.loss_margin(b)
    for name, fn, margin, margin_rule in (
        ("final eval loss", lambda x, y: x.summary["eval_loss"] - y.summary["eval_loss"],
         loss_margin, loss_rule),
        ("gap (global input)", lambda x, y: x.global_input_gap(x.final)
         - y.global_input_gap(y.final), cosine_margin, cosine_rule),
        ("f(1) − f(16) (global input)", lambda x, y: x.steepness(x.final, 16)
         - y.steepness(y.final, 16), cosine_margin, cosine_rule)):
      out.append(verdict(f"{a} − {b}", name, "no difference", by_seed(runs[a], runs[b]), fn,
                         reference=margin, rule=margin_rule))
  return out


def all_verdicts(runs: dict[str, RunsBySeed], init_nulls: dict[str, dict],
                 experiments: Experiments) -> tuple[list[Verdict], list[Verdict]]:
  """(findings, mixer rows), adjusted together as the page's one family."""
  have = lambda *names: all(n in runs and len(runs[n]) >= 2 for n in names)
  baseline = experiments.baseline
  local = [e for e in experiments.local if have(e)]
  baseline_runs = runs[baseline] if have(baseline) else None
  with_baseline = local + ([baseline] if baseline_runs else [])
  references = References(runs, local, baseline)
  found = (data_findings(baseline_runs or runs[local[0]]) if (baseline_runs or local)
           else [])
  for experiment in local:
    found += _init_findings(experiment, runs[experiment], baseline, baseline_runs, references)
  for experiment in with_baseline:
    found += _growth_findings(experiment, runs[experiment], baseline, baseline_runs, references)
  for experiment in local:
    found += _module_findings(experiment, runs[experiment], references)
  for experiment in with_baseline:
    found += _logit_findings(experiment, runs[experiment], init_nulls, baseline, baseline_runs,
                             references)
  found += _window_findings(runs, experiments, references)
  mixers = mixer_verdicts(runs, experiments.mixer_pairs, references)
  adjust(found + mixers)
  return found, mixers
