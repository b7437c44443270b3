# Tiers (pytest.ini): the tests marked integration here read a run that tests/analysis_runs.py
# trains and analyses end to end (8 steps, once per process), or run launch/compare.py in a
# subprocess, so they are `make test-all` only; the fake-run sweeps stay in `make test`.
# test-all only: a real run's table row matches its files (test_real_run_table_matches_its_files);
# the gap since init is paired over the probe documents from the sums files
# (test_gap_since_init_is_paired_over_the_probe_documents_from_the_sums_files); launch/compare.py
# prints the table it writes to compare.md (test_cli_writes_the_table; the table's values are
# checked in process here in `make test`).
"""The sweep table, figures and correlations against the numbers in the runs' files."""
import json
import os
import subprocess
import sys
import tarfile
import warnings

import numpy as np
import pytest
import scipy.stats

from matplotlib import image

from hybrid_nope.run import run_config, run_dir
from hybrid_nope.run import checkpoints
from hybrid_nope.analysis.evidence import compare, run_files, seed_stats
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure.hook import DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import analyzed_run
from tests.helpers import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_jsonl(path, records):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


LAGS = [1, 32]


def _record(step, layer, kind, module, gap, floor, se):
  return {"step": step, "layer": layer, "layer_type": kind, "module": module, "lags": LAGS,
          "far_lag": LAGS[-1],
          "profile": [floor + gap, floor], "floor": floor, "gap": gap, "pairs": [120, 40],
          "stderr": [se, se]}


def _recency(step, gap, logit_gap, *, gap_se, logit_se, data_gap):
  """Records of a 2-layer SG model in recency.jsonl's format: only the global layer's input
  (pre_mixer_norm) enters the summaries; every other boundary carries a decoy gap. At step 0
  the data control record comes first, as the hook writes it."""
  out = []
  if step == 0:
    out.append(_record(step, DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE, data_gap, 0.02, 0.001))
  for layer, kind in ((0, "swa"), (1, "global")):
    modules = BOUNDARIES + ((FINAL_BOUNDARY,) if layer == 1 else ())
    for module in modules:
      r = _record(step, layer, kind, module, gap + 1 + layer, 0.1, 7 * gap_se)
      if kind == "global":  # The readout rides on every record of a global NoPE layer.
        r.update(logit_profile=[[logit_gap, 0.0], [3 * logit_gap, 0.0]],
                 logit_gap=[logit_gap, 3 * logit_gap], logit_gap_stderr=[logit_se, logit_se],
                 alignment=[0.5 * logit_gap, 0.5 * logit_gap],
                 alignment_null=[1 / 32, 1 / 32])
        if module == "pre_mixer_norm":
          # The summarised record, with its paired (per-document) gap SE.
          r.update(gap=gap, floor=0.1 + gap / 10, stderr=[gap_se / np.sqrt(2)] * 2,
                   gap_stderr=gap_se)
      out.append(r)
  return out


def fake_run(root, name, *, window, swa_pos="rope", pattern="SG", losses=(3.0, 2.5),
             gaps=(0.05, 0.2, 0.3), logit_gaps=(0.0, 0.1, 0.2), ratios=None, seed=0,
             gap_se=0.002, logit_se=0.01, data_gap=0.05, ratio_gap=None):
  """A workdir with the files compare reads; recency at steps 0, 4, 8 and eval at 4, 8."""
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  config = tiny_config(model__window=window, model__swa_pos=swa_pos, model__pattern=pattern,
                       train__seed=seed)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort())
  _write_jsonl(os.path.join(workdir, "metrics.jsonl"),
               [{"step": 4, "loss": 9.0}, {"step": 4, "eval_loss": losses[0]},
                {"step": 8, "loss": 8.0}, {"step": 8, "eval_loss": losses[1]}])
  _write_jsonl(os.path.join(workdir, "recency.jsonl"),
               [r for s, g, l in zip((0, 4, 8), gaps, logit_gaps)
                for r in _recency(s, g, l, gap_se=gap_se, logit_se=logit_se,
                                  data_gap=data_gap)])
  if ratios:
    out = os.path.join(workdir, "analysis", "step_8")
    os.makedirs(out)
    rows = [{"factor": 1, "seq_len": 64, "ratio": None,
             "gap": gaps[-1] + 0.01 if ratio_gap is None else ratio_gap,
             "logit_gap": 2 * logit_gaps[-1], "gap_stderr": gap_se,
             "logit_gap_stderr": logit_se}]
    rows += [{"factor": k, "seq_len": 64 * k, "ratio": r, "gap": 0.0, "logit_gap": 0.0}
             for k, r in ratios.items()]
    with open(os.path.join(out, run_dir.EXTRAPOLATION_FILE), "w") as f:
      json.dump({"step": 8, "train_seq_len": 64, "lengths": rows}, f)
  return workdir


