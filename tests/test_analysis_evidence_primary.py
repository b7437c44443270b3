"""The primary family (analysis/evidence/primary.py): the committed registry reads and is
checked, a bad entry fails naming it, the family is Holm-adjusted alone while exploratory rows
get Benjamini–Hochberg q-values, and the registration check sees a file changed after its runs.
"""
import dataclasses
import os
import subprocess

import numpy as np
import pytest

from hybrid_nope.analysis.evidence import multiplicity, primary, primary_statistics, verdict_rules
from hybrid_nope.analysis.evidence.verdict_rules import Verdict
from hybrid_nope.analysis.evidence.finding_statistics import Run
from hybrid_nope.run.reader import open_readonly
from tests.measured_runs import measured_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(REPO, primary.DEFAULT_PATH)


def test_the_committed_registry_reads():
  reg = primary.load(COMMITTED)
  assert 1 <= len(reg.claims) <= primary.MAX_CLAIMS
  assert len(reg.seeds) >= primary.MIN_SEEDS and reg.init_draws >= primary.MIN_INIT_DRAWS
  assert set(reg.corpora) == {"stdlib", "prose"}
  assert {c.statistic for c in reg.claims} <= set(primary_statistics.STATISTICS)


def _registry_text(**changes) -> str:
  with open(COMMITTED) as f:
    text = f.read()
  for old, new in changes.items():
    assert old in text
    text = text.replace(old, new, 1)
  return text


@pytest.mark.parametrize("old,new,message", [
    ('statistic = "global_input_gap_final_minus_init"', 'statistic = "made_up"',
     "strengthens_with_training.*'made_up' is not one of"),
    ("margin = 0.005", "margin = 0", "plant_at_init.*margin must be a positive number"),
    ("direction = 1", "direction = 2", "plant_at_init.*direction must be 1 or -1"),
    ("seeds = [0, 1, 2, 3, 4, 5, 6, 7]", "seeds = [0, 1, 2]", "at least 8 distinct seeds"),
    ("init_draws = 30", "init_draws = 10", "init_draws 10 < 30"),
    ('id = "strengthens_with_training"', 'id = "plant_at_init"', "claim ids repeat"),
    ('unit = "cosine"', 'units = "cosine"', "missing unit; unknown key.s. units"),
    ('configs = ["swa64", "nope"]', 'configs = ["swa64"]', "takes 2 config.s., configs lists 1"),
])
def test_a_bad_entry_fails_naming_it(tmp_path, old, new, message):
  path = tmp_path / "primary.toml"
  path.write_text(_registry_text(**{old: new}))
  with pytest.raises(primary.RegistryError, match=message):
    primary.load(str(path))


def test_a_family_larger_than_twelve_is_refused(tmp_path):
  text = _registry_text()
  claim = text[text.index("[[claims]]"):text.index("[[claims]]", text.index("[[claims]]") + 1)]
  extra = "".join(claim.replace('id = "plant_at_init"', f'id = "extra{i}"') for i in range(3))
  path = tmp_path / "primary.toml"
  path.write_text(text + "\n" + extra)
  with pytest.raises(primary.RegistryError, match="13 claims; a primary family holds at most 12"):
    primary.load(str(path))


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
  """Synthetic packs of the four registered configs: swa64's gap grows 0.05 -> 0.3 and its
  read-out 0 -> 0.2; swa512's final gap 0.2; the losses are set per config."""
  root = str(tmp_path_factory.mktemp("runs"))
  spec = {"swa64": dict(gaps=(0.05, 0.3), logit_gaps=(0.0, 0.2), loss=2.0),
          "swa512": dict(gaps=(0.05, 0.2), logit_gaps=(0.0, 0.1), loss=2.1),
          "nopeswa512": dict(gaps=(0.05, 0.2), logit_gaps=(0.0, 0.1), loss=2.4),
          "nope": dict(pattern="G", gaps=(0.02, 0.1), local_raise=(0, 0),
                       logit_gaps=(0.0, 0.05), loss=2.6)}
  runs = {e: {s: Run(open_readonly(measured_run(root, f"{e}_{s}", seed=s, **kw)), f"{e}_{s}")
              for s in range(4)} for e, kw in spec.items()}
  for s in range(4):  # nope's final loss is swa64's eval loss at step 4.
    _eval_losses(runs["swa64"][s], {4: 2.6 + 0.001 * s, 8: 2.0})
  # Four seeds stand for the registered eight here: the decision logic is the same.
  reg = dataclasses.replace(primary.load(COMMITTED), seeds=tuple(range(4)))
  verdicts = primary.decide(reg, primary_statistics.Evidence(runs))
  return reg, {c.id: v for c, v in zip(reg.claims, verdicts)}, runs


