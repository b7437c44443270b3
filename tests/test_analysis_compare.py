"""The sweep table, figures and correlations against the numbers in the runs' files."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis import checkpoints, compare, report
from tests.analysis_runs import analyzed_run
from tests.helpers import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_jsonl(path, records):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def _recency(step, gap, logit_gap):
  """Records of a 2-layer SG model: only the global layer's input enters the summaries."""
  out = []
  for layer, kind in ((0, "swa"), (1, "global")):
    for module in ("pre_mixer_norm", "residual_2"):
      r = {"step": step, "layer": layer, "layer_type": kind, "module": module,
           "lags": [1, 32], "profile": [gap + 0.1, 0.1], "floor": 0.1, "gap": gap + layer}
      if kind == "global" and module == "pre_mixer_norm":
        r.update(gap=gap, floor=0.1 + gap / 10, logit_gap=[logit_gap, 3 * logit_gap],
                 alignment=[0.5 * logit_gap, 0.5 * logit_gap])
      out.append(r)
  return out


def fake_run(root, name, *, window, swa_pos="rope", pattern="SG", losses=(3.0, 2.5),
             gaps=(0.05, 0.2, 0.3), logit_gaps=(0.0, 0.1, 0.2), ratios=None):
  """A workdir with the files compare reads; recency at steps 0, 4, 8 and eval at 4, 8."""
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  config = tiny_config(model__window=window, model__swa_pos=swa_pos, model__pattern=pattern)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort())
  _write_jsonl(os.path.join(workdir, "metrics.jsonl"),
               [{"step": 4, "loss": 9.0}, {"step": 4, "eval_loss": losses[0]},
                {"step": 8, "loss": 8.0}, {"step": 8, "eval_loss": losses[1]}])
  _write_jsonl(os.path.join(workdir, "recency.jsonl"),
               [r for s, g, l in zip((0, 4, 8), gaps, logit_gaps) for r in _recency(s, g, l)])
  if ratios:
    out = os.path.join(workdir, "analysis", "step_8")
    os.makedirs(out)
    rows = [{"factor": 1, "seq_len": 64, "ratio": None, "gap": gaps[-1] + 0.01,
             "logit_gap": 2 * logit_gaps[-1]}]
    rows += [{"factor": k, "seq_len": 64 * k, "ratio": r, "gap": 0.0, "logit_gap": 0.0}
             for k, r in ratios.items()]
    with open(os.path.join(out, report.EXTRAPOLATION_FILE), "w") as f:
      json.dump({"step": 8, "train_seq_len": 64, "lengths": rows}, f)
  return workdir


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
           ("nope", dict(window=4, pattern="G", ratios=None, losses=(3.0, 2.9)))]
  return [fake_run(str(tmp_path), name, **kw) for name, kw in specs], dict(specs)


def test_table_values_are_the_files_numbers(sweep, tmp_path):
  workdirs, specs = sweep
  result = compare.compare(workdirs, out_dir=str(tmp_path / "out"))
  rows = {r["run"]: r for r in _table_rows(result["markdown"])}
  assert list(rows) == ["swa4", "swa8", "swa16", "nopeswa16", "nope"]
  for name, spec in specs.items():
    row = rows[name]
    gaps = spec.get("gaps", (0.05, 0.2, 0.3))
    logit = spec.get("logit_gaps", (0.0, 0.1, 0.2))[-1]
    assert float(row["final eval loss"]) == pytest.approx(spec["losses"][1], abs=5e-5)
    assert row["eval step"] == "8" and row["recency step"] == "8"
    assert float(row["gap"]) == pytest.approx(gaps[-1], abs=5e-5)
    assert float(row["floor"]) == pytest.approx(0.1 + gaps[-1] / 10, abs=5e-5)
    assert float(row["logit gap"]) == pytest.approx(2 * logit, abs=5e-5)  # mean of l, 3l
    assert float(row["alignment"]) == pytest.approx(0.5 * logit, abs=5e-5)
    if spec["ratios"]:
      assert float(row["ratio 2×"]) == pytest.approx(spec["ratios"][2], abs=5e-5)
      assert float(row["ratio 4×"]) == pytest.approx(spec["ratios"][4], abs=5e-5)
      assert row["extrap. step"] == "8"
    else:
      assert row["ratio 2×"] == row["ratio 4×"] == row["extrap. step"] == "—"
  assert rows["nope"]["window"] == "—" and rows["nope"]["SWA pos"] == "—"
  assert rows["nopeswa16"]["SWA pos"] == "nope" and rows["swa16"]["window"] == "16"
  assert rows["nopeswa16"]["logit-gap sign flips"] == "1"
  assert "No extrapolation analysis for nope" in result["markdown"]
  with open(tmp_path / "out" / "compare.md") as f:
    assert f.read() == result["markdown"]


