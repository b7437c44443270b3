"""Findings' statistics from per-document sums (analysis/evidence/finding_statistics.py): each
recovers the gap that made the synthetic sums, carries both error levels, and the margins follow
the one rule from what the local layers do."""
import numpy as np
import pytest

from hybrid_nope.analysis.evidence import finding_statistics as pf
from hybrid_nope.run.reader import open_readonly
from tests.measured_runs import measured_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("runs"))
  out = {"swa16": {}, "nope": {}}
  for seed in range(3):
    swa16 = measured_run(root, f"swa16_{seed}", seed=seed, gaps=(0.05, 0.3),
                         local_raise=(0.1, 0.2), logit_gaps=(0.0, 0.3), loss=2.4)
    nope = measured_run(root, f"nope_{seed}", pattern="G", seed=seed, gaps=(0.02, 0.1),
                        local_raise=(0, 0), logit_gaps=(0.0, 0.1), loss=2.6)
    out["swa16"][seed] = pf.Run(open_readonly(swa16), "swa16")
    out["nope"][seed] = pf.Run(open_readonly(nope), "nope")
  return out


def test_layers_and_gaps_recover_what_made_the_sums(runs):
  r = runs["swa16"][0]
  assert r.global_layers == [1, 3] and r.local_layers == [0, 2] and r.local_type() == "swa"
  assert r.global_input_gap(r.final)[0] == pytest.approx(0.3, abs=0.01)
  assert r.global_input_gap(0)[0] == pytest.approx(0.05, abs=0.01)
  assert r.change("gap", r.final, "mixer", pf.INPUT, r.local_layers)[0] == pytest.approx(
      0.2, abs=0.01)
  assert r.logit_gap(r.final)[0] == pytest.approx(0.3, abs=0.01)


def test_a_statistic_has_one_replicate_per_left_out_document(runs):
  r = runs["swa16"][0]
  reps = r.global_input_gap(r.final)
  assert reps.shape == (r.at(r.final).num_documents + 1,)
  assert np.all(np.isfinite(reps)) and np.std(reps[1:]) > 0


def test_a_paired_verdict_has_seed_and_document_levels(runs):
  v = pf.verdict("planted", "gap", "none", pf.by_seed(runs["swa16"], runs["nope"]),
                 lambda a, b: a.global_input_gap(a.final)
                 - b.global_input_gap(b.final, a.global_layers))
  assert v.n == 3 and v.levels == "seed × document"
  assert v.mean == pytest.approx(0.2, abs=0.01)
  assert v.estimate.se_doc > 0 and v.estimate.se_seed > 0
  assert v.se >= max(v.estimate.se_doc, v.estimate.se_seed)


def test_losses_carry_the_seed_level_only(runs):
  v = pf.verdict("loss", "eval loss", "none", pf.by_seed(runs["swa16"], runs["nope"]),
                 lambda a, b: a.summary["eval_loss"] - b.summary["eval_loss"])
  assert v.levels == "seed" and v.mean == pytest.approx(-0.2)


def test_margins_follow_the_one_rule(runs):
  ref = pf.References(runs, ["swa16"], "nope")
  m, rule = ref.cosine_margin("swa16")
  assert m == pytest.approx(0.2, abs=0.01) and "swa16" in rule
  assert ref.logit_margin("swa16")[0] == pytest.approx(0.2, abs=0.01)
  assert ref.loss_margin("swa16")[0] == pytest.approx(0.2)
  # nope has no local layer: the local configs' mean, said so.
  assert ref.cosine_margin("nope")[0] == pytest.approx(m) and "mean" in ref.cosine_margin(
      "nope")[1]


def test_runs_on_different_probes_do_not_pair(tmp_path):
  a = open_readonly(measured_run(str(tmp_path), "a"))
  b = open_readonly(measured_run(str(tmp_path), "b"))
  pf.paired_paths([a, b])
  with open(b.layout.recency_probe, "w") as f:
    f.write('{"rows": [9]}')
  with pytest.raises(ValueError, match="different probes"):
    pf.paired_paths([a, b])
