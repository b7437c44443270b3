"""The report's throughput, MFU and config section."""
import json
import statistics

import ml_collections

from hybrid_nope.analysis.present import html_throughput
from hybrid_nope.run.reader import open_readonly


def _progress(values):
  return [{"step": 10 * (i + 1), "tokens_per_second": t, "seconds_per_step": 4096 / t,
           "mfu": t / 1e5, "memory_bytes": m} for i, (t, m) in enumerate(values)]


def test_median_best_and_last_of_the_progress_records():
  values = [(900.0, 3e9), (5000.0, 3.2e9), (5200.0, 3.1e9), (4800.0, 3.1e9)]
  metrics = [{"step": 1, "loss": 3.0}] + _progress(values) + [{"step": 40, "eval_loss": 2.0}]
  found = html_throughput.throughput(metrics)
  tokens = [t for t, _ in values]
  assert found["intervals"] == 4 and found["last_step"] == 40
  assert found["median"]["tokens_per_second"] == statistics.median(tokens)
  assert found["median"]["seconds_per_step"] == statistics.median(4096 / t for t in tokens)
  assert found["best"]["tokens_per_second"] == 5200 and found["best"]["mfu"] == 0.052
  assert found["best"]["seconds_per_step"] == 4096 / 5200
  assert found["best"]["memory_bytes"] == 3.2e9  # The peak.
  assert found["last"]["tokens_per_second"] == 4800
  assert html_throughput.throughput([{"step": 1, "loss": 3.0}]) is None


def test_no_progress_record_is_said():
  text = html_throughput.throughput_html([{"step": 1, "loss": 3.0}], None)
  assert "not recorded: throughput" in text


def _config(**model):
  return ml_collections.ConfigDict({
      "model": {"pattern": "SG", "window": 64, "remat": False, **model},
      "data": {"batch_size": 4, "seq_len": 1024, "domains": ("a@1",)},
      "train": {"seed": 0, "steps": 640, "learning_rate": 3e-3, "warmup_steps": 64,
                "min_learning_rate_ratio": 0.1, "log_every_steps": 10},
      "eval": {"every_steps": 64}})


def test_the_config_shows_the_run_defining_keys_and_its_changes(tmp_path):
  text = html_throughput.config_html(open_readonly(str(tmp_path)), _config())
  assert "<td>model.pattern</td><td>SG</td>" in text
  assert "model.remat" not in text and "eval.every_steps" not in text  # Free to change.
  assert "train.log_every_steps" not in text and "data.domains" not in text
  assert "unchanged since the start" in text
  events = [{"step": 0, "event": "start", "batch_size": 4},
            {"step": 320, "event": "config_change", "batch_size": 8,
             "changes": {"data.batch_size": {"from": 4, "to": 8}},
             "config": _config().to_dict()},
            {"step": 400, "event": "rollback", "from_step": 480}]
  (tmp_path / "config_history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
  text = html_throughput.config_html(open_readonly(str(tmp_path)), _config())
  assert "2 later events of config_history.jsonl: step 320: config change; data.batch_size 4 " \
         "→ 8 | step 400: rollback" in text
  assert "not recorded: config.json" in html_throughput.config_html(
      open_readonly(str(tmp_path)), None)
