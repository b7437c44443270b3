"""The causal verdict across seeds (analysis/evidence/causal.py): its replicates against a direct
recomputation from the per-document sums, its verdicts on planted effects, and its interval's
coverage by simulation under the committed probe's document sizes with seed and document effects
crossed, where the seed-only error (the mutant) undercovers."""
import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis.checkpoint.ablation import (ABLATED, CLEAN, CONDITIONS, CONTROL,
                                                      NOISE_MATCHED, OTHER_ROW_MATCHED)
from hybrid_nope.analysis.evidence import causal, page_sections
from tests.helpers import committed_probe_counts
from tests.measured_runs import ablation_result, with_control_gaps

HEADS = 4


@pytest.fixture(scope="module")
def real_counts(tmp_path_factory):
  return committed_probe_counts(str(tmp_path_factory.mktemp("pack")))


def test_replicates_are_the_logit_gap_with_each_document_left_out():
  rng = np.random.default_rng(0)
  counts = rng.integers(1, 20, size=(2, 9)).astype(float)
  means = {c: rng.normal(size=(9, HEADS)) for c in CONDITIONS}
  result = ablation_result(counts, means)
  got = causal.logit_gap_replicates(result, ABLATED)
  n = counts[0]
  assert got[0] == pytest.approx(result["summary"][CLEAN]["logit_gap"]
                                 + result["summary"]["ablated_minus_clean"]["logit_gap"])
  for d in range(9):
    keep = np.arange(9) != d
    want = np.mean((means[ABLATED][keep] * n[keep, None]).sum(0) / n[keep].sum())
    assert got[1 + d] == pytest.approx(want)
  diff = causal.difference_replicates(result)  # Signed by the clean gap (every layer alike).
  sign = np.sign(result["summary"][CLEAN]["logit_gap"])
  assert diff[0] == pytest.approx(
      sign * result["summary"][f"ablated_minus_{CONTROL}"]["logit_gap"])


def _seeds(counts, rng, effect, seeds=5, sd_seed=0.004, sd_doc=0.02, sd_cell=0.01):
  """Per seed a result whose ablated − control logit gap per document is effect + seed effect
  + document effect (shared by every seed) + cell noise; clean read-out 0.1."""
  c = counts.shape[1]
  doc = rng.normal(0, sd_doc, size=c)
  out = []
  for _ in range(seeds):
    d_C = effect + rng.normal(0, sd_seed) + doc + rng.normal(0, sd_cell, size=c)
    base = np.full((c, HEADS), 0.1)
    out.append(ablation_result(counts, {CLEAN: base, CONTROL: base,
                                    ABLATED: base + d_C[:, None]}))
  return out


def test_a_removed_read_out_is_reproduced_and_an_absent_one_is_not(real_counts):
  rng = np.random.default_rng(1)
  v = causal.verdict("swa16", _seeds(real_counts, rng, effect=-0.05))
  assert v.mean < 0 and v.margin == pytest.approx(0.01)
  causal.verdict_rules.adjust([v])
  assert v.verdict == "reproduced"
  v = causal.verdict("swa16", _seeds(real_counts, rng, effect=+0.05))
  causal.verdict_rules.adjust([v])
  assert v.verdict == "refuted"
  v = causal.verdict("swa16", _seeds(real_counts, rng, effect=0.0, sd_doc=0.0005,
                                     sd_seed=0.0005, sd_cell=0.0005))
  causal.verdict_rules.adjust([v])
  assert v.verdict == "refuted"  # Inside the margin with power: the claimed effect is absent.


def test_seeds_on_different_probes_are_refused(real_counts):
  a, b = _seeds(real_counts, np.random.default_rng(2), effect=-0.05, seeds=2)
  b["probe"]["rows"] = [5, 6]
  with pytest.raises(ValueError, match="different probes"):
    causal.verdict("swa16", [a, b])


