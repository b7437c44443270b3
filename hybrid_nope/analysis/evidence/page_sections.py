"""The sections of docs/results.md, drawn from numbers already computed (results_page.py
assembles them): verdict tables, the causal test, norms over training, extrapolation at fixed
loss, propagation, and where two corpora agree. `h` is the section heading's markdown prefix
("##" on a one-corpus page, "###" inside a corpus's section)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hybrid_nope.analysis.evidence import extrapolation, verdict_rules
from hybrid_nope.analysis.evidence.verdict_rules import ALPHA, Verdict


def fmt(v, spec):
  return "—" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, spec)


def norm_section(name: str, series, h: str = "##") -> list[str]:
  # Above float32 rounding too: at init the change is ~1e-8 with an even smaller SE.
  moving = next((step for step, m, se in series if se and abs(m) > max(2 * se, 1e-4)), None)
  lines = [f"{h} When the norm gains move ({name})", "",
           "The norms' effect on the floor (norm output − its input, mean over layers and both "
           "norms), seed mean ± seed SE, at each recorded step; at init the gains are 1 and "
           "RMSNorm leaves every cosine unchanged, so any change is the gains moving. First step "
           f"beyond 2 SE of 0 (and 1e-4): {moving if moving is not None else 'none'}.", "",
           "| step | " + " | ".join(str(s) for s, _, _ in series) + " |",
           "|" + "---|" * (len(series) + 1),
           "| floor change | " + " | ".join(f"{fmt(m, '+.4f')} ± {fmt(se, '.4f')}"
                                          for _, m, se in series) + " |", ""]
  return lines


VERDICT_HEADER = ("| finding | statistic (per seed) | null | seeds | mean ± SE (levels) | margin "
                  "(rule) | p / Holm p | verdict | why |")


def verdict_row(v: Verdict) -> str:
  margin = f"±{v.margin:.3g} ({v.margin_rule})" if v.margin is not None else "—"
  return (f"| {v.finding} | {v.statistic} | {v.null} | {v.n} | {fmt(v.mean, '+.4f')} ± "
          f"{fmt(v.se, '.4f')} ({v.levels}) | {margin} | {fmt(v.p, '.2g')} / "
          f"{fmt(v.p_adjusted, '.2g')} | **{v.verdict}** | {v.note} |")


def verdicts_section(title: str, intro: str, rows: list[Verdict], h: str = "##") -> list[str]:
  if not rows:
    return []
  return [f"{h} {title}", "", intro, "", VERDICT_HEADER, "|---|---|---|---|---|---|---|---|---|",
          *(verdict_row(v) for v in rows), ""]


def extrapolation_section(regressions: dict[int, dict], corr: dict, controls: Sequence[str],
                          h: str = "##") -> list[str]:
  """The regression at fixed loss per factor; `controls`: the configs built to fail."""
  lines = [f"{h} Length extrapolation and recency, at fixed loss", "",
           "Per factor k (evaluation length / training length): ratio_k = a + b·gap + c·loss "
           "over configs (seed means), b's 95% interval by a bootstrap over whole configs, and "
           "the partial correlation of ratio and gap given loss "
           "(hybrid_nope/analysis/evidence/extrapolation.py).", "",
           "| k | configs | slope b (gap) | 95% interval | partial r | ratios | reading |",
           "|---|---|---|---|---|---|---|"]
  for k, r in sorted(regressions.items()):
    rng = r["ratio_range"] or [None, None]
    lines.append(f"| {k} | {r['n']} | {fmt(r['slope'], '+.3g')} | [{fmt(r['low'], '+.3g')}, "
                 f"{fmt(r['high'], '+.3g')}] | {fmt(r['partial_r'], '+.2f')} | "
                 f"{fmt(rng[0], '.3f')}–{fmt(rng[1], '.3f')} | {extrapolation.decided(r)} |")
  calm = [k for k, r in sorted(regressions.items()) if r["ratio_range"] and
          not extrapolation.has_failure(r)]
  if calm:
    lines += ["", f"At {', '.join(f'{k}×' for k in calm)} no config fails to extrapolate (every "
              f"ratio below {extrapolation.FAILURE_RATIO}): the regression has no failure to "
              "explain there. The configs built to fail are configs/small.py's RoPE-global "
              f"controls ({', '.join(controls)})."]
  for k, r in sorted(regressions.items()):
    if r["ratio_range"] and r.get("points"):
      lines += _extrapolation_configs(k, r, controls)
  lines += ["", f"For comparison, the raw Pearson r of the 2× ratio with the gap over "
            f"{corr.get('points', 0)} runs in {corr['groups']} configs: {fmt(corr['r'], '+.3f')}"
            f", 95% [{fmt(corr['low'], '+.3f')}, {fmt(corr['high'], '+.3f')}] (configs "
            f"resampled whole); it does not hold the loss fixed.", ""]
  return lines


def _extrapolation_configs(k: int, regression: dict, controls: Sequence[str]) -> list[str]:
  """The regression's points at factor k, one per config (seed means): which fail, and whether
  each is one of the RoPE-global controls built to fail."""
  fails = extrapolation.failing(regression)
  if not fails:
    reading = ("None fails, the controls built to fail included." if set(controls) & set(
        regression["configs"]) else "None fails; no control built to fail was run here.")
  elif set(fails) <= set(controls):
    reading = f"{len(fails)} of {regression['n']} fail, only controls built to fail: "
  else:
    reading = f"{len(fails)} of {regression['n']} fail, not only the controls built to fail: "
  lines = ["", f"At {k}×, per config (seed means; fails: ratio ≥ {extrapolation.FAILURE_RATIO}; "
           f"built to fail: global layers with RoPE). {reading}{', '.join(fails)}", "",
           "| config | seeds | gap at the training length | eval loss | ratio ± seed SE | fails "
           "| built to fail |", "|---|---|---|---|---|---|---|"]
  for p in sorted(regression["points"], key=lambda p: -p["ratio"]):
    lines.append(f"| {p['config']} | {p.get('seeds', '—')} | {fmt(p['gap'], '.4f')} | "
                 f"{fmt(p['eval_loss'], '.4f')} | {fmt(p['ratio'], '.4f')} ± "
                 f"{fmt(p.get('ratio_se'), '.4f')} | {'**yes**' if p['config'] in fails else 'no'}"
                 f" | {'yes' if p['config'] in controls else 'no'} |")
  return lines


def propagation_section(rows: list[dict], h: str = "##") -> list[str]:
  def cell(r, name):
    if r[f"error_{name}"] is None:
      return "— (a kind no other config has)"
    return (f"{fmt(r[f'error_{name}'], '.1%')} ± {fmt(r[f'error_{name}_se'], '.1%')} "
            f"({'holds' if r[f'holds_{name}'] else 'fails'})")
  lines = [f"{h} How the gap propagates", "",
           "The gap at each global layer's normalised input predicted from the embedding's, "
           "through a transfer per module kind (gap after / gap before, per boundary and layer "
           "type; hybrid_nope/analysis/evidence/propagation.py), fitted on the other configs "
           "(across) or on the config's other seeds (within); mean relative error over its "
           "global layers ± seed SE, final step. It holds within "
           f"{verdict_rules.MARGIN_FRACTION:.0%}.", "",
           "| config | seeds | measured gap | error, transfers from other configs | error, "
           "from its other seeds |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['config']} | {r['seeds']} | {fmt(r['measured_gap'], '.4f')} | "
                 f"{cell(r, 'across')} | {cell(r, 'within')} |")
  tally = []
  for name, what in (("across", "from other configs"), ("within", "from its other seeds")):
    tried = [r for r in rows if r[f"error_{name}"] is not None]
    failed = [r["config"] for r in tried if not r[f"holds_{name}"]]
    tally.append(f"{what} it fails for {len(failed)} of {len(tried)} configs"
                 + (f" ({', '.join(failed)})" if failed else ""))
  return lines + ["", f"Where propagation fails: {'; '.join(tally)}. A per-kind transfer that "
                  "fails from a config's own seeds does not carry its gap through the stack.", ""]


def causal_section(rows: list[dict], h: str = "##") -> list[str]:
  """The causal test per config (analysis/evidence/causal.py): the verdict rows, then
  `causal_details`."""
  if not rows:
    return []
  lines = verdicts_section(
      "The causal test: local branches ablated", "Per config with a local mixer, from each "
      "seed's `analyze.py --ablate=local` (analysis/checkpoint/ablation.py): the local "
      "branches' outputs permuted within documents (content and norm kept, position gone) "
      "against the branch kept plus position-free noise, its dial set so its eval loss is the "
      "ablation's (`added_noise_matched`; older files: `noise_matched`, noise in the branch's "
      "place; the oldest: the rotated control, which keeps the perturbation's Gram structure "
      "and with it recency).", [r["verdict"] for r in rows], h)
  return lines + causal_details(rows)


def causal_details(rows: list[dict]) -> list[str]:
  """Per config of `causal.row`s: the read-out's change signed and unsigned, the layers without
  a stable sign, the part specific to position, what the ablation costs in loss, per layer the
  same, and the controls' own effects (`control_effects_table`)."""
  lines = ["The verdict's statistic is signed by each layer's clean logit gap (negative: the "
           "read-out shrinks toward 0, which any damage does: hence a control of equal "
           "damage); the unsigned column reads the read-out's own direction. Position: "
           "another row's branch at the same positions (position kept, content gone) against "
           "noise (both gone), unsigned; a positive value is read-out that position alone "
           "carries.", "",
           "| config | seeds | control | clean \\|logit gap\\| | ablated − control, signed ± SE "
           "| unsigned ± seed SE | layers without a stable sign | position: other_row − noise "
           "| eval loss, ablated − clean ± seed SE |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    unstable = ", ".join(str(x) for x in r.get("no_stable_sign", [])) or "—"
    position = (r.get("position") or {}).get("other_row_minus_noise")
    lines.append(f"| {r['config']} | {r['seeds']} | {r.get('control', '—')} | "
                 f"{fmt(r['clean'], '+.4f')} | {fmt(r['ablated_minus_control'], '+.4f')} ± "
                 f"{fmt(r['se'], '.4f')} | {fmt(r.get('ablated_minus_control_unsigned'), '+.4f')}"
                 f" ± {fmt(r.get('ablated_minus_control_unsigned_se'), '.4f')} | {unstable} | "
                 f"{fmt(position, '+.4f')} | {fmt(r.get('loss_ablated_minus_clean'), '+.4f')} ± "
                 f"{fmt(r.get('loss_ablated_minus_clean_se'), '.4f')} |")
  per_layer = [(r["config"], layer) for r in rows for layer in r.get("layers", [])]
  if per_layer:
    lines += ["", "Per global NoPE layer (seed means): its clean logit gap, whether that sign "
              "holds in every seed, and ablated − control unsigned and signed.", "",
              "| config | layer | clean logit gap | stable sign | unsigned | signed |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c} | {x['layer']} | {fmt(x['clean'], '+.4f')} | "
              f"{'yes' if x['stable_sign'] else '**no**'} | "
              f"{fmt(x['ablated_minus_control'], '+.4f')} | "
              f"{fmt(x['ablated_minus_control_signed'], '+.4f')} |" for c, x in per_layer]
  return lines + [""] + control_effects_table(rows)


def _pm(pair, spec: str) -> str:
  mean, se = pair if pair else (None, None)
  return fmt(mean, spec) + (f" ± {fmt(se, spec.lstrip('+'))}" if se is not None else "")


def control_effects_table(rows: list[dict]) -> list[str]:
  """Per config whose files have the matched control: what the ablation and the controls of
  equal damage do to the local branches' own gap and to the gap at the global layers' input
  (causal.control_effects), and whether the verdict's control is neutral."""
  rows = [r for r in rows if (r.get("control_effects") or {}).get("seeds")]
  if not rows:
    return []
  lines = ["The interventions' own effects (seed means ± seed SE): the local branches' own gap "
           "(≈ 0 where the branch carries no position), the change of the gap at the global "
           "layers' normalised input from clean, and the eval loss at the dial λ that matches "
           "the ablation's. The verdict's control must add or remove no recency of its own: "
           "added_noise_matched (the branch kept) leaves the clean gap, noise_matched (older "
           "files: noise in the branch's place) the ablated one.", "",
           "| config | seeds | condition | λ | branch's own gap | global input gap − clean "
           "| eval loss | read-out: ablated − it (unsigned) |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    e = r["control_effects"]
    for c, x in e["conditions"].items():
      lines.append(f"| {r['config']} | {e['seeds']} | {c} | {fmt(x['lam'][0], '.3g')} | "
                   f"{_pm(x['branch_gap'], '+.4f')} | "
                   f"{_pm(x['input_gap_change'], '+.4f') if c != 'clean' else '0'} | "
                   f"{_pm(x['eval_loss'], '.4f')} | "
                   f"{_pm(x.get('readout_ablated_minus'), '+.4f')} |")
  lines += ["", "| config | seeds | the verdict's control − what it must leave, global input gap "
            "± seed SE | mean document SE per seed | ≈ 0: within a tenth of the ablation's "
            "change |", "|---|---|---|---|---|"]
  for r in rows:
    e = r["control_effects"]
    lines.append(f"| {r['config']} | {e['seeds']} | {e['control']} − {e['neutral_against']}: "
                 f"{_pm(e['own_gap_effect'], '+.4f')} | {fmt(e['document_se'], '.4f')} | "
                 f"{'yes' if e['neutral'] else '**no**'} (±{fmt(e['neutral_bound'], '.4f')}) |")
  failing = [r for r in rows if not r["control_effects"]["neutral"]]
  if failing:
    lines += ["", "**The matched control is not neutral for " + ", ".join(
        f"{r['config']} ({r['control_effects']['control']}, λ "
        f"{fmt(r['control_effects']['control_lam'], '.3g')})" for r in failing) + "**: to cost "
        "what the ablation costs, its noise is scaled past the ablation's norm, and at that size "
        "it dilutes the cosines at the global layers' input. Its read-out difference then mixes "
        "position with that dilution, so the causal row reads **invalid** (verdict_rules.py): "
        "no outcome against this control decides the claim. other_row_matched keeps the "
        "branch's position and drops its content: ablated − it (last column above) is the part "
        "of the read-out specific to position, at equal damage but not free of position."]
  return lines + [""]


def agreement_section(by_corpus: dict[str, list[Verdict]]) -> list[str]:
  """Every finding decided on more than one corpus: its verdict on each, and whether they
  agree (the same verdict kind)."""
  names = list(by_corpus)
  tables = {c: {v.finding: v for v in vs} for c, vs in by_corpus.items()}
  shared = [f for f in dict.fromkeys(f for vs in by_corpus.values() for f in
                                     (v.finding for v in vs))
            if sum(f in t for t in tables.values()) >= 2]
  if not shared:
    return []
  lines = ["## Where the corpora agree", "",
           "Each finding measured on more than one corpus: its verdict and seed mean ± SE on "
           "each (same statistic, same margin rule, exploratory q-values). They agree when the "
           "verdict kinds match; they differ in power only when one corpus decides and another "
           "cannot (inconclusive, untestable or invalid) with the mean on the same side; they "
           "disagree otherwise.", "",
           "| finding | " + " | ".join(names) + " | agree |",
           "|---|" + "---|" * len(names) + "---|"]
  readings = {}
  for f in shared:
    cells = [tables[c].get(f) for c in names]
    text = [f"{v.verdict} ({fmt(v.mean, '+.4f')} ± {fmt(v.se, '.4f')})" if v else "—"
            for v in cells]
    readings[f] = agreement([v for v in cells if v is not None])
    lines.append(f"| {f} | " + " | ".join(text) + f" | {readings[f]} |")
  counts = {k: sum(1 for r in readings.values() if r == k) for k in AGREEMENT}
  return lines + ["", f"Of {len(shared)} findings: {counts['yes']} agree, "
                  f"{counts['power only']} differ in power only, {counts['no']} disagree.", ""]


AGREEMENT = ("yes", "power only", "no")
UNDECIDED = ("inconclusive", "untestable", "invalid")


def agreement(cells: list[Verdict]) -> str:
  """yes: one verdict kind; power only: the decided ones agree, the rest could not decide,
  and every mean lies on the same side of 0; no: otherwise."""
  kinds = {v.verdict for v in cells}
  if len(kinds) == 1:
    return "yes"
  decided = {k for k in kinds if k not in UNDECIDED}
  signs = {np.sign(v.mean) for v in cells if v.mean is not None}
  return "power only" if len(decided) == 1 and len(signs) == 1 else "no"


def readout_inversions(rows: list[Verdict], baseline: str) -> list[str]:
  """A sentence where the data contradict stage 3: a hybrid whose global layers read out less
  recency than the global-only model's, `baseline` (its "reads out more recency than" rows)."""
  inverted = [v for v in rows if v.finding.endswith(f"reads out more recency than {baseline}")
              and v.mean is not None and v.mean < 0]
  significant = [v for v in inverted if v.p_adjusted is not None and v.p_adjusted < ALPHA]
  if not significant:
    return []
  others = [v.finding.split(":")[0] for v in inverted if v not in significant]
  return ["**Against stage 3:** the global-only model reads out more recency than " + ", ".join(
      f"{v.finding.split(':')[0]} ({fmt(v.mean, '+.4f')} ± {fmt(v.se, '.4f')}, q "
      f"{fmt(v.p_adjusted, '.2g')})" for v in significant) + ": its recency comes from the "
      "causal mask alone (c_global(d) = 1 − O(d/i)), and these hybrids' global layers do not "
      "read out more of what their local layers plant."
      + (f" The same sign, not significant: {', '.join(others)}." if others else ""), ""]
