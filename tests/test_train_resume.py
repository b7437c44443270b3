# Tiers (pytest.ini): every test here but the fresh-start refusal of skip_batches needs a run
# trained end to end (the `trained` fixture) or trains again on a copy of it, and one runs
# launch/train.py in a subprocess, so they are integration, `make test-all` only.
# test-all only: a resume that would change the run is refused naming each key, before anything
# is written (test_a_resume_that_would_change_the_run_is_refused_naming_each_key); implementation
# and eval keys change freely (test_implementation_and_eval_keys_change_freely); lowering
# train.steps warns and raising it needs the opt-in
# (test_lowering_train_steps_warns_and_raising_it_needs_the_opt_in); a relaunch that changes
# model.window is refused by launch/train.py in one line with exit code 2
# (test_swa256_to_swa512_relaunch_is_refused_on_the_command_line); an allowed batch change is
# recorded and reads on from the exact row
# (test_an_allowed_batch_change_is_recorded_and_reads_on_from_the_exact_row); a fresh start over
# a run's records is refused unless train.overwrite, which moves them aside
# (test_a_fresh_start_over_a_runs_records_refuses_unless_overwrite); a relative
# checkpoint.directory is found from another working directory
# (test_a_relative_checkpoint_directory_run_from_elsewhere_finds_its_checkpoints); restore_step
# rolls back once and skip_batches skips once
# (test_restore_step_rolls_back_once_and_skip_batches_skips_once). The run-identity rules
# themselves are checked in `make test` by test_train_run_identity.py.
"""A run stays one run: what a resume refuses, allows and records; fresh starts, rollbacks and
skips that happen once. End to end on the tiny config; refusals come before anything compiles."""
import json
import logging
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from hybrid_nope.run import checkpoints
from hybrid_nope.run import run_dir
from hybrid_nope.data.pipeline import loader
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.train import loop
from hybrid_nope.run import resume
from hybrid_nope.run.checkpoint import Checkpointer
from hybrid_nope.run.run_identity import RunChangedError, rows_consumed
from tests.helpers import REPO, take, tiny_config, tiny_flags


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f]


def history(workdir):
  with open(RunDir(str(workdir)).config_history) as f:
    return [json.loads(l) for l in f]