def test_one_seed_has_no_error_and_a_run_without_sums_is_left_out(real_counts):
  (a,) = _seeds(real_counts, np.random.default_rng(3), effect=-0.05, seeds=1)
  v = causal.verdict("swa16", [a, None, {"logit_sums": {"layers": []}}])
  assert v.n == 1 and v.se is None and v.verdict == "inconclusive"


@pytest.mark.parametrize("levels", [dict(sd_seed=0.003, sd_doc=0.03, sd_cell=0.01),
                                    dict(sd_seed=0.015, sd_doc=0.03, sd_cell=0.01)],
                         ids=["documents dominate", "both levels"])
def test_interval_covers_under_crossed_seed_and_document_effects(real_counts, levels):
  """95% intervals over 300 simulated sweeps of 5 seeds on the probe's 63 documents cover the
  effect (MC SE of a 95% coverage: 0.013; bounds as two_level's own test); with the document
  level dropped (the seed SE alone, the mutant) they undercover where documents dominate."""
  rng = np.random.default_rng(4)
  hits, mutant_hits, reps, effect = 0, 0, 300, -0.03
  for _ in range(reps):
    v = causal.verdict("x", _seeds(real_counts, rng, effect, **levels))
    lo, hi = v.interval
    hits += lo <= effect <= hi
    values = np.asarray(v.values)
    se_seed = values.std(ddof=1) / np.sqrt(len(values))
    t = scipy.stats.t.ppf(0.975, len(values) - 1)
    mutant_hits += abs(values.mean() - effect) <= t * se_seed
  assert 0.92 <= hits / reps <= 0.995
  if levels["sd_doc"] > 5 * levels["sd_seed"]:
    assert mutant_hits / reps < 0.8


def test_a_read_out_that_favours_far_keys_is_signed_by_its_clean_gap(real_counts):
  """A layer whose clean logit gap is negative and which the ablation moves toward 0 has had
  its read-out removed too: the signed statistic is negative, and the verdict reproduced."""
  rng = np.random.default_rng(5)
  flipped = []
  for r in _seeds(real_counts, rng, effect=-0.05):
    for c in CONDITIONS:
      for layer in r["logit_sums"]["layers"]:
        sums = r["logit_sums"][c][str(layer)]
        sums["near"] = (-np.asarray(sums["near"])).tolist()  # every logit gap negated
    flipped.append(r)
  assert causal.logit_gap_replicates(flipped[0], CLEAN)[0] < 0
  v = causal.verdict("swa16", flipped)
  assert v.mean == pytest.approx(-0.05, abs=0.01)
  causal.verdict_rules.adjust([v])
  assert v.verdict == "reproduced"


def _with_controls(result, **means_CN):
  """`result` with more conditions' logit sums (per-document, per-head means at lag 1)."""
  n_near = np.asarray(result["logit_sums"]["counts"]["near"])
  for c, m_CN in means_CN.items():
    result["logit_sums"][c] = {str(i): {"near": (np.asarray(m_CN) * n_near[:, None]).tolist(),
                                        "far": np.zeros_like(m_CN).tolist()}
                               for i in result["logit_sums"]["layers"]}
  return result


def test_an_older_file_is_compared_against_its_rotated_control(real_counts):
  """Files written before the matched control carry the rotated one as "control": a config
  whose seeds all have the matched control uses it; one seed without it sends every seed to the
  rotated control (named in the row), never a mix."""
  rng = np.random.default_rng(6)
  seeds = _seeds(real_counts, rng, effect=-0.05, seeds=3)
  c = real_counts.shape[1]
  for r in seeds:  # The rotated control sits halfway: ablated − rotated = −0.025.
    base = np.asarray(r["logit_sums"][CLEAN]["1"]["near"]) / real_counts[0][:, None]
    abl = np.asarray(r["logit_sums"][ABLATED]["1"]["near"]) / real_counts[0][:, None]
    _with_controls(r, rotated=(base + abl) / 2)
  assert causal.control_for(seeds) == CONTROL
  assert causal.verdict("swa16", seeds).mean == pytest.approx(-0.05, abs=0.01)
  old = seeds[0]
  old["logit_sums"]["control"] = old["logit_sums"].pop("rotated")
  del old["logit_sums"][CONTROL]
  assert causal.control_for(seeds) == "rotated" and causal.has(old, "rotated")
  v = causal.verdict("swa16", seeds)
  assert v.mean == pytest.approx(-0.025, abs=0.01) and "rotated control" in v.statistic
  row = causal.row("swa16", seeds, v)
  assert row["control"] == "rotated" and row["position"]["ablated_minus_noise"] is None
  assert c > 0


