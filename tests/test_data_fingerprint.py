"""The data fingerprint a checkpoint records: equal for the same data, and each change named."""
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from hybrid_nope.data.fingerprint import data_fingerprint
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.formats import text_files, text_index
from hybrid_nope.data.sources import text_rows
from hybrid_nope.run.checkpoint import changed_data
from tests import text_sources
from tests.helpers import tiny_config

PROLONG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "mds", "prolong")
DOMAINS = ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.3", "fineweb-edu@0.2")


def stdlib(**overrides):
  config = tiny_config(**overrides)
  return data_fingerprint(config, loader.eval_batches(config))


def test_the_same_stdlib_data_gives_the_same_fingerprint():
  assert stdlib() == stdlib()
  assert json.loads(json.dumps(stdlib())) == stdlib()  # It is stored as JSON.


@pytest.mark.parametrize("override, changed", [
    (dict(data__seq_len=128), {"data.seq_len", "train.rows", "train.tokens_sha1",
                               "eval.rows_sha1"}),
    (dict(data__eval_fraction=0.2), {"data.eval_fraction", "train.rows", "train.tokens_sha1",
                                     "eval.rows_sha1"}),
    (dict(data__seed=1), {"data.seed"}),
    (dict(model__vocab_size=300), {"model.vocab_size"}),
])
def test_each_stdlib_change_is_named(override, changed):
  names = {line.split(":")[0] for line in changed_data(stdlib(), stdlib(**override))}
  assert names == changed


def mds_config(path, domains=DOMAINS, exclude_samples=()):
  return ml_collections.ConfigDict({
      "data": {"source": "mds", "path": str(path), "domains": domains, "seq_len": 128,
               "seed": 0, "document_masking": True, "exclude_samples": exclude_samples},
      "eval": {"path": "/eval"}, "model": {"vocab_size": 258}})


EVAL = [{"inputs": np.arange(8).reshape(2, 4), "segment_ids": np.ones((2, 4), np.int32)}]


def test_an_mds_fingerprint_names_a_rewritten_shard_index_and_a_new_mixture(tmp_path):
  copy = tmp_path / "prolong"
  shutil.copytree(PROLONG, copy)
  before = data_fingerprint(mds_config(copy), EVAL)
  assert before["domain.book-65536.samples"] > 0
  assert data_fingerprint(mds_config(copy), EVAL) == before
  index = copy / "fineweb-edu" / "index.json"
  edited = json.loads(index.read_text())
  edited["shards"] = edited["shards"][:-1]  # A domain rewritten with a shard fewer.
  index.write_text(json.dumps(edited))
  names = {c.split(":")[0] for c in changed_data(before, data_fingerprint(mds_config(copy), EVAL))}
  assert names == {"domain.fineweb-edu.index_sha1", "domain.fineweb-edu.samples"}
  reweighted = mds_config(copy, ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.5",
                                 "fineweb-edu@0"))
  names = {c.split(":")[0] for c in changed_data(before, data_fingerprint(reweighted, EVAL))}
  assert {"domain.fineweb-edu.weight", "domain.fineweb-edu.index_sha1",
          "domain.book-65536.weight"} <= names
  moved = tmp_path / "elsewhere"
  shutil.copytree(PROLONG, moved)
  names = {c.split(":")[0] for c in changed_data(before, data_fingerprint(mds_config(moved), EVAL))}
  assert names == {"data.path"}
  other_eval = [{"inputs": EVAL[0]["inputs"] + 1, "segment_ids": EVAL[0]["segment_ids"]}]
  names = {c.split(":")[0]
           for c in changed_data(before, data_fingerprint(mds_config(copy), other_eval))}
  assert "eval.rows_sha1" in names


