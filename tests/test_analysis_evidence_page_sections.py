"""Sections of docs/results.md drawn from computed numbers (analysis/evidence/page_sections.py):
agreement across corpora tells a power difference from a disagreement, and a read-out
inversion against stage 3 is said in words."""
import pytest

from hybrid_nope.analysis.evidence import page_sections
from hybrid_nope.analysis.evidence.verdict_rules import Verdict


def _v(values, finding="swa64: x", **kw):
  return Verdict(finding, "s", "n", values, **kw)


DECIDED = [0.30, 0.31, 0.29, 0.30, 0.32]        # t ≈ 50: reproduced
WEAK = [0.05, -0.02, 0.08, 0.01, 0.03]          # same side, not significant: inconclusive
OPPOSITE = [-0.30, -0.31, -0.29, -0.30, -0.32]  # significant the other way: refuted


@pytest.mark.parametrize("cells,reading", [
    ((DECIDED, DECIDED), "yes"),
    ((DECIDED, WEAK), "power only"),
    ((DECIDED, OPPOSITE), "no"),
    ((DECIDED, [-0.05, 0.02, -0.08, -0.01, -0.03]), "no"),  # undecided, but the other side
])
def test_agreement_tells_power_from_disagreement(cells, reading):
  verdicts = [_v(values) for values in cells]
  assert verdicts[0].verdict == "reproduced"
  assert page_sections.agreement(verdicts) == reading


def test_the_agreement_table_counts_each_reading():
  lines = page_sections.agreement_section({"a": [_v(DECIDED), _v(DECIDED, "swa64: y")],
                                           "b": [_v(WEAK), _v(OPPOSITE, "swa64: y")]})
  assert "Of 2 findings: 0 agree, 1 differ in power only, 1 disagree." in lines


def test_a_read_out_inversion_is_said_in_words():
  name = "swa16: the hybrid reads out more recency than nope"
  rows = [_v([-0.2, -0.21, -0.19], name), _v([0.1, 0.11, 0.09], "swa64: the hybrid reads out "
                                              "more recency than nope")]
  weak = _v([-0.1, 0.05, -0.2], "gla: the hybrid reads out more recency than nope")
  rows.append(weak)
  for v in rows:
    v.p_adjusted = v.p
  text = " ".join(page_sections.readout_inversions(rows, "nope"))
  assert "Against stage 3" in text and "swa16 (-0.2000" in text and "swa64" not in text
  assert "The same sign, not significant: gla." in text
  assert page_sections.readout_inversions(rows[1:], "nope") == []  # No significant inversion.


def test_the_causal_table_shows_unsigned_effects_unstable_layers_and_position():
  v = _v([-0.02, -0.03, -0.025], "swa64: causal")
  row = {"config": "swa64", "seeds": 3, "control": "noise_matched", "clean": 0.07,
         "ablated_minus_control": v.mean, "se": v.se, "ablated_minus_control_unsigned": 0.006,
         "ablated_minus_control_unsigned_se": 0.009, "no_stable_sign": [1],
         "position": {"other_row_minus_noise": 0.05}, "loss_ablated_minus_clean": 1.4,
         "loss_ablated_minus_clean_se": 0.1, "verdict": v,
         "layers": [{"layer": 1, "clean": -0.001, "stable_sign": False,
                     "ablated_minus_control": -0.012, "ablated_minus_control_signed": 0.012},
                    {"layer": 3, "clean": 0.141, "stable_sign": True,
                     "ablated_minus_control": 0.024, "ablated_minus_control_signed": 0.024}]}
  lines = page_sections.causal_section([row])
  line = next(l for l in lines if l.startswith("| swa64 | 3 |"))
  cells = [c.strip() for c in line.strip("|").split("|")]
  assert cells[2] == "noise_matched" and cells[5] == "+0.0060 ± 0.0090"
  assert cells[6] == "1" and cells[7] == "+0.0500" and cells[8] == "+1.4000 ± 0.1000"
  assert "| swa64 | 1 | -0.0010 | **no** | -0.0120 | +0.0120 |" in lines
  assert "| swa64 | 3 | +0.1410 | yes | +0.0240 | +0.0240 |" in lines


def test_propagation_failures_are_tallied():
  rows = [{"config": c, "seeds": 3, "measured_gap": 0.1, "error_across": e, "error_across_se":
           0.01, "holds_across": e is not None and e < 0.1, "error_within": 0.05,
           "error_within_se": 0.01, "holds_within": True}
          for c, e in (("swa64", 0.2), ("gla", None), ("nope", 0.05))]
  text = " ".join(page_sections.propagation_section(rows))
  assert ("from other configs it fails for 1 of 2 configs (swa64); from its other seeds it "
          "fails for 0 of 3 configs") in text


def test_the_extrapolation_lists_each_config_and_names_the_ones_that_fail():
  """Per config the ratio; a config at or above 1.05 fails, and the reading says whether only
  the controls built to fail do (both ways), or that none fails with a control run or not."""
  corr = {"points": 10, "groups": 5, "r": 0.1, "low": -0.2, "high": 0.4}
  def section(ratios):
    points = [{"config": c, "gap": 0.1, "eval_loss": 1.5, "ratio": r, "ratio_se": 0.01,
               "seeds": 3} for c, r in ratios.items()]
    reg = {"n": len(points), "slope": 0.1, "low": -0.1, "high": 0.3, "partial_r": 0.2,
           "configs": list(ratios), "points": points,
           "ratio_range": [min(ratios.values()), max(ratios.values())]}
    return "\n".join(page_sections.extrapolation_section({2: reg}, corr, ("rope",)))
  text = section({"rope": 1.12, "swa64": 0.92, "nope": 0.96})
  assert "1 of 3 fail, only controls built to fail: rope" in text
  assert "| rope | 3 | 0.1000 | 1.5000 | 1.1200 ± 0.0100 | **yes** | yes |" in text
  assert "| swa64 | 3 | 0.1000 | 1.5000 | 0.9200 ± 0.0100 | no | no |" in text
  assert text.index("| rope |") < text.index("| nope |") < text.index("| swa64 |")
  assert ("2 of 2 fail, not only the controls built to fail: rope, swa64"
          in section({"rope": 1.2, "swa64": 1.05}))
  assert "None fails, the controls built to fail included." in section({"rope": 1.0})
  assert "None fails; no control built to fail was run here." in section({"swa64": 1.0})


def test_an_extrapolation_with_no_failure_says_so():
  base = {"n": 5, "slope": 0.1, "low": -0.1, "high": 0.3, "partial_r": 0.2}
  corr = {"points": 10, "groups": 5, "r": 0.1, "low": -0.2, "high": 0.4}
  text = " ".join(page_sections.extrapolation_section(
      {2: dict(base, ratio_range=[0.95, 1.01]), 4: dict(base, ratio_range=[0.97, 1.4])}, corr,
      ("rope", "swa64_globalrope")))
  assert "At 2× no config fails to extrapolate (every ratio below 1.05)" in text
  assert "4×" not in text.split("At 2×")[1].split("The configs built")[0]