def meta(workdir, step):
  return Checkpointer(str(workdir), keep=100).read_meta(step)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny run trained to step 8 (checkpoints 4 and 8)."""
  workdir = tmp_path_factory.mktemp("trained")
  loop.train(tiny_config(), str(workdir))
  return workdir


@pytest.fixture
def run_copy(trained, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  return workdir


@pytest.mark.parametrize("override,listed", [
    (dict(model__pattern="GS"), 'model.pattern: "SG" -> "GS"'),
    (dict(model__window=8), "model.window: 4 -> 8"),
    (dict(model__swa_pos="nope"), 'model.swa_pos: "rope" -> "nope"'),
    (dict(data__batch_size=4), "data.batch_size: 2 -> 4"),
    (dict(model__d_model=64, model__tie_embeddings=False),
     "model.d_model: 32 -> 64; model.tie_embeddings: true -> false"),
    (dict(train__seed=3), "train.seed: 0 -> 3"),
    (dict(train__learning_rate=1e-2), "train.learning_rate: 0.003 -> 0.01"),
    (dict(train__steps=12), "train.steps: 8 -> 12"),
    (dict(train__schedule="wsd"), 'train.schedule: "cosine" -> "wsd"'),
    (dict(train__z_loss=1e-4), "train.z_loss: 0.0 -> 0.0001"),
    (dict(model__param_dtype="bfloat16"), 'model.param_dtype: "float32" -> "bfloat16"'),
])
@pytest.mark.integration
def test_a_resume_that_would_change_the_run_is_refused_naming_each_key(run_copy, override,
                                                                      listed):
  before = sorted(os.listdir(run_copy))
  config_json = (run_copy / "config.json").read_text()
  with pytest.raises(RunChangedError, match=r"checkpoints/8 \(step 8\) was trained under "
                     rf"another config: {listed}\. .*--config\.train\.allow_changes="):
    loop.train(tiny_config(**override), str(run_copy))
  assert sorted(os.listdir(run_copy)) == before  # Refused before anything was written.
  assert (run_copy / "config.json").read_text() == config_json


@pytest.mark.integration
def test_implementation_and_eval_keys_change_freely(run_copy):
  summary = loop.train(tiny_config(model__attention_impl="xla", eval__every_steps=2,
                                   checkpoint__keep=50), str(run_copy))
  assert summary["step"] == 8


@pytest.mark.integration
def test_swa256_to_swa512_relaunch_is_refused_on_the_command_line(tmp_path):
  loop.train(tiny_config(model__window=256, train__steps=4), str(tmp_path))
  proc = subprocess.run([sys.executable, "launch/train.py", "--config=configs/demo.py",
                         f"--workdir={tmp_path}",
                         *tiny_flags(model__window=512, train__steps=4)],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("train.py: ") and "model.window: 256 -> 512" in line, line
  assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_an_allowed_batch_change_is_recorded_and_reads_on_from_the_exact_row(run_copy, caplog):
  config_json = (run_copy / "config.json").read_text()
  changed = tiny_config(data__batch_size=4, train__steps=10, checkpoint__every_steps=2,
                        train__allow_changes=("data.batch_size", "train.steps"))
  with caplog.at_level(logging.INFO, logger="absl"):
    loop.train(changed, str(run_copy))
  assert "at step 8 (16 training rows read)" in caplog.text
  # Steps 1-8 read rows 0-15 at batch 2; steps 9-10 rows 16-23 at batch 4.
  assert meta(run_copy, 10)["data_position"] == {"rows": 24}
  assert rows_consumed(meta(run_copy, 10)["history"], 10) == 24
  assert (run_copy / "config.json").read_text() == config_json  # Never rewritten.
  events = history(run_copy)
  assert [e["event"] for e in events] == ["start", "config_change"]
  assert events[1]["changes"] == {"data.batch_size": {"from": 2, "to": 4},
                                  "train.steps": {"from": 8, "to": 10}}
  assert events[1]["config"]["data"]["batch_size"] == 4
  assert checkpoints.load_config(str(run_copy)).data.batch_size == 4  # What analysis reads.
  recorded = [r for r in metrics(run_copy) if r.get("event") == "config_change"]
  assert len(recorded) == 1 and recorded[0]["step"] == 8
  # The rows a batch-4 step 9 reads are the batch-2 stream's batches 8 and 9.
  stream = take(loader.train_iterator(tiny_config()), 10)
  resumed = next(loader.train_iterator(tiny_config(data__batch_size=4), start_row=16))
  np.testing.assert_array_equal(resumed["inputs"],
                                np.concatenate([stream[8]["inputs"], stream[9]["inputs"]]))
  # A rerun of the same command resumes the new run as it is, and records nothing twice.
  loop.train(changed, str(run_copy))
  assert len(history(run_copy)) == 2


@pytest.mark.integration
def test_lowering_train_steps_warns_and_raising_it_needs_the_opt_in(run_copy, caplog):
  with caplog.at_level(logging.WARNING, logger="absl"):
    summary = loop.train(tiny_config(train__steps=6), str(run_copy))
  assert summary["step"] == 8 and "train.steps lowered from 8 to 6" in caplog.text
  assert "nothing to train" in caplog.text
  (change,) = [e for e in history(run_copy) if e["event"] == "config_change"]
  assert change["changes"] == {"train.steps": {"from": 8, "to": 6}}  # What analysis reads.
  assert checkpoints.load_config(str(run_copy)).train.steps == 6


@pytest.mark.integration
def test_a_fresh_start_over_a_runs_records_refuses_unless_overwrite(run_copy, caplog):
  shutil.move(run_copy / "checkpoints", run_copy.parent / "moved_checkpoints")
  lines = (run_copy / "metrics.jsonl").read_text()
  with pytest.raises(resume.WorkdirInUseError, match=r"holds a run's records \(metrics.jsonl"
                     r"\) but no checkpoint .*--config.train.overwrite=True"):
    loop.train(tiny_config(), str(run_copy))
  assert (run_copy / "metrics.jsonl").read_text() == lines
  with caplog.at_level(logging.WARNING, logger="absl"):
    loop.train(tiny_config(train__steps=4, train__overwrite=True), str(run_copy))
  assert "moved the records" in caplog.text
  (aside,) = os.listdir(run_copy / run_dir.OVERWRITTEN)
  assert (run_copy / run_dir.OVERWRITTEN / aside / "metrics.jsonl").read_text() == lines
  assert max(r["step"] for r in metrics(run_copy)) == 4  # The new run's own records.


@pytest.mark.integration
def test_a_relative_checkpoint_directory_run_from_elsewhere_finds_its_checkpoints(
    tmp_path, monkeypatch, caplog):
  config = tiny_config(train__steps=4, checkpoint__directory="ckpts")
  monkeypatch.chdir(tmp_path)
  loop.train(config, str(tmp_path / "run"))
  assert sorted(os.listdir(tmp_path / "run" / "ckpts")) == ["4", run_dir.CHECKPOINT_OWNER]
  monkeypatch.chdir("/")
  with caplog.at_level(logging.INFO, logger="absl"):
    assert loop.train(config, str(tmp_path / "run"))["step"] == 4  # Found: nothing to train.
  assert "resumed from " + str(tmp_path / "run" / "ckpts") in caplog.text


@pytest.mark.integration
def test_restore_step_rolls_back_once_and_skip_batches_skips_once(run_copy, caplog):
  reference = {r["step"]: r["loss"] for r in metrics(run_copy) if "loss" in r}
  rollback = tiny_config(checkpoint__restore_step=4)
  loop.train(rollback, str(run_copy))
  (moved,) = os.listdir(run_copy / "checkpoints" / "rolled_back")
  assert os.listdir(run_copy / "checkpoints" / "rolled_back" / moved) == ["8"]
  again = {r["step"]: r["loss"] for r in metrics(run_copy) if "loss" in r}
  assert again == reference  # Steps 5-8 trained again, identically.
  with caplog.at_level(logging.WARNING, logger="absl"):
    loop.train(rollback, str(run_copy))  # As a requeue reruns the command.
  assert "already rolled back to step 4" in caplog.text
  assert len(os.listdir(run_copy / "checkpoints" / "rolled_back")) == 1
  assert Checkpointer(str(run_copy), keep=100).all_steps() == [4, 8]
  skip = tiny_config(checkpoint__restore_step=4, data__skip_batches=2,
                     train__steps=10, train__allow_changes=("train.steps",))
  shutil.rmtree(run_copy / "checkpoints" / "8")  # A spike after 4: go back to it, skip 2.
  loop.train(skip, str(run_copy))
  # Rows: 4 steps x 2, 2 skipped batches x 2, 6 steps x 2.
  assert meta(run_copy, 10)["data_position"] == {"rows": 24}
  assert [r["skipped_rows"] for r in metrics(run_copy) if r.get("event") == "skip_batches"] == [4]
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="absl"):
    loop.train(skip, str(run_copy))
  assert "applied earlier in this run: not skipping again" in caplog.text
  assert meta(run_copy, 10)["data_position"] == {"rows": 24}


def test_skip_batches_at_a_fresh_start_is_refused(tmp_path):
  with pytest.raises(Exception, match="data.skip_batches=2 is invalid here"):
    loop.train(tiny_config(data__skip_batches=2), str(tmp_path))


def _died_before_its_first_save(workdir, config):
  """What a run killed before its first checkpoint leaves: its start on record, a metric."""
  ckpt = Checkpointer(str(workdir), keep=3)
  start = resume.plan(config, str(workdir), ckpt)
  ckpt.close()
  resume.record(str(workdir), config, start.new_events,
                types.SimpleNamespace(active=True, write_record=lambda *a: None))
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": 0, "unigram_entropy": 5.0}) + "\n")
  return start.history[0]["run_id"]


def _plan(workdir, config):
  ckpt = Checkpointer(str(workdir), keep=3)
  try:
    return resume.plan(config, str(workdir), ckpt)
  finally:
    ckpt.close()


def test_a_run_killed_before_its_first_save_is_moved_aside_and_started_afresh(tmp_path,
                                                                              caplog):
  workdir = tmp_path / "run"
  run_id = _died_before_its_first_save(workdir, tiny_config())
  with caplog.at_level(logging.WARNING, logger="absl"):
    again = _plan(workdir, tiny_config())  # The same command, as a requeue reruns it.
  assert again.step is None and again.history[0]["run_id"] == run_id
  (line,) = [r.getMessage() for r in caplog.records if "stopped before" in r.getMessage()]
  assert f"run {run_id}" in line and "moved its records to" in line
  (aside,) = os.listdir(workdir / run_dir.OVERWRITTEN)
  kept = sorted(os.listdir(workdir / run_dir.OVERWRITTEN / aside))
  assert kept == ["config.json", "config_history.jsonl", "metrics.jsonl"]
  assert not (workdir / "metrics.jsonl").exists()
  assert os.listdir(workdir / "checkpoints") == [run_dir.CHECKPOINT_OWNER]  # Kept, not moved.


@pytest.mark.parametrize("change,refusal", [
    ("another run", r"they are run .*'s, not run .*'s \(the checkpoint directory's\)"),
    ("another config", r"they are of run .* under another config \(model.window: 4 -> 8\)"),
    ("no run id", "config_history.jsonl names no run id"),
])
def test_records_of_another_run_without_a_checkpoint_still_refuse(tmp_path, change, refusal):
  workdir = tmp_path / "run"
  _died_before_its_first_save(workdir, tiny_config())
  config = tiny_config()
  if change == "another run":  # Its checkpoint directory is gone, a new one has a new id.
    shutil.rmtree(workdir / "checkpoints")
  elif change == "another config":
    config = tiny_config(model__window=8)
  else:  # Records from before run ids.
    lines = history(workdir)
    del lines[0]["run_id"]
    (workdir / run_dir.CONFIG_HISTORY).write_text("".join(json.dumps(l) + "\n" for l in lines))
  with pytest.raises(resume.WorkdirInUseError, match="holds a run's records .*, and " + refusal):
    _plan(workdir, config)
  assert (workdir / "metrics.jsonl").exists() and not (workdir / run_dir.OVERWRITTEN).exists()
  assert _plan(workdir, tiny_config(train__overwrite=True)).step is None  # The advice works.


BATCH_4 = dict(data__batch_size=4, train__steps=10, checkpoint__every_steps=2,
               train__allow_changes=("data.batch_size", "train.steps"))


@pytest.mark.integration
def test_a_missing_config_json_is_rebuilt_from_the_history_never_from_the_command_line(
    run_copy, caplog):
  # Issue 38 case 7: a deleted config.json was rewritten from this command (batch 4 for a run
  # that started at 2).
  loop.train(tiny_config(**BATCH_4), str(run_copy))
  started = json.loads((run_copy / "config.json").read_text())
  os.remove(run_copy / "config.json")
  with caplog.at_level(logging.WARNING, logger="absl"):
    loop.train(tiny_config(**BATCH_4), str(run_copy))
  assert "config.json was missing: rebuilt from" in caplog.text
  assert json.loads((run_copy / "config.json").read_text()) == started
  assert started["data"]["batch_size"] == 2


@pytest.mark.integration
def test_a_missing_config_history_is_rebuilt_from_the_checkpoints_meta(run_copy, caplog):
  # Issue 38 case 7: a deleted config_history.jsonl was not rebuilt, so analysis read the
  # batch size the run started with.
  loop.train(tiny_config(**BATCH_4), str(run_copy))
  recorded = history(run_copy)
  os.remove(RunDir(str(run_copy)).config_history)
  with caplog.at_level(logging.WARNING, logger="absl"):
    loop.train(tiny_config(**BATCH_4), str(run_copy))
  assert "config_history.jsonl was missing: rebuilt from checkpoint step 10's meta" in caplog.text
  rebuilt = history(run_copy)
  assert [e["event"] for e in rebuilt] == [e["event"] for e in recorded] == [
      "start", "config_change"]
  assert rebuilt[1]["changes"] == recorded[1]["changes"]
  assert checkpoints.load_config(str(run_copy)).data.batch_size == 4  # What analysis reads.
  loop.train(tiny_config(**BATCH_4), str(run_copy))  # A rerun records nothing twice.
  assert len(history(run_copy)) == 2


@pytest.mark.integration
def test_overwrite_where_checkpoints_exist_says_it_resumes_and_keeps_them(run_copy, caplog):
  # Issue 38 case 7: train.overwrite=True over checkpoints resumed without a word.
  with caplog.at_level(logging.WARNING, logger="absl"):
    summary = loop.train(tiny_config(train__overwrite=True), str(run_copy))
  assert summary["step"] == 8
  assert "train.overwrite=True: " in caplog.text and "so this resumes from step 8 and moves " \
      "nothing aside" in caplog.text
  assert Checkpointer(str(run_copy), keep=100).all_steps() == [4, 8]
  assert not (run_copy / run_dir.OVERWRITTEN).exists()


def test_an_overwrite_cut_halfway_is_finished_by_the_next_start(tmp_path, monkeypatch, caplog):
  # Issue 38 case 9: a kill in the middle of an overwrite's move left the old run's TensorBoard
  # events and recency sums in the workdir, where the new run wrote beside them.
  old = {"metrics.jsonl": '{"step": 1, "loss": 5.0}\n', "recency.jsonl": '{"step": 0}\n',
         "config.json": "{}\n", "config_history.jsonl": '{"step": 0, "event": "start"}\n',
         "tensorboard/events.out.tfevents.1": "old", "recency_sums/step_00000000.npz": "old"}
  for name, text in old.items():
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
  config = tiny_config(train__overwrite=True)
  order = ["metrics.jsonl", "recency.jsonl", "config.json", "config_history.jsonl",
           "tensorboard", "recency_sums"]
  listdir, move = resume.storage.listdir, resume.storage.move

  def cut(source, destination):
    if os.path.basename(source) == "tensorboard":
      raise KeyboardInterrupt  # A kill after the records had moved.
    move(source, destination)
  monkeypatch.setattr(resume.storage, "listdir", lambda path: sorted(
      listdir(path), key=lambda n: order.index(n) if n in order else -1))
  monkeypatch.setattr(resume.storage, "move", cut)
  with pytest.raises(KeyboardInterrupt):
    resume.plan(config, str(tmp_path), Checkpointer(str(tmp_path), keep=100))
  monkeypatch.setattr(resume.storage, "move", move)
  with caplog.at_level(logging.WARNING, logger="absl"):
    plan = resume.plan(config, str(tmp_path), Checkpointer(str(tmp_path), keep=100))
  assert plan.step is None and "was cut short: moved the rest there now" in caplog.text
  left = {n for n in os.listdir(tmp_path) if not n.startswith(".")}
  assert not left & {"tensorboard", "recency_sums", "metrics.jsonl"}, left
  (aside,) = os.listdir(tmp_path / run_dir.OVERWRITTEN)
  moved = tmp_path / run_dir.OVERWRITTEN / aside
  assert sorted(os.listdir(moved)) == sorted(order)  # One folder, the whole old run, no marker.
  assert (moved / "tensorboard" / "events.out.tfevents.1").read_text() == "old"