def test_a_resume_with_other_excluded_samples_is_seen():
  before = data_fingerprint(mds_config(PROLONG), EVAL)
  assert "data.exclude_samples" not in before  # As in fingerprints from before the key.
  one = data_fingerprint(mds_config(PROLONG, exclude_samples=("book-65536/shard.00001.mds:0",)),
                         EVAL)
  assert [c.split(":")[0] for c in changed_data(before, one)] == ["data.exclude_samples"]
  two = ("fineweb-edu/shard.00000.mds:3", "book-65536/shard.00001.mds:0")
  both = data_fingerprint(mds_config(PROLONG, exclude_samples=two), EVAL)
  assert [c.split(":")[0] for c in changed_data(one, both)] == ["data.exclude_samples"]
  assert both == data_fingerprint(mds_config(PROLONG, exclude_samples=two[::-1]), EVAL)


def jsonl_config(path, tmp_path, **overrides):
  return tiny_config(**{**dict(data__source="jsonl", data__path=str(path),
                               data__cache_dir=str(tmp_path / "cache"), data__eval_fraction=0.2,
                               data__seq_len=64), **overrides})


def ascii_documents(n=60):
  return [{"text": f"document {i} of the alpha beta gamma corpus " * (1 + i % 5)}
          for i in range(n)]


def upper_cased_in_place(file, keep_times=False):
  """Issue 50's edit: every document upper-cased, each line (so the file) the same bytes long
  and, for the byte tokenizer, every document the same token count."""
  stat = os.stat(file)
  lines = open(file, "rb").read().splitlines(keepends=True)
  upper = b"".join(json.dumps({"text": json.loads(line)["text"].upper()}).encode() + b"\n"
                   for line in lines)
  assert len(upper) == stat.st_size and upper != b"".join(lines)
  with open(file, "r+b") as f:  # In place: the same inode.
    f.write(upper)
  if keep_times:  # As `touch -r` or a copy that preserves times would leave it.
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def text_fingerprint(cfg):
  text_rows._cached_corpus.cache_clear()  # A new process at resume.
  return data_fingerprint(cfg, [])


@pytest.mark.parametrize("keep_times", [False, True])
def test_a_text_file_edited_in_place_under_the_same_token_counts_is_named_at_resume(
    tmp_path, keep_times):
  path = text_sources.write("jsonl", tmp_path / "data", ascii_documents())
  cfg = jsonl_config(path, tmp_path)
  saved = text_fingerprint(cfg)
  assert text_fingerprint(cfg) == saved  # Unchanged: it resumes.
  edited = os.path.join(path, "part-1.jsonl")
  upper_cased_in_place(edited, keep_times)
  current = text_fingerprint(cfg)
  assert current["text.index_sha1"] == saved["text.index_sha1"]  # What the old check saw.
  key = f"text.sha256.{edited}"
  assert changed_data(saved, current) == [f"{key}: {saved[key]!r} -> {current[key]!r}"]


def test_an_added_text_file_is_named_at_resume(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", ascii_documents())
  cfg = jsonl_config(path, tmp_path)
  saved = text_fingerprint(cfg)
  added = os.path.join(path, "part-2.jsonl")
  text_sources.write_jsonl(added, ascii_documents(10))
  names = {c.split(": ")[0] for c in changed_data(saved, text_fingerprint(cfg))}
  assert f"text.sha256.{added}" in names and "text.files" in names


def test_verify_hashes_always_rehashes_a_file_whose_index_was_found(tmp_path, monkeypatch):
  """Bit rot, or an edit the index's key cannot see: hashed again under "always" only."""
  path = text_sources.write("jsonl", tmp_path / "data", ascii_documents())
  cfg = jsonl_config(path, tmp_path, data__verify_hashes="always")
  text_fingerprint(cfg)
  edited = os.path.join(path, "part-0.jsonl")
  upper_cased_in_place(edited)
  # The index found again as if its key could not tell: every stamp kept.
  monkeypatch.setattr(text_index, "_stamp", lambda r: [r.name])
  text_fingerprint(cfg)  # Built under the fixed key from the edited file.
  with open(edited, "r+b") as f:  # Lower-cased back: a change the key misses.
    f.write(open(edited, "rb").read().lower())
  with pytest.raises(text_files.TextDataError,
                     match=rf"^{edited} has sha256 \w+, but its text index .* was built from "
                           r"sha256 \w+: the file changed"):
    text_fingerprint(cfg)
  assert text_fingerprint(jsonl_config(path, tmp_path))  # The default trusts the found index.
