"""The compare table's cells: a value with its standard error where the row has one, "—" where
it has none, and each column in its own format."""
from hybrid_nope.analysis.evidence import compare_table
from hybrid_nope.analysis.evidence.compare_table import cell, value_cell


def test_a_cell_shows_its_value_and_its_error_without_the_values_sign():
  assert cell(None, ".4f") == "—"
  assert cell(0.123456, "+.4f") == "+0.1235"
  assert cell(-0.123456, "+.4f", 0.01234) == "-0.1235 ± 0.0123"
  assert cell(3, ".4f", 0.5) == "3"  # Not a float (a count, a name): as it is, no ±.


def test_seed_lists_and_one_runs_sign_flip_count_keep_their_own_format():
  row = {"seeds": [0, 1, 4], "n_seeds": 1, "logit_gap_sign_flips": 2.0,
         "logit_gap_sign_flips_se": 0.5, "gap": 0.25, "gap_se": 0.01}
  assert value_cell(row, "seeds", "") == "0, 1, 4"
  assert value_cell(row, "logit_gap_sign_flips", ".1f") == "2.0"  # No ± for one run's count.
  assert value_cell(dict(row, n_seeds=3), "logit_gap_sign_flips", ".1f") == "2.0 ± 0.5"
  assert value_cell(row, "gap", ".4f") == "0.2500 ± 0.0100"


def test_the_table_has_a_column_per_entry_and_one_per_extrapolation_factor():
  row = {key: None for _, key, _ in compare_table.COLUMNS}
  row.update(name="swa16 (2 seeds)", seeds=[0, 1], n_seeds=2, extrapolation_step=640,
             ratio={2: 1.05, 4: 1.2}, ratio_se={2: 0.01})
  header, rule, line = compare_table.table([row]).splitlines()
  columns = len(compare_table.COLUMNS) + 1 + 2
  assert header.count("|") == rule.count("|") == line.count("|") == columns + 1
  assert header.endswith("| extrap. step | ratio 2× | ratio 4× |")
  assert line.endswith("| 640 | 1.0500 ± 0.0100 | 1.2000 |")
