# Tiers (pytest.ini): the everyday tier imports a tiny model and analyses it end to end (the
# recency records of its NoPE layer), reads the checkpoint back bit for bit and checks the
# tokenizer plan and the refusals; integration adds the launch scripts end to end (import_hf,
# analyze with --ablate=local, score, generate, export_hf) and a foreign tokenizer's text set
# prepared by textbook_chapters.
"""Writing an imported model as a workdir (hybrid_nope/export/import_workdir.py) and the
instruments on it: analyze, score, generate and export read what the import wrote."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

from configs import base
from hybrid_nope.run import run_dir
from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.run import checkpoints, imported
from hybrid_nope.model import checkpointed
from hybrid_nope.errors import USAGE_EXIT_CODE
from hybrid_nope.export import hf, hf_import, import_workdir
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.reader import open_readonly
from tests.helpers import REPO, tiny_config
from tests.test_export_hf_import import (assert_same_bits, random_params, smollm3_3b_like,
                                         write_hf_dir)

# The analysis' data for a tiny model: short rows, a two-row probe, one eval batch.
ANALYSIS = {"data.seq_len": 32, "metrics.far_lag": 16, "metrics.probe_batch_size": 2,
            "metrics.probe_pool_rows": 16, "eval.batch_size": 2, "eval.num_batches": 1,
            "eval.bucket_size": 16, "metrics.figures": False}


def joined_config(overrides=ANALYSIS):
  config = base.get_config()
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  """Our export of a tiny random SG model (tied, D 24: sqrt(D) no power of two), and it."""
  config = tiny_config(model__d_model=24, model__num_heads=4, model__head_dim=6)
  params = random_params(config, seed=2)
  return write_hf_dir(str(tmp_path_factory.mktemp("hf")), config, params), config, params


def foreign_tokenizer(path: str, size: int = 40) -> str:
  """A word-level tokenizer.json that is not our byte tokenizer."""
  vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(size - 1)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(path)
  return path


def test_import_then_analyze_measures_the_nope_layer(tiny_hf, tmp_path):
  hf_dir, config, params = tiny_hf
  workdir = str(tmp_path / "imported")
  result = import_workdir.import_hf(hf_dir, workdir, joined_config(), list(ANALYSIS))
  assert result["exact"] and "byte tokenizer" in result["notes"][-1]
  loaded = checkpoints.load_config(workdir)
  assert loaded.model.to_dict() == config.model.to_dict() and loaded.data.source == "stdlib"
  step, _, restored = checkpointed.restore_params(open_readonly(workdir, loaded))
  assert step == import_workdir.IMPORTED_STEP
  assert_same_bits(restored, params)

  analysis = report.analyze(open_readonly(workdir), lengths=(1,), figures=False)["analysis"]
  readout = [r for r in analysis["records"] if r["layer"] == 1 and r["module"] == "pre_mixer_norm"]
  assert len(readout) == 1 and readout[0]["layer_type"] == "global"
  for key in ("gap", "floor", "logit_gap", "logit_profile", "alignment", "shuffled_logit_gap"):
    assert np.all(np.isfinite(readout[0][key])), key
  assert len(readout[0]["logit_gap"]) == config.model.num_heads
  layers = {(r["layer"], r["module"]) for r in analysis["records"]}
  assert {(0, "mixer"), (1, "mixer"), (1, "final_norm")} <= layers


def test_the_tokenizer_decides_the_data_source_and_is_carried(tmp_path):
  smollm3_3b_like(str(tmp_path / "hf"))
  base_config = joined_config()
  source, carried, _ = import_workdir.tokenizer_plan(str(tmp_path / "hf"), None, 300)
  assert (source, carried) == ("mds", [])  # No tokenizer: score needs --tokenizer.
  foreign_tokenizer(str(tmp_path / "hf" / "tokenizer.json"))
  (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
  workdir = str(tmp_path / "wd")
  result = import_workdir.import_hf(str(tmp_path / "hf"), workdir, base_config)
  assert not result["exact"] and checkpoints.load_config(workdir).data.source == "mds"
  assert sorted(os.listdir(RunDir(workdir).tokenizer)) == ["tokenizer.json",
                                                          "tokenizer_config.json"]
  assert checkpoints.tokenizer_path(workdir) == RunDir(workdir).tokenizer_file
  assert checkpoints.tokenizer_path(workdir, "/x.json") == "/x.json"
  assert RunDir(workdir).describe(RunDir(workdir).tokenizer_file) == "tokenizer"
  base_config.data.source = "stdlib"
  with pytest.raises(hf_import.HFImportError, match="tokenises with our byte tokenizer"):
    import_workdir.import_hf(str(tmp_path / "hf"), str(tmp_path / "wd2"), base_config,
                             ["data.source"])
  with pytest.raises(hf_import.HFImportError, match="has 40 tokens but config.json's vocab_size "
                                                    "is 30"):
    import_workdir.tokenizer_plan(str(tmp_path / "hf"), None, 30)


def test_refusals_come_before_anything_is_written(tiny_hf, tmp_path):
  hf_dir, _, _ = tiny_hf
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "x").write_text("")
  with pytest.raises(hf_import.HFImportError, match="exists and is not an empty directory"):
    import_workdir.import_hf(hf_dir, str(tmp_path / "taken"), joined_config())
  with pytest.raises(hf_import.HFImportError, match="--config.model.window: model.* comes from"):
    import_workdir.import_hf(hf_dir, str(tmp_path / "new"), joined_config(), ["model.window"])
  assert not (tmp_path / "new").exists()


def _run(script, *args):
  return subprocess.run([sys.executable, os.path.join("launch", script), *args], cwd=REPO,
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO))


def test_a_checkpoint_with_non_finite_params_is_refused_by_its_readers(tiny_hf, tmp_path):
  """The import refuses such weights; a checkpoint written otherwise is refused on restore,
  which score, generate, analyze and export share, naming the parameter."""
  hf_dir, config, params = tiny_hf
  workdir = str(tmp_path / "wd")
  import_workdir.import_hf(hf_dir, workdir, joined_config(), list(ANALYSIS))
  loaded = checkpoints.load_config(workdir)
  broken = str(tmp_path / "broken")
  wq = params["blocks"][1]["attn"]["wq_DNH"].copy()
  wq[0, 0, :2] = np.nan
  nan_params = {**params, "blocks": {**params["blocks"], 1: {
      **params["blocks"][1], "attn": {**params["blocks"][1]["attn"], "wq_DNH": wq}}}}
  imported.write_imported(broken, loaded, nan_params, step=import_workdir.IMPORTED_STEP,
                          meta={"imported_from": hf_dir})
  with open(RunDir(broken).config, "w") as f:
    f.write(open(RunDir(workdir).config).read())
  with pytest.raises(checkpoints.NonFiniteParamsError) as e:
    checkpointed.restore_params(open_readonly(broken, loaded))
  assert str(e.value) == (
      f"checkpoint step 1 ({broken}/checkpoints/1): parameter params/blocks/1/attn/wq_DNH "
      f"holds 2 non-finite values (NaN or inf) of {wq.size}; a model of them computes NaN; "
      f"no other step has a checkpoint")
  assert (checkpointed.restore_params(open_readonly(workdir, loaded))[0]
          == import_workdir.IMPORTED_STEP)


@pytest.mark.integration
def test_launch_scripts_on_an_imported_workdir(tiny_hf, tmp_path):
  """import_hf, analyze with the causal ablation, score, generate and export_hf end to end;
  the re-export is the export it came from, byte for byte."""
  hf_dir, config, _ = tiny_hf
  workdir = str(tmp_path / "wd")
  flags = [f"--config.{k}={v}" for k, v in ANALYSIS.items()]
  proc = _run("import_hf.py", f"--hf={hf_dir}", f"--out={workdir}", *flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "bit for bit" in proc.stdout
  proc = _run("analyze.py", f"--workdir={workdir}", "--lengths=1", "--ablate=local")
  assert proc.returncode == 0, proc.stderr[-3000:]
  step_dir = RunDir(workdir).analysis_dir(import_workdir.IMPORTED_STEP)
  ablation = json.load(open(os.path.join(step_dir, run_dir.ABLATION_FILE.format(
      seq_len=ANALYSIS["data.seq_len"]))))
  assert [g["layer"] for g in ablation["global_layers"]] == [1]  # The NoPE layer, read out.
  assert all(np.isfinite(ablation["summary"][c]["logit_gap"]) for c in ablation["conditions"])
  (tmp_path / "text.txt").write_text("def f(x):\n    return x\n" * 8)
  proc = _run("score.py", f"--workdir={workdir}", str(tmp_path / "text.txt"))
  assert proc.returncode == 0 and "bits / byte" in proc.stdout, proc.stderr[-3000:]
  proc = _run("generate.py", f"--workdir={workdir}", "--prompt=def ", "--max_new_tokens=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _run("export_hf.py", f"--workdir={workdir}", f"--out={tmp_path / 'again'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in os.listdir(hf_dir):
    assert (tmp_path / "again" / name).read_bytes() == open(os.path.join(hf_dir, name),
                                                            "rb").read(), name
  proc = _run("import_hf.py", f"--hf={hf_dir}", f"--out={workdir}")
  assert proc.returncode == USAGE_EXIT_CODE
  assert proc.stderr.strip().splitlines()[-1].startswith(f"import_hf.py: --out={workdir} exists")


@pytest.mark.integration
def test_a_foreign_tokenizers_text_set_prepared_and_analysed(tmp_path):
  """A model with its own tokenizer: .txt files prepared into eval.path with the carried
  tokenizer (textbook_chapters), then analyze and score; eval data of another vocabulary is
  refused naming both files."""
  from hybrid_nope.data.sources import textbook_chapters
  smollm3_3b_like(str(tmp_path / "hf"))
  foreign_tokenizer(str(tmp_path / "hf" / "tokenizer.json"), size=300)
  texts = tmp_path / "texts"
  texts.mkdir()
  rng = np.random.default_rng(0)
  for i in range(6):
    (texts / f"{i}.txt").write_text(" ".join(f"w{j}" for j in rng.integers(1, 299, 120)))
  workdir = str(tmp_path / "wd")
  import_workdir.import_hf(str(tmp_path / "hf"), workdir, joined_config())
  carried = checkpoints.tokenizer_path(workdir)
  eval_path = textbook_chapters.prepare(str(texts), str(tmp_path / "tfds"), tokenizer=carried)
  overrides = {"eval.path": eval_path, "metrics.probe_pool_rows": 4}
  analysis = report.analyze(open_readonly(workdir), seq_len=64, lengths=(), figures=False,
                            overrides=overrides)["analysis"]
  nope = [r for r in analysis["records"] if r["layer"] == 3 and r["module"] == "pre_mixer_norm"]
  assert nope and np.all(np.isfinite(nope[0]["logit_gap"]))
  other = foreign_tokenizer(str(tmp_path / "other.json"), size=200)
  other_path = textbook_chapters.prepare(str(texts), str(tmp_path / "tfds2"), tokenizer=other)
  with pytest.raises(checkpoints.DataPathError, match="whose vocabulary is not the model's"):
    report.analyze(open_readonly(workdir), seq_len=64, lengths=(), figures=False,
                   overrides={**overrides, "eval.path": other_path})
