"""The data fingerprint a checkpoint records: equal for the same data, and each change named."""
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from hybrid_nope.data.fingerprint import data_fingerprint
from hybrid_nope.data import pipeline
from hybrid_nope.train.checkpoint import changed_data
from tests.helpers import tiny_config

PROLONG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "mds", "prolong")
DOMAINS = ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.3", "fineweb-edu@0.2")


def stdlib(**overrides):
  config = tiny_config(**overrides)
  return data_fingerprint(config, pipeline.eval_batches(config))


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
