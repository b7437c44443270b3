"""The config in force: config.json as started, or the last config the history records."""
import json

from hybrid_nope import run_config, run_dir


def test_the_last_recorded_config_is_in_force_and_config_json_otherwise(tmp_path):
  started = {"data": {"batch_size": 2}}
  assert run_config.current(str(tmp_path), started) == started
  events = [{"step": 0, "event": "start", "config": started},
            {"step": 8, "event": "config_change", "config": {"data": {"batch_size": 4}}},
            {"step": 8, "event": "rollback"}]
  (tmp_path / run_dir.CONFIG_HISTORY).write_text("".join(json.dumps(e) + "\n" for e in events))
  assert run_config.history(str(tmp_path)) == events
  assert run_config.current(str(tmp_path), started) == {"data": {"batch_size": 4}}