def _eval_losses(run: Run, losses: dict[int, float]) -> None:
  run.eval_losses = dict(losses)
  # Recency records at step 4 for the matched-loss read-out: the final step's, read-out 0.15.
  run.by_step[4] = [dict(r, step=4, **({"logit_gap": [0.15] * len(r["logit_gap"])}
                                        if "logit_gap" in r else {}))
                    for r in run.by_step[run.final]]


def test_each_claim_reads_its_registered_direction_null_and_margin(decided):
  reg, by_id, _ = decided
  for claim in reg.claims:
    v = by_id[claim.id]
    assert v.finding == claim.claim and v.sign == claim.direction and v.margin == claim.margin
    assert v.null == claim.null


def test_the_statistics_recover_the_effects_that_made_the_runs(decided):
  _, by_id, _ = decided
  grow = by_id["strengthens_with_training"]
  assert grow.mean == pytest.approx(0.25, abs=0.01) and grow.verdict == "reproduced"
  assert grow.levels == "seed × document"
  assert by_id["smaller_window_lower_loss"].mean == pytest.approx(-0.1)
  assert by_id["smaller_window_lower_loss"].verdict == "inconclusive"  # identical seeds: no SE
  assert by_id["nope_in_swa_at_far_lag_worse"].mean == pytest.approx(0.3)
  # Matched loss: swa64 at step 4 (loss nearest nope's 2.6) reads 0.15; nope's final 0.05.
  assert by_id["hybrid_reads_more_than_nope"].mean == pytest.approx(0.15 - 0.05, abs=0.01)


def test_a_claim_without_its_inputs_is_not_computed(decided):
  _, by_id, _ = decided
  for claim_id in ("plant_at_init", "logit_recency_appears", "causal_readout",
                   "readout_of_position", "smaller_window_steeper"):
    v = by_id[claim_id]
    assert v.n == 0 and v.verdict == "inconclusive" and "not computed" in v.statistic


def test_holm_runs_inside_the_family_alone_at_its_registered_size(decided):
  """m is the family's registered size: the claims not computed yet count as p = 1, and are
  pending (no adjusted p, no verdict)."""
  reg, by_id, _ = decided
  rows = [by_id[c.id] for c in reg.claims]
  waiting = primary.pending(reg, rows)
  assert sum(waiting) == 5 and len(rows) == 10
  expected = multiplicity.holm([1.0 if w else v.p for v, w in zip(rows, waiting)])
  for v, w, e in zip(rows, waiting, expected):
    assert v.p_adjusted == (None if w else e)


def test_a_claim_short_of_its_registered_seeds_is_pending(decided):
  reg, _, runs = decided
  full = primary.decide(reg, primary_statistics.Evidence(runs))
  fewer = {e: {s: r for s, r in rs.items() if s < 3} for e, rs in runs.items()}
  short = primary.decide(reg, primary_statistics.Evidence(fewer))
  grow = [c.id for c in reg.claims].index("strengthens_with_training")
  assert not primary.pending(reg, full)[grow] and full[grow].p_adjusted is not None
  assert primary.pending(reg, short)[grow] and short[grow].p_adjusted is None
  assert short[grow].n == 3


def test_init_claim_pairs_draws(decided):
  reg, _, runs = decided
  draws = 30
  rng = np.random.default_rng(0)
  shared = rng.normal(0, 0.01, draws)
  def null(shift):
    layers = {f"{g}/pre_mixer_norm": {"gap": {"values": (shared + shift + rng.normal(
        0, 0.001, draws)).tolist()}} for g in (1, 3)}
    return {"seeds": list(range(draws)), "records": layers, "summary": {}}
  ev = primary_statistics.Evidence(runs, init_nulls={"swa64": null(0.03), "nope": null(0.0)})
  v = primary_statistics.STATISTICS["init_global_input_gap_minus_nope"](ev, ("swa64", "nope"))
  assert v.n == draws and v.mean == pytest.approx(0.03, abs=0.002)
  assert v.se < 0.001  # paired by draw: the shared draw effect cancels
  ev.init_nulls["nope"]["seeds"] = list(range(1, draws + 1))
  unpaired = primary_statistics.STATISTICS["init_global_input_gap_minus_nope"](
      ev, ("swa64", "nope"))
  assert unpaired.n == 0 and "different seeds" in unpaired.statistic


