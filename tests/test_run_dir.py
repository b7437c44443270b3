# Tiers (pytest.ini): test_every_file_of_a_trained_and_analysed_run_is_one_the_layout_names trains
# and analyses a run end to end, so it is integration, `make test-all` only.
# test-all only: every file a trained, sampled, profiled and analysed run writes is one the layout
# names (test_every_file_of_a_trained_and_analysed_run_is_one_the_layout_names; the paths
# themselves are checked here in `make test`).
"""The run-directory layout: paths on a local path and on URLs, `describe`, and a real tiny run
whose every file is one the layout names."""
import importlib.util
import os
import pathlib

import pytest

from hybrid_nope.run import run_dir, storage
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.reader import open_readonly

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_a_local_run_directory_names_its_files_under_the_root(tmp_path):
  root = str(tmp_path / "run")
  rd = RunDir(root)
  at = lambda *names: os.path.join(root, *names)
  # The names the contracts (DESIGN.md) and the packed records of past runs rely on.
  assert (rd.config, rd.config_history, rd.metrics) == (
      at("config.json"), at("config_history.jsonl"), at("metrics.jsonl"))
  assert (rd.recency, rd.recency_probe) == (at("recency.jsonl"), at("recency_probe.json"))
  assert rd.recency_sums_file(120) == at("recency_sums", "step_00000120.npz")
  assert (rd.lock, rd.tensorboard, rd.profile, rd.wandb_id) == (
      at("trainer.lock"), at("tensorboard"), at("profile"), at("wandb_run_id.txt"))
  assert rd.checkpoints == at("checkpoints")
  assert rd.checkpoint_state(8) == at("checkpoints", "8", "state")
  assert rd.checkpoint_meta(8) == at("checkpoints", "8", "meta")
  assert rd.checkpoint_owner == at("checkpoints", "owner.json")
  assert rd.rolled_back_now(12, when=0) == at("checkpoints", "rolled_back",
                                               "19700101T000000_from_12")
  assert rd.overwritten_now(when=0) == at("overwritten", "19700101T000000")
  assert rd.analysis_dir(8) == at("analysis", "step_8")
  assert (rd.sweep_log, rd.sweep_done) == (at("sweep.log"), at("sweep_done.json"))


def test_a_relative_root_gives_absolute_checkpoints_inside_it(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert RunDir("run").metrics == os.path.join("run", "metrics.jsonl")
  assert RunDir("run").checkpoints == str(tmp_path / "run" / "checkpoints")  # orbax: absolute.


@pytest.mark.parametrize("configured, expected", [
    ("", "{root}/checkpoints"),
    ("ckpt", "{root}/ckpt"),  # Relative: inside the workdir, wherever the command runs.
    ("/elsewhere/ckpt", "/elsewhere/ckpt"),
    ("file:///elsewhere/ckpt", "/elsewhere/ckpt"),  # The local path orbax wants.
    ("gs://bucket/ckpt", "gs://bucket/ckpt"),
])
def test_checkpoint_directory_overrides_are_honoured(tmp_path, configured, expected):
  root = str(tmp_path / "run")
  assert RunDir(root, configured).checkpoints == expected.format(root=root)


def test_url_roots_join_with_slashes_and_their_files_go_through_storage():
  rd = RunDir("memory://run_dir_test/run/")
  assert rd.metrics == "memory://run_dir_test/run/metrics.jsonl"
  assert rd.recency_sums_file(3) == "memory://run_dir_test/run/recency_sums/step_00000003.npz"
  assert rd.checkpoint(4) == "memory://run_dir_test/run/checkpoints/4"
  assert RunDir("gs://bucket/run").rolled_back == "gs://bucket/run/checkpoints/rolled_back"
  assert RunDir("file:///tmp/run").checkpoints == "/tmp/run/checkpoints"
  storage.write_text(rd.metrics, '{"step": 0, "loss": 1.0}\n')
  assert storage.read_jsonl(rd.metrics) == [{"step": 0, "loss": 1.0}]
  for name in ("step_12", "step_8", "step_x", "notes"):
    storage.write_text(storage.join(rd.analysis, name, run_dir.EXTRAPOLATION_FILE), "{}")
  assert rd.analysis_steps() == [8, 12]
  assert RunDir("memory://run_dir_test/none").analysis_steps() == []


@pytest.mark.parametrize("path, entry", [
    ("metrics.jsonl", "metrics"), ("recency_sums/step_00000008.npz", "recency_sums"),
    ("recency_sums", "recency_sums"), ("checkpoints", "checkpoints"),
    ("checkpoints/8/state/_METADATA", "checkpoints"),
    ("checkpoints/owner.json", "checkpoint_owner"),
    ("checkpoints/rolled_back/19700101T000000_from_12/8/meta/metadata", "rolled_back"),
    ("tensorboard/events.out.tfevents.1.host", "tensorboard"),
    ("analysis/step_8/profiles_T64.png", "analysis"),
    ("overwritten/t/metrics.jsonl", "overwritten"),
    ("wandb/debug.log", "wandb"), ("trainer.lock", "lock"),
    ("notes.txt", None), ("recency_sums/other.npz", None), ("analysis/x.json", None),
    ("metrics.jsonl/x", None),
])
def test_describe_names_the_entry_a_path_lies_in(tmp_path, path, entry):
  rd = RunDir(str(tmp_path))
  assert rd.describe(path) == entry
  assert rd.describe(str(tmp_path / path)) == entry  # A full path inside the root, too.


def test_describe_reads_urls_and_knows_where_the_checkpoints_went(tmp_path):
  assert RunDir("gs://b/run").describe("gs://b/run/recency.jsonl") == "recency"
  assert RunDir("gs://b/run").describe("gs://b/other/recency.jsonl") is None
  moved = RunDir(str(tmp_path), "ckpt")
  assert moved.describe("ckpt/8/state/x") == "checkpoints"
  assert moved.describe("checkpoints/8/state/x") is None
  assert RunDir(str(tmp_path), "/elsewhere").describe("checkpoints/8") is None


def test_a_link_inside_the_root_is_named_where_it_lies_and_a_linked_root_is_the_root(tmp_path):
  # wandb links its logs to files outside the run; the run's own folder may be reached by a link.
  outside = tmp_path / "outside.log"
  outside.write_text("x")
  root = tmp_path / "run"
  (root / "wandb" / "offline-run" / "logs").mkdir(parents=True)
  link = root / "wandb" / "offline-run" / "logs" / "debug-core.log"
  link.symlink_to(outside)
  assert RunDir(str(root)).describe(str(link)) == "wandb"
  (tmp_path / "run_link").symlink_to(root)
  assert RunDir(str(tmp_path / "run_link")).describe(str(link)) == "wandb"
  assert RunDir(str(root)).relative(str(tmp_path / "run_link")) == ""
  assert RunDir(str(root)).relative(str(outside)) is None


def _tree(text: str) -> str:
  """The layout tree: from the line starting WORKDIR/ to its last └── line."""
  lines = text.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith("WORKDIR/"))
  end = next(i for i in range(start, len(lines)) if lines[i].startswith("└──"))
  return "\n".join(lines[start:end + 1])


