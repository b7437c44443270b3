"""hybrid_nope.run.storage: the same file operations on local paths, file:// and memory:// URLs;
the records' JSON encoder and reader."""
import json
import logging
import math
import os
import uuid

import numpy as np
import pytest

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.workdir_check import check_workdir


@pytest.fixture(params=["local", "file", "memory"])
def base(request, tmp_path):
  return {"local": str(tmp_path), "file": f"file://{tmp_path}",
          "memory": f"memory://storage_test/{uuid.uuid4().hex}"}[request.param]


def test_write_read_list_and_copy(base, tmp_path):
  storage.makedirs(storage.join(base, "a"))
  path = storage.join(base, "a", "x.txt")
  assert not storage.exists(path)
  storage.write_text(path, "one\n")
  storage.write_text(path, "two\n")  # Replaced whole.
  assert storage.read_text(path) == "two\n" and storage.exists(path)
  assert storage.listdir(storage.join(base, "a")) == ["x.txt"]
  assert storage.isdir(storage.join(base, "a")) and not storage.isdir(path)
  local = tmp_path / "tree"
  (local / "sub").mkdir(parents=True)
  (local / "sub" / "f.bin").write_bytes(b"\x00\x01")
  storage.copy_tree(str(local), storage.join(base, "copied"))
  copied = storage.join(base, "copied", "sub", "f.bin")
  assert storage.read_text(copied) == "\x00\x01"
  # A second copy skips files unchanged since the first (by size and mtime).
  uploaded = {}
  storage.copy_tree(str(local), storage.join(base, "again"), uploaded)
  storage.remove(storage.join(base, "again", "sub", "f.bin"))
  storage.copy_tree(str(local), storage.join(base, "again"), uploaded)
  assert not storage.exists(storage.join(base, "again", "sub", "f.bin"))
  (local / "sub" / "f.bin").write_bytes(b"\x00\x01\x02")
  storage.copy_tree(str(local), storage.join(base, "again"), uploaded)
  assert storage.read_text(storage.join(base, "again", "sub", "f.bin")) == "\x00\x01\x02"


def test_local_writes_leave_no_staging_files(tmp_path):
  storage.write_text(str(tmp_path / "f.json"), "{}")
  assert os.listdir(tmp_path) == ["f.json"]


def test_local_path_of_each_kind():
  assert storage.local_path("/a/b") == "/a/b"
  assert storage.local_path("file:///a/b") == "/a/b"
  assert storage.local_path("gs://bucket/b") is None
  assert storage.join("gs://bucket/", "x", "y") == "gs://bucket/x/y"


def strict_json(text):
  """json.loads that refuses the NaN/Infinity tokens Python's json accepts but JSON lacks."""
  def refuse(token):
    raise AssertionError(f"{token} is not JSON")
  return json.loads(text, parse_constant=refuse)


def test_to_json_writes_non_finite_numbers_as_null():
  record = {"step": np.int64(3), "gap": float("nan"), "floor": np.float32(0.25),
            "profile": [1.0, float("inf"), -float("inf")], "heads": np.array([[0.5, np.nan]]),
            "name": "x", "flag": np.bool_(True)}
  assert strict_json(storage.to_json(record)) == {
      "step": 3, "gap": None, "floor": 0.25, "profile": [1.0, None, None],
      "heads": [[0.5, None]], "name": "x", "flag": True}


def test_read_jsonl_reads_null_as_nan_so_arithmetic_on_it_works(base):
  path = storage.join(base, "recency.jsonl")
  written = storage.to_json({"step": 1, "gap": float("nan"), "profile": [0.5, float("nan")]})
  storage.write_text(path, written + "\n" + '{"step": 2, "gap": NaN}\n')  # An older file.
  first, second = storage.read_jsonl(path)
  assert math.isnan(first["gap"]) and math.isnan(first["profile"][1]) and first["profile"][0] == 0.5
  assert np.isnan(np.mean(first["profile"]))  # A number, as the writer's NaN was.
  assert math.isnan(second["gap"])  # Files written before null are read as they were.


@pytest.mark.parametrize("line", ['{"loss": 1.0}', '{"step": "3"}', '[1, 2]', '{"step": true}'])
def test_a_record_without_an_integer_step_fails_naming_the_file_and_line(tmp_path, line):
  path = tmp_path / "metrics.jsonl"
  path.write_text(f'{{"step": 1}}\n{line}\n{{"step": 3}}\n')
  with pytest.raises(UserError, match=rf'{path} line 2 is not a record with an integer "step"'):
    storage.read_jsonl(str(path))


def test_a_memory_workdir_is_checked_with_a_warning_that_it_vanishes_at_exit(tmp_path, caplog):
  """Tests train on memory:// (test_train_loop.py), so it is allowed, but never silently."""
  url = f"memory://storage_test/{uuid.uuid4().hex}"
  with caplog.at_level(logging.WARNING):
    check_workdir(url, checkpoint_directory=str(tmp_path / "checkpoints"))
  assert f"--workdir={url} is in this process's memory" in caplog.text
  assert "vanish when the run exits" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    check_workdir(str(tmp_path / "run"))
  assert "memory" not in caplog.text


def test_move_renames_a_directory_locally_and_on_an_object_store(tmp_path):
  import uuid
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "f").write_text("x")
  storage.move(str(tmp_path / "a"), str(tmp_path / "b"))
  assert not (tmp_path / "a").exists() and (tmp_path / "b" / "f").read_text() == "x"
  url = f"memory://move/{uuid.uuid4().hex}"
  storage.write_text(storage.join(url, "a", "f"), "y")
  storage.move(storage.join(url, "a"), storage.join(url, "b"))
  assert storage.read_text(storage.join(url, "b", "f")) == "y"
  assert not storage.exists(storage.join(url, "a", "f"))