def test_exploratory_rows_get_benjamini_hochberg_q_values():
  ps = [0.001, 0.01, 0.02, 0.03, 0.5]
  rows = [Verdict("", "", "", [], p_exact=p) for p in ps]
  # A direct step-up computation: q_(i) = min_{j >= i} m p_(j) / j.
  m, order = len(ps), np.argsort(ps)
  q = np.minimum.accumulate((np.asarray(ps)[order] * m / np.arange(1, m + 1))[::-1])[::-1]
  expected = np.empty(m)
  expected[order] = np.minimum(q, 1)
  primary.adjust_exploratory(rows)
  assert [v.p_adjusted for v in rows] == pytest.approx(expected.tolist())
  assert rows[2].p_adjusted < multiplicity.holm(ps)[2]  # q, not Holm


def _git(cwd, *args, when=None):
  env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
             GIT_COMMITTER_EMAIL="t@t")
  if when is not None:
    env.update(GIT_AUTHOR_DATE=f"@{when} +0000", GIT_COMMITTER_DATE=f"@{when} +0000")
  subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _registered_then_run(tmp_path, text: str):
  """A repo whose registry (`text`) is committed, then one run's pack after it."""
  repo = str(tmp_path)
  _git(repo, "init", "-q")
  registry, pack = tmp_path / "primary.toml", tmp_path / "runs" / "swa64" / "seed0.tar.gz"
  registry.write_text(text)
  _git(repo, "add", "primary.toml")
  _git(repo, "commit", "-q", "-m", "register", when=1_000_000)
  pack.parent.mkdir(parents=True)
  pack.write_bytes(b"pack")
  _git(repo, "add", str(pack))
  _git(repo, "commit", "-q", "-m", "run", when=1_000_100)
  return repo, registry, pack


def test_registration_sees_a_file_changed_after_its_runs(tmp_path):
  repo, registry, pack = _registered_then_run(tmp_path, "claims\n")
  late = tmp_path / "runs" / "swa64" / "seed1.tar.gz"
  late.write_bytes(b"not committed")
  reg = primary.registration(str(registry), [str(pack), str(late)])
  assert reg["changed_after"] == [] and reg["uncommitted"] == [str(late)]
  assert "after the file's last change" in primary.registration_line(reg)
  registry.write_text("claims, edited\n")
  _git(repo, "commit", "-q", "-am", "edit", when=1_000_200)
  reg = primary.registration(str(registry), [str(pack)])
  assert reg["changed_after"] == [str(pack)]
  assert "changed after 1 of these runs" in primary.registration_line(reg)


def test_registration_names_the_claims_amended_after_the_runs(tmp_path):
  """A file edited after its runs: the claims that differ from the version the earliest run was
  registered under are named (a comment-only edit names none), and the page's line says which."""
  claims = lambda null_b: (f'[[claims]]\nid = "a"\nnull = "x"\n\n'
                           f'[[claims]]\nid = "b"\nnull = "{null_b}"\n')
  repo, registry, pack = _registered_then_run(tmp_path, claims("y"))
  registry.write_text("# a comment\n" + claims("y"))
  _git(repo, "commit", "-q", "-am", "comment", when=1_000_200)
  reg = primary.registration(str(registry), [str(pack)])
  assert reg["changed_after"] == [str(pack)] and reg["amended"] == []
  assert "no claim differs from the version" in primary.registration_line(reg)
  registry.write_text("# a comment\n" + claims("z") + '\n[[claims]]\nid = "c"\n')
  _git(repo, "commit", "-q", "-am", "amend b, add c", when=1_000_300)
  reg = primary.registration(str(registry), [str(pack)])
  first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=repo,
                         capture_output=True, text=True).stdout.strip()
  assert reg["amended"] == ["b", "c"] and reg["registered_at"] == first[:7]
  line = primary.registration_line(reg)
  assert f"registered under (commit {first[:7]}), the claim(s) b, c were amended" in line


def test_the_page_marks_an_amended_claim_and_only_it(decided):
  from hybrid_nope.analysis.evidence import primary_page
  reg, verdicts, _ = decided
  claim = next(c for c in reg.claims if c.id == "smaller_window_steeper")
  kind, why = primary_page.verdict_text(reg, claim, verdicts[claim.id], False, True)
  assert kind == verdicts[claim.id].verdict and why.endswith(
      "(claim amended after its first runs: see the registration line)")
  assert "amended" not in primary_page.verdict_text(reg, claim, verdicts[claim.id], False)[1]
  assert "amended" in primary_page.verdict_text(reg, claim, verdicts[claim.id], True, True)[1]


