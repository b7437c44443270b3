"""The verdict table of docs/results.md: every published finding the runs present can decide, as
`findings.Verdict`s built from `published_findings` statistics, Holm-adjusted as one family."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from hybrid_nope.analysis.evidence import two_level
from hybrid_nope.analysis.evidence.findings import Verdict, adjust
from hybrid_nope.analysis.evidence.published_findings import (INPUT, LOCAL_EXPERIMENTS, NOPE,
                                                               RESIDUALS, References,
                                                               Run, _depth, by_seed,
                                                               data_findings, mixer_most,
                                                               norm_change, verdict)

# The local mixers set side by side: (experiment, the one it is compared with), paired by seed.
MIXER_PAIRS = (("gdn", "gla"), ("gdn", "swa16"), ("gdn", "swa64"), ("gla", "swa64"),
               ("gdn3", "gdn"))
WINDOW_PAIR = ("swa16", "swa256")


def _init_findings(e, rs, nope, ref) -> list[Verdict]:
  m, rule = ref.cosine_margin(e)
  out = []
  if nope:
    out.append(verdict(
        f"{e}: the local layers plant recency at init (paired with nope)", "gap at the global "
        "layers' input, step 0, config − nope at the same layers", "no difference (same seed, "
        "same shared weights)", by_seed(rs, nope),
        lambda a, b: a.global_input_gap(0) - b.global_input_gap(0, a.global_layers),
        reference=m, rule=rule))
  out.append(verdict(
      f"{e}: the local layers plant recency at init (the local block's own step)", "gap of the "
      "stream after the local mixer's residual add − before it, step 0, local layers",
      "no change", by_seed(rs), lambda r: r.change("gap", 0, "residual_1", "input",
                                                   r.local_layers), reference=m, rule=rule))
  return out


def _growth_findings(e, rs, nope, ref) -> list[Verdict]:
  m, rule = ref.cosine_margin(e)
  grow = lambda r, layers=None: r.global_input_gap(r.final, layers) - r.global_input_gap(
      0, layers)
  out = [verdict(f"{e}: recency strengthens with training", "gap(final) − gap(step 0), global "
                 "input", "no change (paired within each run)", by_seed(rs), grow,
                 reference=m, rule=rule)]
  if nope and e != NOPE:
    out.append(verdict(
        f"{e}: the local layers' part of the strengthening", "[gap(final) − gap(0)] config − "
        "nope, global input at the config's global layers", "no difference", by_seed(rs, nope),
        lambda a, b: grow(a) - grow(b, a.global_layers), reference=m, rule=rule))
  first = next(iter(rs.values()))
  if len(first.global_layers) >= 2:  # gdn3's DDDG has one global layer: no depth.
    out.append(verdict(f"{e}: recency strengthens with depth", "gap at the last global layer's "
                       "input − at the first, final step", "no change with depth", by_seed(rs),
                       _depth, reference=m, rule=rule))
    if nope and e != NOPE:
      out.append(verdict(
          f"{e}: the local layers' part of the depth trend", "[last − first global layer's "
          "gap] config − nope at the same layers, final", "no difference", by_seed(rs, nope),
          lambda a, b: _depth(a) - _depth(b, a.global_layers), reference=m, rule=rule))
  return out


def _module_findings(e, rs, ref) -> list[Verdict]:
  m, rule = ref.cosine_margin(e)
  kw = dict(reference=m, rule=rule)
  (fm, frule), (gm, grule) = ref.norm_margin(e, "floor"), ref.norm_margin(e, "gap")
  out = [verdict(f"{e}: norms lower the floor", "floor change of the two norms (output − "
                 "input), mean over layers, final", "no change", by_seed(rs), norm_change("floor"),
                 sign=-1, reference=fm, rule=frule),
         verdict(f"{e}: norms raise the gap", "gap change of the two norms, mean over layers, "
                 "final", "no change", by_seed(rs), norm_change("gap"), reference=gm,
                 rule=grule)]

  out.append(verdict(f"{e}: the local mixer raises the gap most", "gap change of the local "
                     "mixer − the largest of the other modules' (norms, MLP, global mixer), "
                     "final", "the local mixer is not above the rest", by_seed(rs), mixer_most,
                     **kw))
  for module, (what, stream, branch) in RESIDUALS.items():
    for against, before, label in ((stream, "the stream it adds to", "stream"),
                                   (branch, "the branch it adds", "branch")):
      for kind, sign, verb in (("gap", -1, "lowers the gap"), ("floor", +1, "raises the floor")):
        out.append(verdict(
            f"{e}: {what} {verb} (against {before})", f"{kind} of {module} − {kind} of "
            f"{against}, mean over layers, final", "no change", by_seed(rs),
            lambda r, k=kind, mod=module, a=against: r.change(k, r.final, mod, a,
                                                              sorted(r.layer_types)),
            sign=sign, **kw))
  out.append(verdict(f"{e}: the MLP lowers the gap", "gap of the MLP output − of its normalised "
                     "input, final", "no change", by_seed(rs), lambda r: r.change(
                         "gap", r.final, "mlp", "pre_mlp_norm", sorted(r.layer_types)),
                     sign=-1, **kw))
  out.append(verdict(f"{e}: global NoPE attention raises the gap (weakly)", "gap of the global "
                     "mixer output − of its normalised input, final", "no change", by_seed(rs),
                     lambda r: r.change("gap", r.final, "mixer", INPUT, r.global_layers), **kw))
  return out


def with_null(estimate: two_level.Estimate, values, null: dict) -> two_level.Estimate | None:
  """A trained mean against the empirical init null of `draws` fresh initialisations: both
  spreads in the error, Welch–Satterthwaite degrees of freedom."""
  sd, k = null.get("sd"), null.get("draws")
  if estimate is None or not sd or not k or k < 2:
    return None
  a, b = estimate.se ** 2, sd ** 2 / k
  df = (a + b) ** 2 / (a ** 2 / estimate.df + b ** 2 / (k - 1))
  return dataclasses.replace(estimate, mean=estimate.mean - null["mean"], se=math.sqrt(a + b),
                             df=float(df))


def against_null(v: Verdict, null: dict) -> Verdict:
  """`v`'s trained values read against the empirical init null: its mean subtracted, its
  spread in the error (`with_null`)."""
  v.estimate = with_null(v.estimate, v.values, null)
  v.values = [x - null.get("mean", 0.0) for x in v.values]
  return v


def _logit_findings(e, rs, nulls, ref, nope=None) -> list[Verdict]:
  null = (nulls.get(e) or {}).get("logit_gap") or {}
  m, rule = ref.logit_margin(e)
  v = verdict(f"{e}: logit recency appears with training", "head- and layer-mean logit gap at "
              "the final step − the init-null mean", f"the empirical init null (mean "
              f"{null.get('mean', float('nan')):+.4f}, SD {null.get('sd') or float('nan'):.4f} "
              f"over {null.get('draws', 0)} fresh initialisations; Welch)", by_seed(rs),
              lambda r: r.logit_gap(r.final), reference=m, rule=rule)
  against_null(v, null)
  out = [v]
  if nope and e != NOPE:
    out.append(verdict(
        f"{e}: the hybrid reads out more recency than nope", "head- and layer-mean logit gap, "
        "final, config − nope at the config's global layers, paired by seed", "no difference "
        "(a negative value: the global-only model, with recency from its causal mask alone, "
        "reads out more)", by_seed(rs, nope), lambda a, b: a.logit_gap(a.final)
        - b.logit_gap(b.final, a.global_layers), reference=m, rule=rule))
  if all(r.has_shuffled_readout() for r in rs.values()):
    out.append(verdict(
        f"{e}: the read-out is of position, not content matching", "logit gap − shuffled-token "
        "logit gap, head and layer mean, final", "the same model on tokens shuffled within "
        "documents", by_seed(rs), lambda r: r.logit_gap(r.final) - np.mean(
            [r.at(r.final).shuffled_logit_gap(g) for g in r.global_layers], axis=0),
        reference=m, rule=rule))
  return out


def _window_findings(runs, ref) -> list[Verdict]:
  out = []
  small, large = WINDOW_PAIR
  loss = lambda a, b: a.summary["eval_loss"] - b.summary["eval_loss"]
  lm, lrule = ref.loss_margin(large)
  if small in runs and large in runs:
    m, rule = ref.cosine_margin(large)
    out.append(verdict("smaller windows give steeper profiles", "f(1) − f(16) at the global "
                       "input, swa16 − swa256, paired by seed, final", "no difference",
                       by_seed(runs[small], runs[large]),
                       lambda a, b: a.steepness(a.final, 16) - b.steepness(b.final, 16),
                       reference=m, rule=rule))
    out.append(verdict("smaller windows reach lower loss", "final eval loss, swa16 − swa256, "
                       "paired by seed", "no difference", by_seed(runs[small], runs[large]),
                       loss, sign=-1, reference=lm, rule=lrule))
  if "swa16_flops256" in runs and large in runs:
    out.append(verdict("smaller windows reach lower loss at equal FLOPs", "final eval loss, "
                       "swa16 trained for swa256's FLOPs − swa256, paired by seed",
                       "no difference", by_seed(runs["swa16_flops256"], runs[large]), loss,
                       sign=-1, reference=lm, rule=lrule))
  if "nopeswa256" in runs and large in runs:
    out.append(verdict("NoPE-in-SWA with a large window: the loss collapses (is worse)",
                       "final eval loss, nopeswa256 − swa256, paired by seed", "no difference",
                       by_seed(runs["nopeswa256"], runs[large]), loss, reference=lm,
                       rule=lrule))
  return out


def mixer_verdicts(runs: dict[str, dict[int, Run]], ref: References) -> list[Verdict]:
  """The local mixers against each other: loss (seed level), gap and steepness at the global
  input (seed × document), a − b paired by seed; they join the page's Holm family."""
  out = []
  for a, b in MIXER_PAIRS:
    if a not in runs or b not in runs or len(set(runs[a]) & set(runs[b])) < 2:
      continue
    m, rule = ref.cosine_margin(b)
    lm, lrule = ref.loss_margin(b)
    for name, fn, mm, mrule in (
        ("final eval loss", lambda x, y: x.summary["eval_loss"] - y.summary["eval_loss"], lm,
         lrule),
        ("gap (global input)", lambda x, y: x.global_input_gap(x.final)
         - y.global_input_gap(y.final), m, rule),
        ("f(1) − f(16) (global input)", lambda x, y: x.steepness(x.final, 16)
         - y.steepness(y.final, 16), m, rule)):
      out.append(verdict(f"{a} − {b}", name, "no difference", by_seed(runs[a], runs[b]), fn,
                         reference=mm, rule=mrule))
  return out


def all_verdicts(runs: dict[str, dict[int, Run]], nulls: dict[str, dict]
                 ) -> tuple[list[Verdict], list[Verdict]]:
  """(findings, mixer rows), Holm-adjusted together as the page's one family."""
  have = lambda *names: all(n in runs and len(runs[n]) >= 2 for n in names)
  local = [e for e in LOCAL_EXPERIMENTS if have(e)]
  nope = runs[NOPE] if have(NOPE) else None
  ref = References(runs, local)
  found = data_findings(nope or runs[local[0]]) if (nope or local) else []
  for e in local:
    found += _init_findings(e, runs[e], nope, ref)
  for e in local + ([NOPE] if nope else []):
    found += _growth_findings(e, runs[e], nope, ref)
  for e in local:
    found += _module_findings(e, runs[e], ref)
  for e in local + ([NOPE] if nope else []):
    found += _logit_findings(e, runs[e], nulls, ref, nope)
  found += _window_findings(runs, ref)
  mixers = mixer_verdicts(runs, ref)
  adjust(found + mixers)
  return found, mixers