def _value(cell):
  """A table cell "v" or "v ± se" as (v, se or None)."""
  value, _, se = cell.partition(" ± ")
  return float(value), float(se) if se else None


def _table_rows(markdown):
  lines = [l for l in markdown.splitlines() if l.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  return [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


@pytest.fixture
def sweep(tmp_path):
  specs = [("swa4", dict(window=4, gaps=(0.0, 0.3, 0.40), ratios={2: 1.01, 4: 1.02},
                         losses=(3.0, 2.1))),
           ("swa8", dict(window=8, gaps=(0.0, 0.2, 0.25), ratios={2: 1.08, 4: 1.05},
                         losses=(3.0, 2.2))),
           ("swa16", dict(window=16, gaps=(0.0, 0.1, 0.12), ratios={2: 1.04, 4: 1.15},
                          losses=(3.0, 2.4))),
           ("nopeswa16", dict(window=16, swa_pos="nope", gaps=(0.0, 0.1, 0.05),
                              logit_gaps=(0.0, 0.2, -0.1), ratios={2: 1.10, 4: 1.20},
                              losses=(3.0, 3.5))),
           # Its logit gap changes sign within noise (|2l| = 0.02 < 2 x 0.05): no flip.
           ("noisy32", dict(window=32, logit_gaps=(0.0, 0.01, -0.01), logit_se=0.05,
                            ratios=None, losses=(3.0, 2.6))),
           ("nope", dict(window=4, pattern="G", ratios=None, losses=(3.0, 2.9)))]
  return [fake_run(str(tmp_path), name, **kw) for name, kw in specs], dict(specs)


def test_table_values_are_the_files_numbers(sweep, tmp_path):
  workdirs, specs = sweep
  result = compare.compare([open_readonly(w) for w in workdirs], out_dir=str(tmp_path / "out"))
  rows = {r["run"]: r for r in _table_rows(result["markdown"])}
  assert list(rows) == ["swa4", "swa8", "swa16", "nopeswa16", "noisy32", "nope"]
  for name, spec in specs.items():
    row = rows[name]
    gaps = spec.get("gaps", (0.05, 0.2, 0.3))
    logit = spec.get("logit_gaps", (0.0, 0.1, 0.2))[-1]
    logit_se = spec.get("logit_se", 0.01)
    assert row["train.seed"] == "0"
    assert _value(row["final eval loss"]) == (pytest.approx(spec["losses"][1], abs=5e-5), None)
    assert row["eval step"] == "8" and row["recency step"] == "8"
    # Single seed: ± the measurement standard error over probe documents, where recorded.
    assert _value(row["gap"]) == (pytest.approx(gaps[-1], abs=5e-5),
                                  pytest.approx(0.002, abs=5e-5))
    assert _value(row["floor"]) == (pytest.approx(0.1 + gaps[-1] / 10, abs=5e-5), None)
    assert _value(row["logit gap"]) == (pytest.approx(2 * logit, abs=5e-5),  # mean of l, 3l
                                        pytest.approx(logit_se, abs=5e-5))
    assert _value(row["alignment"]) == (pytest.approx(0.5 * logit, abs=5e-5), None)
    # The null of the mean shown (2 heads of null 1/32 each): 1/(32 sqrt(2)), not one head's.
    assert _value(row["alignment null"]) == (pytest.approx(1 / (32 * np.sqrt(2)), rel=2e-3),
                                             None)
    # The data control exists only at step 0, yet the row (at step 8) shows it.
    assert _value(row["data gap"]) == (pytest.approx(0.05, abs=5e-5), None)
    if spec["ratios"]:
      assert _value(row["ratio 2×"])[0] == pytest.approx(spec["ratios"][2], abs=5e-5)
      assert _value(row["ratio 4×"])[0] == pytest.approx(spec["ratios"][4], abs=5e-5)
      assert row["extrap. step"] == "8"
    else:
      assert row["ratio 2×"] == row["ratio 4×"] == row["extrap. step"] == "—"
  assert rows["nope"]["window"] == "—" and rows["nope"]["SWA pos"] == "—"
  assert rows["nopeswa16"]["SWA pos"] == "nope" and rows["swa16"]["window"] == "16"
  assert rows["nopeswa16"]["logit-gap sign flips"] == "1"  # +0.4 ± 0.01 -> -0.2 ± 0.01.
  assert rows["noisy32"]["logit-gap sign flips"] == "0"
  assert rows["swa4"]["logit-gap sign flips"] == "0"
  assert "No extrapolation analysis for noisy32, nope" in result["markdown"]
  assert f"more than {compare.SIGNIFICANT_SE} standard errors" in result["markdown"]
  with open(tmp_path / "out" / "compare.md") as f:
    assert f.read() == result["markdown"]
  with open(tmp_path / "out" / "compare.json") as f:
    saved = json.load(f)
  assert [r["name"] for r in saved["rows"]] == list(rows)
  assert saved["runs"][0]["gap"] == pytest.approx(0.40) and "config_key" not in saved["runs"][0]


def test_correlation_across_the_sweep(sweep, tmp_path):
  workdirs, specs = sweep
  result = compare.compare([open_readonly(w) for w in workdirs], out_dir=str(tmp_path / "out"),
                           figures=False)
  runs = [n for n, s in specs.items() if s["ratios"]]
  gap = [specs[n]["gaps"][-1] + 0.01 for n in runs]  # The 1x row of extrapolation.json.
  logit = [2 * specs[n].get("logit_gaps", (0.0, 0.1, 0.2))[-1] for n in runs]
  for k in (2, 4):
    ratio = [specs[n]["ratios"][k] for n in runs]
    c = result["correlations"][k]
    assert c["gap"]["n"] == 4
    assert c["gap"]["pearson"] == pytest.approx(scipy.stats.pearsonr(gap, ratio)[0])
    assert c["gap"]["spearman"] == pytest.approx(scipy.stats.spearmanr(gap, ratio)[0])
    assert c["logit_gap"]["spearman"] == pytest.approx(scipy.stats.spearmanr(logit, ratio)[0])
    assert f"{k}×, gap vs ratio: Spearman ρ = {c['gap']['spearman']:+.3f}" in result["markdown"]
  # At 4x the ratio falls as the gap grows, run by run: a rank correlation of exactly -1.
  assert result["correlations"][4]["gap"]["spearman"] == pytest.approx(-1.0)
  assert result["correlations"][2]["gap"]["spearman"] == pytest.approx(-0.8)


def test_correlation_is_scipys_and_undefined_for_constant_input():
  x, y = [0.1, 0.4, 0.2, 0.9, 0.5], [1.3, 1.1, 1.2, 0.7, 1.2]  # A tie in y.
  c = compare.correlation(x, y)
  assert c["n"] == 5
  assert c["pearson"] == pytest.approx(scipy.stats.pearsonr(x, y).statistic, rel=1e-12)
  assert c["spearman"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic, rel=1e-12)
  # By hand: ranks x 1, 3, 2, 5, 4 and y 5, 2, 3.5, 1, 3.5 (the tie shares its mean rank).
  assert c["spearman"] == pytest.approx(-8 / np.sqrt(10 * 9.5))
  assert compare.correlation([1, 2], [3, 4]) == {"n": 2, "pearson": None, "spearman": None}
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # scipy's ConstantInputWarning is expected and silenced.
    assert compare.correlation([1, 1, 1], [1, 2, 3]) == {"n": 3, "pearson": None,
                                                         "spearman": None}
    assert compare.correlation([1, 2, 3], [5, 5, 5])["spearman"] is None


def test_figures_are_written(sweep, tmp_path):
  workdirs, _ = sweep
  result = compare.compare([open_readonly(w) for w in workdirs], out_dir=str(tmp_path / "out"))
  pngs = sorted(os.path.basename(p) for p in result["files"] if p.endswith(".png"))
  assert pngs == ["extrapolation_vs_gap.png", "gap_vs_step.png", "gap_vs_window.png",
                  "loss_vs_window.png"]
  for p in result["files"]:
    assert os.path.getsize(p) > 2000
  for p in result["files"]:
    if p.endswith(".png"):
      pixels = image.imread(p)
      assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300, p


@pytest.mark.integration
def test_real_run_table_matches_its_files(tmp_path_factory, tmp_path):
  workdir, analysis = analyzed_run(tmp_path_factory)
  result = compare.compare([open_readonly(workdir)], out_dir=str(tmp_path))
  row = _table_rows(result["markdown"])[0]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [json.loads(l) for l in f if "eval_loss" in l]
  assert float(row["final eval loss"]) == pytest.approx(evals[-1]["eval_loss"], abs=5e-5)
  with open(os.path.join(workdir, "recency.jsonl")) as f:
    records = [json.loads(l) for l in f]
  last = [r for r in records if r["step"] == 8]
  inputs = [r for r in last if r["layer_type"] == "global" and r["module"] == "pre_mixer_norm"]
  gap, gap_se = _value(row["gap"])
  assert gap == pytest.approx(np.mean([r["gap"] for r in inputs]), abs=5e-5)
  # The paired per-document SE of f(1) − f(L), not the hypot of the two lags' SEs.
  assert gap_se == pytest.approx(np.mean([r["gap_stderr"] for r in inputs]), abs=5e-5)
  logit, logit_se = _value(row["logit gap"])
  assert logit == pytest.approx(np.mean([g for r in inputs for g in r["logit_gap"]]), abs=5e-5)
  assert logit_se == pytest.approx(
      np.mean([s for r in inputs for s in r["logit_gap_stderr"]]), abs=5e-5)
  heads = len([a for r in inputs for a in r["alignment_null"]])
  # The null of the head mean: 1/(d_model sqrt(heads)).
  assert _value(row["alignment null"])[0] == pytest.approx(1 / (32 * np.sqrt(heads)), rel=2e-3)
  (data,) = [r for r in records if r["layer"] == DATA_LAYER]
  assert data["step"] == 0
  assert _value(row["data gap"])[0] == pytest.approx(data["gap"], abs=5e-5)
  assert _value(row["ratio 2×"])[0] == pytest.approx(
      analysis["extrapolation"]["lengths"][1]["ratio"], abs=5e-5)
  assert "n/a" not in row and "(n = 1)" in result["markdown"]


def test_unusable_run_names_its_file(tmp_path):
  workdir = fake_run(str(tmp_path), "run", window=4)
  os.remove(os.path.join(workdir, "recency.jsonl"))
  with pytest.raises(checkpoints.WorkdirError, match=f"{workdir}/recency.jsonl does not exist"):
    compare.compare([open_readonly(workdir)], out_dir=str(tmp_path / "out"))
  with pytest.raises(checkpoints.WorkdirError, match="does not exist"):
    compare.compare([open_readonly(str(tmp_path / "missing"))])
  with pytest.raises(checkpoints.AnalysisError, match="at least one workdir"):
    compare.compare([])


def test_sign_flips_count_only_significant_crossings():
  se = [0.05] * 5
  # Noise around a positive gap: the old count of every sign change gave 4; now none.
  assert compare.sign_flips([0.3, -0.05, 0.2, -0.08, 0.25], se) == 0
  # Real crossings (|v| > 2 se) count, with noise between them neither flipping nor resetting:
  # +0.3, (-0.05), (+0.04), -0.4, +0.5 is two flips where the old count gave four.
  assert compare.sign_flips([0.3, -0.05, 0.04, -0.4, 0.5], se) == 2
  # A value exactly at 2 se is not significant; the threshold scales with each point's se.
  assert compare.sign_flips([0.5, -0.5, -0.5], [0.01, 0.25, 0.3]) == 0
  assert compare.sign_flips([0.5, -0.5, -0.5], [0.01, 0.2, 0.3]) == 1
  # The first significant value sets the sign without flipping.
  assert compare.sign_flips([0.01, -0.4], [0.05, 0.05]) == 0
  # Unknown values or standard errors are skipped.
  assert compare.sign_flips([0.3, None, -0.4], [0.05, 0.05, None]) == 0
  assert compare.sign_flips([0.3, None, -0.4], [0.05, None, 0.05]) == 1
  assert compare.sign_flips([0.3, -0.4], [0.05, float("nan")]) == 0
  assert compare.sign_flips([], []) == 0
  with pytest.raises(ValueError, match="2 values but 1 standard errors"):
    compare.sign_flips([0.3, -0.4], [0.05])


def _mean_se(values):
  values = np.asarray(values, float)
  return values.mean(), values.std(ddof=1) / np.sqrt(len(values))


COMMITTED_RECORDS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "results", "runs")


def test_every_committed_experiments_seeds_share_one_config_key():
  """The sweep's packs were trained across many commits; configs saved before a key was added
  must still group with their experiment's later seeds (else results.md splits a row)."""
  experiments = sorted(os.listdir(COMMITTED_RECORDS))
  assert experiments, COMMITTED_RECORDS
  for experiment in experiments:
    keys = {}
    folder = os.path.join(COMMITTED_RECORDS, experiment)
    for pack in sorted(os.listdir(folder)):
      with tarfile.open(os.path.join(folder, pack)) as tar:
        config = json.load(tar.extractfile("config.json"))
      seed, key = compare.seed_and_config_key(config)
      assert pack == f"seed{seed}.tar.gz"
      keys[seed] = key
    first = json.loads(keys[min(keys)])
    differing = {seed: sorted(k for k in first.keys() | json.loads(key).keys()
                              if first.get(k, "<absent>") != json.loads(key).get(k, "<absent>"))
                 for seed, key in keys.items()}
    assert not any(differing.values()), (experiment, differing)


def test_seeds_of_one_config_aggregate_into_one_row(tmp_path):
  seeds = {  # name: (seed, final eval loss, gaps, logit gaps, 2x ratio, extrapolation gap)
      "swa4_seed0": (0, 2.10, (0.0, 0.30, 0.40), (0.0, 0.1, 0.20), 1.01, 0.41),
      "swa4_seed1": (1, 2.30, (0.0, 0.20, 0.34), (0.0, 0.3, -0.10), 1.05, 0.30),
      "swa4_seed2": (2, 2.15, (0.0, 0.25, 0.31), (0.0, 0.2, 0.05), 1.03, 0.36),
  }
  workdirs = [fake_run(str(tmp_path), name, window=4, seed=seed, losses=(3.0, loss), gaps=gaps,
                       logit_gaps=logit, ratios={2: ratio}, ratio_gap=ext_gap)
              for name, (seed, loss, gaps, logit, ratio, ext_gap) in seeds.items()]
  # Seed 2 was saved before the keys added since existed: it still joins the others.
  path = os.path.join(workdirs[2], "config.json")
  saved = json.load(open(path))
  for key, before in run_config.ADDED_KEYS.items():
    section, name = key.split(".")
    if saved[section][name] == before:  # A default changed since (schedule_offset) is a change.
      del saved[section][name]
  json.dump(saved, open(path, "w"))
  # Differs from the seeds in the window only: its own row.
  workdirs.append(fake_run(str(tmp_path), "swa8", window=8, ratios={2: 1.2}))
  result = compare.compare([open_readonly(w) for w in workdirs], out_dir=str(tmp_path / "out"))
  assert [r["name"] for r in result["runs"]] == [*seeds, "swa8"]
  assert [r["name"] for r in result["rows"]] == ["swa4 (3 seeds)", "swa8"]
  agg, single = result["rows"]
  assert agg["n_seeds"] == 3 and agg["seeds"] == [0, 1, 2] and single["n_seeds"] == 1
  columns = list(zip(*seeds.values()))
  expected = {
      "eval_loss": _mean_se(columns[1]), "gap": _mean_se([g[-1] for g in columns[2]]),
      "floor": _mean_se([0.1 + g[-1] / 10 for g in columns[2]]),
      "logit_gap": _mean_se([2 * l[-1] for l in columns[3]]),
      "alignment": _mean_se([0.5 * l[-1] for l in columns[3]]),
      "extrapolation_gap": _mean_se(columns[5]),
  }
  for key, (mean, se) in expected.items():
    assert agg[key] == pytest.approx(mean, rel=1e-9), key
    assert agg[f"{key}_se"] == pytest.approx(se, rel=1e-9), key
  ratio_mean, ratio_se = _mean_se(columns[4])
  assert agg["ratio"][2] == pytest.approx(ratio_mean) and agg["ratio_se"][2] == pytest.approx(
      ratio_se)
  # Seed 1 flips (+0.6 -> -0.2, se 0.01), the others do not: 1/3 flips per seed.
  assert agg["logit_gap_sign_flips"] == pytest.approx(1 / 3)
  # Per step: the seed mean ± SE of the run gap and logit gap.
  by_step = dict(agg["by_step"])
  assert sorted(by_step) == [0, 4, 8]
  mean, se = _mean_se([g[1] for g in columns[2]])
  assert by_step[4]["gap"] == pytest.approx(mean) and by_step[4]["gap_se"] == pytest.approx(se)
  mean, se = _mean_se([2 * l[1] for l in columns[3]])
  assert by_step[4]["logit_gap"] == pytest.approx(mean)
  assert by_step[4]["logit_gap_se"] == pytest.approx(se)
  # A single seed keeps its measurement standard error.
  assert single["gap_se"] == pytest.approx(0.002) and single["logit_gap_se"] == pytest.approx(0.01)
  assert dict(single["by_step"])[8]["gap_se"] == pytest.approx(0.002)
  # The table shows mean ± se, the figures were drawn, compare.json holds both levels.
  row = {r["run"]: r for r in _table_rows(result["markdown"])}["swa4 (3 seeds)"]
  assert row["train.seed"] == "0, 1, 2"
  mean, se = expected["gap"]
  assert row["gap"] == f"{mean:.4f} ± {se:.4f}"
  mean, se = expected["logit_gap"]
  assert row["logit gap"] == f"{mean:+.4f} ± {se:.4f}"
  assert row["ratio 2×"] == f"{ratio_mean:.4f} ± {ratio_se:.4f}"
  assert "over seeds ± its standard error" in result["markdown"]
  # Correlations are over rows (configurations): two rows, too few.
  assert result["correlations"][2]["gap"]["n"] == 2
  for p in result["files"]:
    if p.endswith(".png"):
      assert image.imread(p).ndim == 3
  with open(tmp_path / "out" / "compare.json") as f:
    saved = json.load(f)
  assert len(saved["runs"]) == 4 and saved["rows"][0]["gap_se"] == pytest.approx(
      expected["gap"][1])


def test_group_names():
  assert compare._group_name(["swa4_seed0", "swa4_seed1"]) == "swa4"
  assert compare._group_name(["swa4-s0", "swa4-s1"]) == "swa4"
  assert compare._group_name(["a", "b"]) == "a"


@pytest.mark.integration
def test_cli_writes_the_table(sweep, tmp_path):
  workdirs, _ = sweep
  out = tmp_path / "cli"
  proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "compare.py"), *workdirs,
                         f"--out={out}"], capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "| swa4 |" in proc.stdout
  assert (out / "compare.md").read_text() == proc.stdout.rstrip("\n") + "\n"