def test_seed_table_flags_a_layer_whose_clean_sign_flips_and_reports_both_signings(real_counts):
  """Two layers: layer 1's clean logit gap is +0.1 at every seed, layer 3's flips sign across
  seeds. The ablation moves each layer's gap by −0.05 (unsigned) against the matched control:
  the unsigned per-seed value is −0.05; the signed one is −0.05 where the clean gap is positive
  and +0.05 where it is negative; stable_sign is [True, False] and the row lists layer 3."""
  rng = np.random.default_rng(7)
  c = real_counts.shape[1]
  results = []
  for s, layer3 in enumerate((0.1, -0.1, 0.1)):
    r = _seeds(real_counts, rng, effect=0.0, seeds=1, sd_seed=0, sd_doc=0, sd_cell=0)[0]
    n = real_counts[0][:, None]
    for cond, shift in ((CLEAN, 0.0), (CONTROL, 0.0), (ABLATED, -0.05)):
      for layer, clean in (("1", 0.1), ("3", layer3)):
        r["logit_sums"][cond][layer]["near"] = (np.full((c, HEADS), clean + shift) * n).tolist()
    _with_controls(r, noise=np.full((c, HEADS), 0.02), other_row=np.full((c, HEADS), 0.07),
                   rotated=np.full((c, HEADS), 0.1))
    results.append(r)
  table = causal.seed_table(results)
  assert table["control"] == CONTROL and table["layers"] == [1, 3]
  np.testing.assert_allclose(table["clean_logit_gap"], [[0.1] * 3, [0.1, -0.1, 0.1]])
  assert table["stable_sign"] == [True, False]
  np.testing.assert_allclose(table["ablated_minus_control"], [-0.05] * 3)
  np.testing.assert_allclose(table["ablated_minus_control_signed"], [-0.05, 0.0, -0.05],
                             atol=1e-12)
  np.testing.assert_allclose(table["layer_ablated_minus_control_signed"],
                             [[-0.05, -0.05, -0.05], [-0.05, 0.05, -0.05]])  # [layer][seed]
  v = causal.verdict("x", results)
  np.testing.assert_allclose(v.values, table["ablated_minus_control_signed"])
  row = causal.row("x", results, v)
  assert row["no_stable_sign"] == [3]
  assert row["ablated_minus_control_unsigned"] == pytest.approx(-0.05)
  assert [l["stable_sign"] for l in row["layers"]] == [True, False]
  # Position: ablated (clean − 0.05 = 0.05 at layer 1, 0.05/−0.15 at 3) against the controls.
  pos = row["position"]
  assert pos["other_row_minus_noise"] == pytest.approx(0.05)
  assert pos["ablated_minus_noise"] - pos["ablated_minus_other_row"] == pytest.approx(
      pos["other_row_minus_noise"])
  assert pos["other_row_matched_minus_noise_matched"] is None  # Not in these files.


