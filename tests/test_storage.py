"""hybrid_nope.storage: the same file operations on local paths, file:// and memory:// URLs."""
import os
import uuid

import pytest

from hybrid_nope import storage


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