def test_rows_are_paired_by_seed_against_the_baseline_and_set_against_the_init_null(tmp_path):
  """Two configs over seeds 0-2; the difference is taken per seed (its SE is that of the
  per-seed differences, far below the unpaired one when seeds share their draw), and a row's
  mean is a z against the init null of a mean of n initialisations."""
  shared = {0: 0.10, 1: 0.30, 2: 0.20}  # a per-seed draw both configs share
  workdirs = []
  for name, window, pattern, shift in (("swa4", 4, "SG", 0.05), ("nope", 4, "G", 0.0)):
    for seed, base in shared.items():
      workdirs.append(fake_run(str(tmp_path), f"{name}_seed{seed}", window=window,
                               pattern=pattern, seed=seed,
                               gaps=(0.0, 0.1, base + shift + 0.001 * seed ** 2)))
  null_dir = os.path.join(workdirs[0], "analysis", "step_8")
  os.makedirs(null_dir)
  with open(os.path.join(null_dir, "init_null_T64.json"), "w") as f:
    json.dump({"summary": {"gap": {"mean": 0.1, "sd": 0.05, "draws": 10}}}, f)
  result = compare.compare([open_readonly(w) for w in workdirs], out_dir=str(tmp_path / "out"),
                           figures=False)
  swa, nope = result["rows"]
  diffs = [0.05 + 0.001 * s ** 2 - 0.001 * s ** 2 for s in shared]  # the shared draw cancels
  paired = seed_stats.paired_difference(swa, nope, "gap")
  assert paired["seeds"] == [0, 1, 2] and paired["mean"] == pytest.approx(np.mean(diffs))
  assert paired["se"] == pytest.approx(0.0, abs=1e-12)
  assert swa["gap_se"] > 0.05  # unpaired, the shared draw is all noise
  gaps = [m["gap"] for m in swa["members_by_seed"].values()]
  welch = (np.mean(gaps) - 0.1) / np.sqrt(np.var(gaps, ddof=1) / 3 + 0.05 ** 2 / 10)
  assert swa["gap_null_t"] == pytest.approx(welch)
  assert nope["gap_null_t"] is None  # no init null measured for it
  text = result["markdown"]
  assert "## Paired by seed against nope (3 seeds)" in text
  assert "| swa4 (3 seeds) | " in text.split("## Paired by seed")[1]