def test_correlation_across_the_sweep(sweep, tmp_path):
  workdirs, specs = sweep
  result = compare.compare(workdirs, out_dir=str(tmp_path / "out"), figures=False)
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
  assert compare.correlation([1, 2], [3, 4]) == {"n": 2, "pearson": None, "spearman": None}
  assert compare.correlation([1, 1, 1], [1, 2, 3])["pearson"] is None


def test_figures_are_written(sweep, tmp_path):
  workdirs, _ = sweep
  result = compare.compare(workdirs, out_dir=str(tmp_path / "out"))
  pngs = sorted(os.path.basename(p) for p in result["files"] if p.endswith(".png"))
  assert pngs == ["extrapolation_vs_gap.png", "gap_vs_step.png", "gap_vs_window.png",
                  "loss_vs_window.png"]
  for p in result["files"]:
    assert os.path.getsize(p) > 2000


def test_real_run_table_matches_its_files(tmp_path_factory, tmp_path):
  workdir, analysis = analyzed_run(tmp_path_factory)
  result = compare.compare([workdir], out_dir=str(tmp_path))
  row = _table_rows(result["markdown"])[0]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [json.loads(l) for l in f if "eval_loss" in l]
  assert float(row["final eval loss"]) == pytest.approx(evals[-1]["eval_loss"], abs=5e-5)
  with open(os.path.join(workdir, "recency.jsonl")) as f:
    last = [r for r in map(json.loads, f) if r["step"] == 8]
  inputs = [r for r in last if r["layer_type"] == "global" and r["module"] == "pre_mixer_norm"]
  assert float(row["gap"]) == pytest.approx(np.mean([r["gap"] for r in inputs]), abs=5e-5)
  assert float(row["logit gap"]) == pytest.approx(
      np.mean([g for r in inputs for g in r["logit_gap"]]), abs=5e-5)
  assert float(row["ratio 2×"]) == pytest.approx(
      analysis["extrapolation"]["lengths"][1]["ratio"], abs=5e-5)
  assert "n/a" not in row and "(n = 1)" in result["markdown"]


def test_unusable_run_names_its_file(tmp_path):
  workdir = fake_run(str(tmp_path), "run", window=4)
  os.remove(os.path.join(workdir, "recency.jsonl"))
  with pytest.raises(checkpoints.WorkdirError, match=f"{workdir}/recency.jsonl does not exist"):
    compare.compare([workdir], out_dir=str(tmp_path / "out"))
  with pytest.raises(checkpoints.WorkdirError, match="does not exist"):
    compare.compare([str(tmp_path / "missing")])
  with pytest.raises(checkpoints.AnalysisError, match="at least one workdir"):
    compare.compare([])


def test_sign_flips():
  assert compare.sign_flips([0.1, -0.2, 0.3, 0.0, 0.4, None, -1.0]) == 3
  assert compare.sign_flips([]) == 0


def test_cli_writes_the_table(sweep, tmp_path):
  workdirs, _ = sweep
  out = tmp_path / "cli"
  proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "compare.py"), *workdirs,
                         f"--out={out}"], capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "| swa4 |" in proc.stdout
  assert (out / "compare.md").read_text() == proc.stdout.rstrip("\n") + "\n"