def test_causal_claim_reads_the_matched_control_unsigned(decided):
  """Per seed ablated − added_noise_matched on the head/layer-mean logit gap, without the clean
  gap's sign: a layer whose clean read-out is negative still counts a fall as a fall."""
  from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN, CONTROL
  from tests.measured_runs import ablation_result
  _, _, runs = decided
  rng = np.random.default_rng(2)
  counts = rng.integers(20, 80, size=(2, 24)).astype(float)
  files = {}
  for seed in range(4):
    clean = np.full((24, 2), -0.1)  # A negative clean read-out: signing would flip the effect.
    files[seed] = ablation_result(counts, {CLEAN: clean, CONTROL: clean + 0.01,
                                           ABLATED: clean - 0.05 + rng.normal(0, 0.003, (24, 2))})
  ev = primary_statistics.Evidence(runs, ablations={"swa64": files})
  v = primary_statistics.STATISTICS["causal_ablated_minus_added_noise_control"](ev, ("swa64",))
  assert v.n == 4 and v.mean == pytest.approx(-0.06, abs=0.005)
  assert v.levels == "seed × document"


@pytest.mark.parametrize("dilution", [0.0, 0.03])
def test_causal_claim_is_invalid_where_its_control_moves_the_gap(decided, dilution):
  """The registered causal claim reads "invalid" exactly where the matched control moves the
  global input's gap beyond a tenth of the ablation's change (causal.control_not_neutral), its p
  kept in the family; a neutral control leaves the same read-out reproduced."""
  from hybrid_nope.analysis.checkpoint.ablation import (ABLATED, CLEAN, CONTROL,
                                                        OTHER_ROW_MATCHED)
  from tests.measured_runs import ablation_result, with_control_gaps
  _, _, runs = decided
  rng = np.random.default_rng(3)
  counts = rng.integers(20, 80, size=(2, 24)).astype(float)
  files = {}
  for seed in range(4):
    clean = np.full((24, 2), 0.1)
    gaps = {CLEAN: 0.2, ABLATED: 0.05, CONTROL: 0.2 - dilution, OTHER_ROW_MATCHED: 0.19}
    files[seed] = with_control_gaps(
        ablation_result(counts, {CLEAN: clean, CONTROL: clean,
                                 ABLATED: clean - 0.05 + rng.normal(0, 0.003, (24, 2))}),
        input_gap=gaps, branch_gap={c: 0.0 for c in gaps}, loss={c: 3.0 for c in gaps},
        lam={CONTROL: 2.0, OTHER_ROW_MATCHED: 1.0})
  ev = primary_statistics.Evidence(runs, ablations={"swa64": files})
  v = primary_statistics.STATISTICS["causal_ablated_minus_added_noise_control"](ev, ("swa64",))
  v.sign, v.margin = -1, 0.01
  verdict_rules.adjust([v])
  assert v.p < 1e-3 and v.p_adjusted is not None
  assert v.verdict == ("invalid" if dilution else "reproduced")
  assert ("not neutral" in v.note) is (dilution > 0)


def test_the_page_shows_the_causal_detail_of_the_primary_runs(decided):
  """Beside the registered (unsigned) causal statistic the page gives, per config with causal
  files, the signed one and the per-layer table (analysis/evidence/primary_page.py)."""
  from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN, CONTROL
  from hybrid_nope.analysis.evidence import primary_page
  from tests.measured_runs import ablation_result
  reg, verdicts, runs = decided
  counts = np.random.default_rng(2).integers(20, 80, size=(2, 24)).astype(float)
  clean = np.full((24, 2), 0.1)
  files = {s: ablation_result(counts, {CLEAN: clean, CONTROL: clean, ABLATED: clean - 0.05})
           for s in range(4)}
  rows = primary_page.causal_rows(primary_statistics.Evidence(runs, ablations={"swa64": files}))
  assert [r["config"] for r in rows] == ["swa64"] and rows[0]["seeds"] == 4
  assert rows[0]["ablated_minus_control"] == pytest.approx(-0.05)
  corpus = next(iter(reg.corpora.values()))
  decided_corpus = primary_page.PrimaryCorpus(
      corpus, [verdicts[c.id] for c in reg.claims], {e: 4 for e in runs},
      primary.registration(reg.path, []),
      None, [False] * len(reg.claims), rows)
  page = "\n".join(primary_page.render(reg, [decided_corpus]))
  assert "#### The causal test in detail (swa64)" in page
  assert "| swa64 | 1 | +0.1000 | yes | -0.0500 | -0.0500 |" in page
