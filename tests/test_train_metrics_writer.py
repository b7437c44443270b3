import json
import logging
import os

import pytest

from hybrid_nope.train.metrics_writer import MetricsWriter


def test_records_and_truncation_on_resume(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.close()
  # A run restored from step 3 drops what the lost run wrote after it.
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  writer.write(4, {"loss": 0.5})
  writer.close()
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.5)]


def write_steps(workdir, steps):
  writer = MetricsWriter(str(workdir))
  for step in steps:
    writer.write(step, {"loss": float(step)})
  writer.close()


def steps_in(path):
  return [json.loads(l)["step"] for l in open(path)]


def test_a_kill_during_the_resume_rewrite_leaves_the_history_whole(tmp_path, monkeypatch):
  write_steps(tmp_path, range(1, 6))
  before = (tmp_path / "metrics.jsonl").read_text()

  def killed(*args):  # The process dies after writing the new file, before renaming it.
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", killed)
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with pytest.raises(KeyboardInterrupt):
    writer.write(4, {"loss": 0.5})
  assert (tmp_path / "metrics.jsonl").read_text() == before
  monkeypatch.undo()
  writer = MetricsWriter(str(tmp_path), resume_step=3)  # The rerun then truncates as usual.
  writer.write(4, {"loss": 0.5})
  writer.close()
  assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]


def test_a_torn_last_line_is_dropped_with_a_warning_naming_the_file(tmp_path, caplog):
  write_steps(tmp_path, range(1, 4))
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "lo')  # killed mid-write
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with caplog.at_level(logging.WARNING):
    writer.write(4, {"loss": 0.25})
  writer.close()
  assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]
  assert f"{tmp_path / 'metrics.jsonl'}: dropped its torn last line 4" in caplog.text


def test_a_corrupt_line_before_the_last_fails_naming_the_file_and_line(tmp_path):
  write_steps(tmp_path, range(1, 4))
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines[1] = "garbage\n"
  (tmp_path / "metrics.jsonl").write_text("".join(lines))
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with pytest.raises(ValueError, match="metrics.jsonl line 2 is not JSON"):
    writer.write(4, {"loss": 0.25})
  writer.close()


def test_a_missing_file_on_resume_is_a_warning(tmp_path, caplog):
  writer = MetricsWriter(str(tmp_path), resume_step=7)
  with caplog.at_level(logging.WARNING):
    writer.write(8, {"loss": 0.25})
  writer.close()
  assert "metrics.jsonl is missing although the run resumes at step 7" in caplog.text
  assert steps_in(tmp_path / "metrics.jsonl") == [8]


def test_a_url_workdir_gets_whole_files_at_each_flush_and_resumes_from_them():
  import uuid
  from hybrid_nope import storage
  url = f"memory://runs/{uuid.uuid4().hex}"
  writer = MetricsWriter(url)
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.write_record("recency.jsonl", {"step": 4, "gap": 0.1})
  assert not storage.exists(storage.join(url, "metrics.jsonl"))  # Nothing before a flush.
  writer.flush()
  assert steps_in_text(storage.read_text(storage.join(url, "metrics.jsonl"))) == [1, 2, 3, 4, 5]
  writer.close()
  assert any(name.startswith("events.out.tfevents")
             for name in storage.listdir(storage.join(url, "tensorboard")))
  resumed = MetricsWriter(url, resume_step=3)
  resumed.write(4, {"loss": 0.3})
  resumed.close()
  assert steps_in_text(storage.read_text(storage.join(url, "metrics.jsonl"))) == [1, 2, 3, 4]
  assert storage.read_text(storage.join(url, "recency.jsonl")).count("\n") == 1  # Untouched.


def steps_in_text(text):
  return [json.loads(line)["step"] for line in text.splitlines()]
