"""Probe rows: global document ids across packed rows, and greedy document coverage."""
import glob
import json
import os
import sys
import tarfile

import numpy as np
import pytest

from hybrid_nope.run import checkpoints
from hybrid_nope.analysis.measure import probe
from hybrid_nope.data.sources import registry
from hybrid_nope.data.pipeline import packing, loader
from tests.helpers import REPO, tiny_config


def test_document_ids_follow_documents_across_rows_and_skip_padding():
  docs = [np.arange(n) + 10 * k for k, n in enumerate((5, 30, 3, 3, 40))]
  rows = packing.pack_documents(docs, seq_len=16)
  ids = probe.document_ids(rows["segment_ids"], rows["positions"])
  # The stream, cut into rows of 16 (consecutive rows share one token: row k starts at 16k).
  stream_doc = np.repeat(np.arange(5), [5, 30, 3, 3, 40])
  want = np.stack([stream_doc[16 * k:16 * k + 16] for k in range(len(ids))])
  np.testing.assert_array_equal(ids, want)
  padded_seg = np.array([[1, 1, 0, 0], [1, 1, 1, 0]])
  padded_pos = np.array([[0, 1, 0, 0], [0, 1, 2, 0]])  # chapters from position 0, then padding
  np.testing.assert_array_equal(probe.document_ids(padded_seg, padded_pos),
                                [[0, 0, -1, -1], [1, 1, 1, -1]])


def test_choose_rows_covers_the_most_documents_deterministically():
  doc_ids = np.array([[0, 0, 0, 0],     # one long document over rows 0-2
                      [0, 0, 0, 0],
                      [0, 0, 1, 2],
                      [3, 3, 3, 3],
                      [3, 4, 5, 6],
                      [6, 6, -1, -1]])
  assert probe.choose_rows(doc_ids, 2).tolist() == [2, 4]
  # All seven documents are covered by then; ties go to the fullest row, then the lowest index.
  assert probe.choose_rows(doc_ids, 3).tolist() == [0, 2, 4]
  assert probe.choose_rows(doc_ids[::-1], 2).tolist() == [1, 3]
  with pytest.raises(ValueError, match="metrics.probe_batch_size=7 must be in \\[1, 6\\]"):
    probe.choose_rows(doc_ids, 7)


def covered(doc_ids, rows):
  chosen = doc_ids[rows]
  return len(np.unique(chosen[chosen >= 0]))


def test_greedy_coverage_is_near_the_brute_force_optimum():
  import itertools
  rng = np.random.default_rng(0)
  for _ in range(20):
    doc_ids = np.sort(rng.integers(0, 12, (8, 5)), axis=1)
    best = max(covered(doc_ids, list(c)) for c in itertools.combinations(range(8), 3))
    got = covered(doc_ids, probe.choose_rows(doc_ids, 3))
    assert got >= (1 - 1 / np.e) * best  # the greedy guarantee for maximum coverage
    assert got >= best - 1


def test_demo_probe_spans_more_documents_than_the_first_eval_rows():
  config = tiny_config(data__seq_len=256, eval__batch_size=8, eval__num_batches=4)
  rows = {k: np.concatenate([b[k] for b in loader.eval_batches(config)])
          for k in ("segment_ids", "positions")}
  doc_ids = probe.document_ids(rows["segment_ids"], rows["positions"])
  chosen = probe.choose_rows(doc_ids, 4)
  assert covered(doc_ids, chosen) > covered(doc_ids, [0, 1, 2, 3])


def test_clusters_are_documents_numbered_densely_across_rows():
  # Document 9 continues from row 0 into row 1: one cluster, not two independent pieces.
  dense, count = probe.clusters(np.array([[5, 5, 9], [9, 12, -1]]))
  assert count == 3 and dense.tolist() == [[0, 0, 1], [1, 2, 0]]


def test_shuffled_control_permutes_within_each_document_only():
  tokens = np.arange(24).reshape(2, 12)
  doc_ids = np.array([[0] * 5 + [1] * 7, [1] * 4 + [2] * 6 + [-1] * 2])
  shuffled = probe.shuffled_within_documents(tokens, doc_ids, seed=3)
  assert not np.array_equal(shuffled, tokens)
  for b in range(2):
    for doc in np.unique(doc_ids[b]):
      where = doc_ids[b] == doc
      if doc == probe.NOT_A_DOCUMENT:
        np.testing.assert_array_equal(shuffled[b, where], tokens[b, where])  # padding stays
      else:
        assert sorted(shuffled[b, where]) == sorted(tokens[b, where])
  np.testing.assert_array_equal(shuffled, probe.shuffled_within_documents(tokens, doc_ids, 3))


def test_a_probe_without_two_documents_is_refused_naming_both_numbers():
  from hybrid_nope.errors import ConfigError
  with pytest.raises(ConfigError) as caught:
    probe.check_documents(1, 4)
  assert str(caught.value).startswith("the recency probe's 4 eval rows (metrics.probe_batch_size) "
                                      "hold 1 document(s), but its standard errors over "
                                      "documents need at least 2")
  probe.check_documents(2, 4)


COMMITTED = os.path.join(REPO, "docs", "results", "primary", "stdlib")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason=(
    "the committed runs trained on Python 3.11's standard library (the stdlib corpus is the "
    "running interpreter's .py files; launch/install.sh: requirements.lock is 3.11's)"))
@pytest.mark.parametrize("run", sorted(glob.glob(os.path.join(COMMITTED, "*", "seed0.tar.gz"))))
def test_committed_runs_probe_select_what_they_recorded(run, tmp_path):
  """Eval sets larger than the pool (the demo's stdlib eval split, pool 1024) give the probe the
  committed runs measured, bit for bit: the same rows, documents, tokens and pairs per lag as
  their recency_probe.json (issue 50, item 5 left the pool a maximum, not the rule)."""
  with tarfile.open(run) as tar:
    recorded = json.load(tar.extractfile("recency_probe.json"))
    (tmp_path / "config.json").write_bytes(tar.extractfile("config.json").read())
  config = checkpoints.load_config(str(tmp_path))
  assert config.data.source == "stdlib" and recorded["query_positions"] is None
  pool = loader.probe_pool(config)
  eval_rows = registry.packed_rows(config, "eval")
  assert len(eval_rows["inputs"]) > config.metrics.probe_pool_rows == len(pool["inputs"])
  for k in loader.BATCH_KEYS:
    np.testing.assert_array_equal(pool[k], eval_rows[k][:config.metrics.probe_pool_rows])
  doc_ids = probe.document_ids(pool["segment_ids"], pool["positions"])
  rows = probe.choose_rows(doc_ids, config.metrics.probe_batch_size)
  assert rows.tolist() == recorded["rows"]
  chosen = doc_ids[rows]
  assert len(np.unique(chosen[chosen >= 0])) == recorded["documents"]
  assert int(np.sum(chosen >= 0)) == recorded["tokens"]
  seg = pool["segment_ids"][rows]
  pairs = [int(np.sum((seg[:, d:] == seg[:, :-d]) & (seg[:, d:] != 0))) for d in recorded["lags"]]
  assert pairs == recorded["pairs"]
