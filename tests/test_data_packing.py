"""Tests for hybrid_nope.data.pipeline.packing, against a plain-loop reference."""

import logging

import numpy as np
import pytest

from hybrid_nope.data.pipeline import packing

B, E = 256, 257


def reference_pack(docs, seq_len):
  """Straightforward per-token loops; shares no code or formula with packing.py."""
  stream, doc_of, pos_of = [], [], []
  for d, doc in enumerate(docs):
    for p, token in enumerate(doc):
      stream.append(int(token)); doc_of.append(d); pos_of.append(p)
  out = {k: [] for k in ("inputs", "targets", "segment_ids", "positions", "weights")}
  k = 0
  while k * seq_len + seq_len + 1 <= len(stream):
    row = list(range(k * seq_len, k * seq_len + seq_len + 1))
    segment, segments = 1, []
    for j, i in enumerate(row):
      if j > 0 and doc_of[i] != doc_of[row[j - 1]]:
        segment += 1
      segments.append(segment)
    out["inputs"].append([stream[i] for i in row[:-1]])
    out["targets"].append([stream[i] for i in row[1:]])
    out["segment_ids"].append(segments[:-1])
    out["positions"].append([pos_of[i] for i in row[:-1]])
    out["weights"].append([float(doc_of[i] == doc_of[i + 1]) for i in row[:-1]])
    k += 1
  return out


def random_docs(rng, num_docs, max_len):
  # Body tokens avoid BOS/EOS so "target is a BOS" identifies document starts.
  return [np.concatenate([[B], rng.integers(0, 256, rng.integers(0, max_len)), [E]])
          .astype(np.int32) for _ in range(num_docs)]


def test_hand_made_example():
  docs = [np.array(d, np.int32) for d in ([B, 1, 2, E], [B, 3, E], [B, 4, 5, 6, 7, E])]
  rows = packing.pack_documents(docs, seq_len=4)
  np.testing.assert_array_equal(rows["inputs"], [[B, 1, 2, E], [B, 3, E, B], [4, 5, 6, 7]])
  np.testing.assert_array_equal(rows["targets"], [[1, 2, E, B], [3, E, B, 4], [5, 6, 7, E]])
  np.testing.assert_array_equal(rows["segment_ids"], [[1, 1, 1, 1], [1, 1, 1, 2], [1, 1, 1, 1]])
  # The third row starts mid-document: positions continue at 1, not 0.
  np.testing.assert_array_equal(rows["positions"], [[0, 1, 2, 3], [0, 1, 2, 0], [1, 2, 3, 4]])
  np.testing.assert_array_equal(rows["weights"], [[1, 1, 1, 0], [1, 1, 0, 1], [1, 1, 1, 1]])


@pytest.mark.parametrize("seq_len", [1, 3, 8, 17, 64])
def test_matches_reference(seq_len):
  docs = random_docs(np.random.default_rng(seq_len), num_docs=30, max_len=40)
  rows = packing.pack_documents(docs, seq_len)
  expected = reference_pack(docs, seq_len)
  assert set(rows) == set(expected)
  for key, value in rows.items():
    assert value.dtype == (np.float32 if key == "weights" else np.int32), key
    assert value.shape == (len(expected["inputs"]), seq_len), key
    np.testing.assert_array_equal(value, np.array(expected[key]), key)


def test_rows_overlap_by_one_and_every_token_is_a_target_once():
  docs = random_docs(np.random.default_rng(0), num_docs=50, max_len=100)
  stream = np.concatenate(docs)
  rows = packing.pack_documents(docs, seq_len=16)
  inputs, targets = rows["inputs"], rows["targets"]
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
  np.testing.assert_array_equal(targets[:-1, -1], inputs[1:, 0])
  used = inputs.size + 1
  np.testing.assert_array_equal(targets.ravel(), stream[1:used])
  assert len(stream) - used < 16  # only an incomplete row is dropped


def test_weights_zero_exactly_at_document_starts():
  docs = random_docs(np.random.default_rng(1), num_docs=40, max_len=30)
  rows = packing.pack_documents(docs, seq_len=32)
  np.testing.assert_array_equal(rows["weights"] == 0, rows["targets"] == B)
  # A document's BOS never is a target, and it starts a new segment and position 0.
  np.testing.assert_array_equal(rows["inputs"] == B, rows["positions"] == 0)


def test_loss_weights_masks_boundaries_and_padding():
  inputs = np.array([[1, 1, 2, 2, 0, 0]])
  targets = np.array([[1, 2, 2, 0, 0, 0]])
  np.testing.assert_array_equal(packing.loss_weights(inputs, targets), [[1, 0, 1, 0, 0, 0]])
  assert packing.loss_weights(inputs, targets).dtype == np.float32
  with pytest.raises(ValueError, match="shape"):
    packing.loss_weights(inputs, targets[:, :-1])


def test_dropped_tail_is_logged(caplog):
  docs = [np.array([B, 1, 2, 3, 4, 5, 6, E], np.int32)]  # 8 tokens, 2 rows of 3 use 7
  with caplog.at_level(logging.INFO, logger=packing.__name__):
    rows = packing.pack_documents(docs, seq_len=3)
  assert rows["inputs"].shape == (2, 3)
  assert "dropped the last 1 tokens" in caplog.text


@pytest.mark.parametrize("docs, seq_len, match", [
    ([np.array([B, 1, E])], 0, "seq_len"),
    ([np.array([B, 1, E])], 3, "too few"),
    ([], 3, "no documents"),
    ([np.array([B, E]), np.array([], np.int32)], 1, "document 1"),
    ([np.array([[B, E]])], 1, "document 0"),
    ([np.array([0.5, 1.0])], 1, "document 0"),
])
def test_bad_input_raises(docs, seq_len, match):
  with pytest.raises(ValueError, match=match):
    packing.pack_documents(docs, seq_len)