@pytest.mark.integration
def test_gap_since_init_is_paired_over_the_probe_documents_from_the_sums_files(
    tmp_path_factory, tmp_path):
  """A real run: the change of the run gap from step 0 to the last step, and its SE from the
  two steps' per-cluster sums, against the same contrast built by hand."""
  workdir, _ = analyzed_run(tmp_path_factory)
  run = compare.load_run(open_readonly(workdir))
  records_ = run_files.read_jsonl(os.path.join(workdir, "recency.jsonl"))
  last = max(r["step"] for r in records_)
  gap = lambda step: np.mean([r["gap"] for r in records_ if r["step"] == step
                              and r["layer_type"] == "global"
                              and r["module"] == "pre_mixer_norm"])
  assert run["gap_since_init"] == pytest.approx(gap(last) - gap(0), abs=1e-5)
  reader = open_readonly(workdir)
  (s0, lags, far), (s1, _, _) = run_files.read_sums(reader, 0), run_files.read_sums(reader, last)
  near_i, far_i = lags.index(1), lags.index(far)
  keys = [k for k in s0 if k.endswith("/pre_mixer_norm") and k.split("/")[0] in
          {str(r["layer"]) for r in records_ if r["layer_type"] == "global"}]
  terms = []
  for k in keys:
    for sums, sign in ((s1, 1.0), (s0, -1.0)):
      terms += [(sign / len(keys), sums[k][near_i], sums["counts"][near_i]),
                (-sign / len(keys), sums[k][far_i], sums["counts"][far_i])]
  assert run["gap_since_init_stderr"] == pytest.approx(
      float(recency.contrast_stderr(terms)), rel=1e-6)
  assert run["gap_since_init_stderr"] > 0