def test_the_docstring_tree_names_every_entry_and_the_architecture_doc_copies_it():
  tree = _tree(run_dir.__doc__)
  for entry, pattern in RunDir("/r").entries():
    assert pattern.split("/")[0] in tree, entry
  assert tree in (REPO / "docs" / "architecture.md").read_text()


@pytest.mark.long
@pytest.mark.integration
def test_every_file_of_a_trained_and_analysed_run_is_one_the_layout_names(tmp_path,
                                                                           monkeypatch):
  from hybrid_nope.analysis.checkpoint import report
  from hybrid_nope.analysis.measure.hook import RecencyHook
  from hybrid_nope.train import loop
  from tests.helpers import tiny_config

  overrides = dict(eval__sample_every_steps=4, eval__sample_prompts=("def ",),
                   eval__sample_max_new_tokens=4, train__profile_start_step=2,
                   train__profile_steps=1)
  if importlib.util.find_spec("wandb") is not None:  # W&B offline, its files in the workdir.
    monkeypatch.delenv("WANDB_DIR", raising=False)
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": tmp_path / "wandb_config",
                       "WANDB_CACHE_DIR": tmp_path / "wandb_cache",
                       "WANDB_DATA_DIR": tmp_path / "wandb_data"}.items():
      monkeypatch.setenv(key, str(value))
    overrides["logging__wandb_project"] = "run_dir_test"
  workdir = str(tmp_path / "run")
  loop.train(tiny_config(**overrides), workdir, hooks=[RecencyHook.for_run])
  report.analyze(open_readonly(workdir), step=8, lengths=(1,), init_seeds=2, figures=False)

  rd = RunDir(workdir)
  found = {}
  for where, _, files in os.walk(workdir):
    for name in files:
      path = os.path.join(where, name)
      found[os.path.relpath(path, workdir)] = rd.describe(path)
  unnamed = sorted(p for p, entry in found.items() if entry is None)
  assert not unnamed, f"files the layout (hybrid_nope/run/run_dir.py) does not name: {unnamed}"
  expected = {"config", "config_history", "metrics", "recency", "recency_probe", "recency_sums",
              "tensorboard", "profile", "checkpoints", "analysis"}
  if "logging__wandb_project" in overrides:
    expected |= {"wandb_id", "wandb"}
  assert expected <= set(found.values())
  assert os.path.exists(rd.checkpoint_meta(8)) and os.path.exists(rd.recency_sums_file(0))
  assert os.path.exists(os.path.join(rd.analysis_dir(8), run_dir.EXTRAPOLATION_FILE))
  assert not os.path.exists(rd.lock)  # Released at the end of the run.


def test_number_in_reads_back_the_number_a_template_wrote_and_nothing_else():
  for template, value in ((run_dir.ABLATION_FILE, 1024), (run_dir.ANALYSIS_STEP, 640),
                          (run_dir.ANALYSIS_FILE, 8)):
    name = template.format(**{k: value for k in ("seq_len", "step")})
    assert run_dir.number_in(template, name) == value
  for name in ("ablation_T.json", "ablation_T12.json.tmp", "xablation_T12.json",
               "ablation_Tabc.json"):
    assert run_dir.number_in(run_dir.ABLATION_FILE, name) is None