@pytest.mark.parametrize("dilution", [0.0, 0.03])
@pytest.mark.parametrize("control", [CONTROL, NOISE_MATCHED])
def test_control_effects_are_seed_means_and_flag_a_control_that_moves_the_gap(real_counts,
                                                                              control, dilution):
  """Three seeds: each condition's branch gap, input gap change and loss are the seed mean ±
  seed SE of the files' own numbers. The control is neutral when its own effect on the global
  input's gap is within a tenth of the ablation's change (0.015 here): from clean for the
  control that keeps the branch (added_noise_matched), from ablated for noise in the branch's
  place (noise_matched, older files, used only where the newer control is absent). The page
  and the verdict say so only where it is not (the check can fail both ways)."""
  rng = np.random.default_rng(0)
  C = len(real_counts[0])
  base = np.full((C, 2), 0.2)
  results, expected = [], []
  for seed in range(3):
    clean = 0.2 + 0.01 * seed
    ablated = clean - 0.15 + 0.002 * rng.standard_normal()
    left = clean if control == CONTROL else ablated  # What the control must leave.
    gaps = {CLEAN: clean, ABLATED: ablated, control: left - dilution + 0.001 * seed,
            OTHER_ROW_MATCHED: clean - 0.02}
    r = ablation_result(real_counts, {CLEAN: base, control: base, ABLATED: base - 0.1 + 0.01
                                      * rng.standard_normal(base.shape)})
    results.append(with_control_gaps(
        r, input_gap=gaps, branch_gap={CLEAN: 0.38, ABLATED: 0.0, control: 0.001 * seed,
                                       OTHER_ROW_MATCHED: 0.39},
        loss={CLEAN: 1.4, ABLATED: 3.5 + 0.1 * seed, control: 3.5 + 0.1 * seed,
              OTHER_ROW_MATCHED: 3.51}, lam={control: 2.0 + seed, OTHER_ROW_MATCHED: 1.0},
        control=control))
    expected.append(gaps)
  assert causal.control_for(results) == control
  e = causal.control_effects(results)
  assert e["seeds"] == 3 and e["control"] == control
  assert e["neutral_against"] == (CLEAN if control == CONTROL else ABLATED)
  change = [g[ABLATED] - g[CLEAN] for g in expected]
  mean, se = e["conditions"][ABLATED]["input_gap_change"]
  assert mean == pytest.approx(np.mean(change))
  assert se == pytest.approx(np.std(change, ddof=1) / np.sqrt(3))
  assert e["conditions"][control]["branch_gap"][0] == pytest.approx(0.001)
  assert e["conditions"][control]["lam"][0] == pytest.approx(3.0)
  assert e["own_gap_effect"][0] == pytest.approx(-dilution + 0.001)
  assert e["neutral_bound"] == pytest.approx(0.1 * abs(np.mean(change)))
  assert e["neutral"] is (dilution == 0.0)
  row = causal.row("swa64", results, causal.verdict("swa64", results))
  lines = "\n".join(page_sections.control_effects_table([row]))
  assert (f"not neutral for swa64 ({control}, λ 3)" in lines) is (dilution > 0), lines
  assert f"| swa64 | 3 | {control} − {e['neutral_against']}: " in lines
  # The read-out difference is large and significant either way; a control that is not neutral
  # makes the verdict invalid whatever its outcome, with the numbers that failed it.
  v = causal.verdict("swa64", results)
  causal.verdict_rules.adjust([v])
  assert v.p < 1e-3
  assert v.verdict == ("invalid" if dilution else "reproduced"), v.note
  assert (f"not neutral: {control} − {e['neutral_against']} moves" in v.note) is (dilution > 0)
  assert (f"beyond ±{e['neutral_bound']:.4f}" in v.note) is (dilution > 0), v.note


def test_files_without_the_matched_control_have_no_control_effects(real_counts):
  base = np.full((len(real_counts[0]), 2), 0.2)
  old = ablation_result(real_counts, {CLEAN: base, CONTROL: base, ABLATED: base})
  del old["logit_sums"][CONTROL]
  assert causal.control_effects([old]) == {"seeds": 0, "conditions": {}}
  assert page_sections.control_effects_table([{"control_effects": {"seeds": 0}}]) == []
