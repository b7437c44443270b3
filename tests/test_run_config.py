"""The config in force: config.json as started, or the last config the history records."""
import json
import os

import pytest

from hybrid_nope.run import run_config, run_dir
from hybrid_nope.errors import ConfigError, UserError
from hybrid_nope.train import loop
from hybrid_nope.validate import validate
from hybrid_nope.run.reader import open_readonly
from tests.helpers import tiny_config


def test_the_last_recorded_config_is_in_force_and_config_json_otherwise(tmp_path):
  started = {"data": {"batch_size": 2}}
  assert run_config.current(str(tmp_path), started) == started
  events = [{"step": 0, "event": "start", "config": started},
            {"step": 8, "event": "config_change", "config": {"data": {"batch_size": 4}}},
            {"step": 8, "event": "rollback"}]
  (tmp_path / run_dir.CONFIG_HISTORY).write_text("".join(json.dumps(e) + "\n" for e in events))
  assert run_config.history(str(tmp_path)) == events
  assert run_config.current(str(tmp_path), started) == {"data": {"batch_size": 4}}


def test_a_typo_in_allow_changes_fails_at_a_fresh_start_and_its_hint_then_starts(tmp_path):
  # Issue 38 case 3: the typo was accepted at the first launch and refused at the relaunch
  # after a preemption. Now the fresh start refuses it before anything is built or written.
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"train.allow_changes names 'data.batchsize', which "
                     r"is no config key: did you mean data.batch_size\?"):
    loop.train(tiny_config(train__allow_changes=("data.batchsize",)), str(workdir))
  assert not workdir.exists() or not os.listdir(workdir)
  with pytest.raises(ConfigError, match="train.allow_changes names 'eval.every_steps', which a "
                     "resume may change anyway"):
    validate(tiny_config(train__allow_changes=("train.steps,eval.every_steps",)))
  validate(tiny_config(train__allow_changes=("data.batch_size",)))  # The hint, followed.


def _history_with_a_bad_line(workdir, bad):
  events = [{"step": 0, "event": "start", "config": {"data": {"batch_size": 2}}},
            {"step": 8, "event": "rollback"}]
  lines = [json.dumps(events[0]), bad, json.dumps(events[1])]
  (workdir / run_dir.CONFIG_HISTORY).write_text("\n".join(lines) + "\n")
  return lines


@pytest.mark.parametrize("bad", ['{"step": 4, "event": broken', "[1, 2]"])
def test_a_bad_config_history_line_fails_in_one_line_naming_the_file_for_every_reader(
    tmp_path, bad):
  # Issue 38 case 6: a JSONDecodeError traceback in train and report, naming no file. Every
  # reader (train's resume.record, the report, analysis through current) goes through history.
  from hybrid_nope.analysis.present import html_throughput
  from hybrid_nope.errors import UserError
  from hybrid_nope.run import resume

  class Writer:
    active = True

  lines = _history_with_a_bad_line(tmp_path, bad)
  (tmp_path / run_dir.CONFIG).write_text(tiny_config().to_json())
  where = rf"^{tmp_path / run_dir.CONFIG_HISTORY} line 2 is not a JSON object .*: fix or remove"
  readers = [lambda: run_config.current(str(tmp_path), {}),
             lambda: resume.record(str(tmp_path), tiny_config(), [], Writer()),
             lambda: html_throughput.config_html(open_readonly(str(tmp_path)),
                                                 {"data": {"batch_size": 2}})]
  for read in readers:
    with pytest.raises(UserError, match=where) as refused:
      read()
    assert "\n" not in str(refused.value)
  # The advice, followed: with the line removed every reader reads the file.
  (tmp_path / run_dir.CONFIG_HISTORY).write_text(lines[0] + "\n" + lines[2] + "\n")
  for read in readers:
    read()
  assert [e["event"] for e in run_config.history(str(tmp_path))] == ["start", "rollback"]


def write_run(workdir, config_json: bool = True, history: bool = True):
  started = json.loads(tiny_config().to_json_best_effort())
  if config_json:
    (workdir / run_dir.CONFIG).write_text(json.dumps(started))
  if history:
    (workdir / run_dir.CONFIG_HISTORY).write_text(json.dumps(
        {"step": 0, "event": "start", "batch_size": 2, "config": started}) + "\n")
  return started


LINEAGE = [{"step": 0, "event": "start", "batch_size": 2, "time": "t0"},
           {"step": 8, "event": "config_change", "batch_size": 4, "time": "t1",
            "changes": {"data.batch_size": {"from": 2, "to": 4}}}]


def test_a_missing_config_json_is_rebuilt_from_the_start_event(tmp_path):
  started = write_run(tmp_path, config_json=False)
  (note,) = run_config.rebuild_missing(str(tmp_path), LINEAGE, 8)
  assert "config.json was missing: rebuilt from" in note
  assert json.loads((tmp_path / run_dir.CONFIG).read_text()) == started


def test_a_missing_history_is_rebuilt_from_the_lineage_with_each_changes_config(tmp_path):
  started = write_run(tmp_path, history=False)
  (note,) = run_config.rebuild_missing(str(tmp_path), LINEAGE, 8)
  assert "rebuilt from checkpoint step 8's meta (2 events" in note
  events = run_config.history(str(tmp_path))
  assert [e["event"] for e in events] == ["start", "config_change"]
  assert events[0]["config"] == started and events[1]["config"]["data"]["batch_size"] == 4
  assert run_config.current(str(tmp_path), started)["data"]["batch_size"] == 4
  assert run_config.rebuild_missing(str(tmp_path), LINEAGE, 8) == []  # Nothing missing now.


def test_config_json_with_no_start_event_to_rebuild_it_from_is_refused_until_put_back(tmp_path):
  started = write_run(tmp_path, config_json=False, history=False)
  with pytest.raises(UserError, match=r"config.json is missing and .*config_history.jsonl "
                     r"holds no start config .*: put the run's config.json back"):
    run_config.rebuild_missing(str(tmp_path), LINEAGE, 8)
  assert not (tmp_path / run_dir.CONFIG).exists()  # Nothing written from the command line.
  (tmp_path / run_dir.CONFIG).write_text(json.dumps(started))  # The advice, followed.
  (note,) = run_config.rebuild_missing(str(tmp_path), LINEAGE, 8)
  assert "config_history.jsonl was missing" in note
