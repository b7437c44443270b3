"""docs/results.md regenerates from packed records alone: packs in, page out, numbers from the
records, verdicts only where the seeds exist."""
import os

import numpy as np
import pytest

from hybrid_nope import sweep
from hybrid_nope.analysis import results_page
from tests.test_analysis_compare import fake_run


@pytest.fixture
def packs(tmp_path):
  """swa16 at seeds 0-2 and nope at seeds 0-1, packed as the sweep packs them; the runs
  themselves are deleted, so only the packs can feed the page."""
  records = tmp_path / "records"
  runs = tmp_path / "runs"
  gaps = {("swa16", 0): 0.30, ("swa16", 1): 0.32, ("swa16", 2): 0.31,
          ("nope", 0): 0.10, ("nope", 1): 0.12}
  for (experiment, seed), gap in gaps.items():
    workdir = fake_run(str(runs), f"{experiment}_seed{seed}", window=16 if experiment == "swa16"
                       else 4, pattern="SG" if experiment == "swa16" else "G", seed=seed,
                       gaps=(0.05, 0.2, gap))
    sweep.pack_records(workdir, str(records / experiment / f"seed{seed}.tar.gz"))
  for root, dirs, files in os.walk(runs, topdown=False):
    for f in files:
      os.remove(os.path.join(root, f))
    for d in dirs:
      os.rmdir(os.path.join(root, d))
  return str(records), gaps


def test_page_is_built_from_the_packs_alone(packs, tmp_path):
  records, gaps = packs
  out = str(tmp_path / "results.md")
  result = results_page.build(records, out, None, "# Results at {commit}")
  text = open(out).read()
  assert text.startswith("# Results at ") and "{commit}" not in text
  assert "Records: 5 runs — nope ×2, swa16 ×3." in text
  rows = {r["name"]: r for r in result["rows"]}
  assert set(rows) == {"swa16 (3 seeds)", "nope (2 seeds)"}
  swa = [g for (e, _), g in gaps.items() if e == "swa16"]
  assert rows["swa16 (3 seeds)"]["gap"] == pytest.approx(np.mean(swa), abs=1e-9)
  assert rows["swa16 (3 seeds)"]["gap_se"] == pytest.approx(np.std(swa, ddof=1) / np.sqrt(3))
  found = {v["finding"]: v for v in result["verdicts"]}
  # Strengthens with training: gap(final) − gap(0) per seed, the fake runs' 0.05 at step 0.
  v = found["swa16: recency strengthens with training"]
  assert v["values"] == pytest.approx([g - 0.05 for g in swa]) and v["verdict"] == "reproduced"
  assert "| swa16: recency strengthens with training |" in text
  # The fake runs have one global layer: no depth finding, rather than one with no seeds.
  assert not any("with depth" in f for f in found)
  # The window claims need swa256 seeds: not listed until those runs exist.
  assert not any("swa256" in f or "smaller windows" in f for f in found)


def test_no_packs_is_an_error_naming_the_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    results_page.build(str(tmp_path), str(tmp_path / "r.md"), None, "")


def test_mixers_are_compared_paired_by_seed(tmp_path):
  # gdn and gla at seeds 0-2 with known final eval losses; the page gives gdn − gla per seed.
  losses = {("gdn", 0): 2.30, ("gdn", 1): 2.25, ("gdn", 2): 2.40,
            ("gla", 0): 2.50, ("gla", 1): 2.35, ("gla", 2): 2.41}
  records = tmp_path / "records"
  for (experiment, seed), loss in losses.items():
    workdir = fake_run(str(tmp_path / "runs"), f"{experiment}_seed{seed}", window=4,
                       pattern="DG" if experiment == "gdn" else "LG", seed=seed,
                       losses=(3.0, loss))
    sweep.pack_records(workdir, str(records / experiment / f"seed{seed}.tar.gz"))
  out = str(tmp_path / "results.md")
  results_page.build(str(records), out, None, "# Results")
  rows = [l for l in open(out).read().splitlines()
          if l.startswith("| gdn − gla | final eval loss |")]
  diffs = [losses[("gdn", s)] - losses[("gla", s)] for s in range(3)]
  mean, se = np.mean(diffs), np.std(diffs, ddof=1) / np.sqrt(3)
  assert len(rows) == 1 and f"| 3 | {mean:+.4f} ± {se:.4f} | {mean / se:+.1f}" in rows[0]
  # t = -2.1 on 2 df does not clear 4.30: the reading names no winner.
  assert rows[0].endswith("| no difference detected at 3 seeds |")
  # Pairs whose runs are absent are not listed.
  assert "gdn3 − gdn" not in open(out).read()


@pytest.mark.parametrize("t, reading", [(-5.0, "gdn < gla"), (5.0, "gdn > gla"),
                                        (4.0, "no difference detected at 3 seeds"),
                                        (float("nan"), "no difference detected at 3 seeds")])
def test_a_mixer_row_names_the_larger_side_only_past_the_critical_t(t, reading):
  assert results_page.reading("gdn", "gla", t, 4.30, 3) == reading
