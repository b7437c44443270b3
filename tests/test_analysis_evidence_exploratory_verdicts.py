"""The exploratory verdict table (analysis/evidence/exploratory_verdicts.py) on synthetic runs
whose effects are known: the split init findings, both residual readings, the Welch read-out
against the init null, and one family over the page."""
import os

import numpy as np
import pytest

from hybrid_nope.analysis.evidence import (exploratory_experiments, exploratory_verdicts,
                                           finding_statistics, two_level)
from hybrid_nope.analysis.evidence.finding_statistics import Run
from hybrid_nope.run.reader import open_readonly
from tests.helpers import REPO
from tests.measured_runs import measured_run


@pytest.fixture(scope="module")
def table(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("runs"))
  runs = {"swa16": {}, "nope": {}}
  for seed in range(4):
    swa16 = measured_run(root, f"swa16_{seed}", seed=seed, gaps=(0.08, 0.3),
                         local_raise=(0.1, 0.2), logit_gaps=(0.0, 0.3))
    nope = measured_run(root, f"nope_{seed}", pattern="G", seed=seed, gaps=(0.02, 0.1),
                        local_raise=(0, 0), logit_gaps=(0.0, 0.1), loss=2.6)
    runs["swa16"][seed] = Run(open_readonly(swa16), "s")
    runs["nope"][seed] = Run(open_readonly(nope), "n")
  nulls = {"swa16": {"logit_gap": {"mean": 0.01, "sd": 0.02, "draws": 10}}}
  found, mixers = exploratory_verdicts.all_verdicts(runs, nulls, exploratory_experiments.load(
      os.path.join(REPO, exploratory_experiments.DEFAULT_PATH)))
  return {v.finding: v for v in found}, mixers


def test_the_local_layers_plant_recency_at_init_paired_with_nope(table):
  found, _ = table
  v = found["swa16: the local layers plant recency at init (paired with nope)"]
  assert v.mean == pytest.approx(0.08 - 0.02, abs=0.005) and v.verdict == "reproduced"
  own = found["swa16: the local layers plant recency at init (the local block's own step)"]
  assert own.mean == pytest.approx(0.1, abs=0.005)


def test_both_readings_of_the_residual_add_are_reported(table):
  found, _ = table
  stream = found["swa16: the mixer's residual add lowers the gap (against the stream it adds to)"]
  branch = found["swa16: the mixer's residual add lowers the gap (against the branch it adds)"]
  # The synthetic residual_1 carries the branch's raise: +0.1 per local layer over the stream
  # (mean over all 4 layers: +0.1), 0 against the branch.
  assert stream.mean == pytest.approx(0.1, abs=0.005)
  assert branch.mean == pytest.approx(0.0, abs=0.005)


def test_the_read_out_carries_the_init_null_spread(table):
  found, _ = table
  v = found["swa16: logit recency appears with training"]
  assert v.mean == pytest.approx(0.3 - 0.01, abs=0.01)
  assert v.se >= 0.02 / np.sqrt(10)  # the null's own error of its mean is in it
  assert "Welch" in v.null


def test_one_holm_family_adjusts_every_row(table):
  found, mixers = table
  rows = [v for v in list(found.values()) + mixers if v.p is not None]
  assert all(v.p_adjusted >= v.p - 1e-15 for v in rows)
  assert max(v.p_adjusted / v.p for v in rows if v.p > 0) > 1  # a family, not row by row


def test_with_null_is_welch_satterthwaite():
  est = two_level.Estimate(mean=1.0, se=0.1, se_seed=0.1, se_doc=0.0, df=4, seeds=5,
                           documents=30)
  out = finding_statistics.with_null(est, [1.0] * 5, {"mean": 0.5, "sd": 0.3, "draws": 9})
  a, b = 0.01, 0.09 / 9
  assert out.mean == pytest.approx(0.5) and out.se == pytest.approx(np.sqrt(a + b))
  assert out.df == pytest.approx((a + b) ** 2 / (a ** 2 / 4 + b ** 2 / 8))
  assert finding_statistics.with_null(est, [], {"mean": 0, "sd": None, "draws": 0}) is None


def test_norm_rows_take_their_margin_from_what_a_norm_can_move(table):
  """The norms' rows are measured against the floor and gap of the streams they read (0.1 and
  0.3 + the local raise at residual_1 in these runs), not against the local mixer's raise."""
  found, _ = table
  floor_row = found["swa16: norms lower the floor"]
  gap_row = found["swa16: norms raise the gap"]
  assert floor_row.margin == pytest.approx(0.1 * 0.1, rel=0.1)
  # Inputs: 'input' has gap 0.3 at every layer; 'residual_1' 0.3 + 0.2 at the 2 local layers.
  assert gap_row.margin == pytest.approx(0.1 * (0.3 + 0.3 + 0.1) / 2, rel=0.05)
  assert "what a norm can move" in floor_row.margin_rule
  mixer_row = found["swa16: the local mixer raises the gap most"]
  assert mixer_row.margin != pytest.approx(floor_row.margin)


def test_the_read_out_against_nope_is_a_row_of_its_own(table):
  """Stage 3 says the hybrid's global layers read out more than the global-only model's; the
  synthetic swa16 reads 0.3 and nope 0.1 at the same layers."""
  found, _ = table
  v = found["swa16: the hybrid reads out more recency than nope"]
  assert v.mean == pytest.approx(0.3 - 0.1, abs=0.01) and v.sign == 1
  assert "nope: the hybrid reads out more recency than nope" not in found


def test_the_experiments_file_names_each_part_and_refuses_a_bad_key(tmp_path):
  """The committed file declares the parts; a missing or unknown key fails naming it."""
  experiments = exploratory_experiments.load(os.path.join(REPO,
                                                          exploratory_experiments.DEFAULT_PATH))
  assert experiments.baseline == "nope" and experiments.windows.large in experiments.local
  assert all(len(pair) == 2 for pair in experiments.mixer_pairs)
  bad = tmp_path / "bad.toml"
  bad.write_text('baseline = "nope"\nlocal = ["swa16"]\nmixer_pairs = []\nnorm_series = []\n'
                 'rope_global_controls = []\nwindows = {small = "swa16", large = "swa256"}\n'
                 'typo = 1\n')
  with pytest.raises(exploratory_experiments.ExperimentsError, match="typo"):
    exploratory_experiments.load(str(bad))
  with pytest.raises(exploratory_experiments.ExperimentsError, match="small_at_large_flops"):
    bad.write_text(bad.read_text().replace("typo = 1\n", ""))
    exploratory_experiments.load(str(bad))
