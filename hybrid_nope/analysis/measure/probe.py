"""The recency probe: eval rows chosen to span as many documents as the eval set holds.

Eval rows come in stream order (packed demo rows: a document may continue into the next row,
its positions counting on; TextbookChapters: one chapter per row from position 0, padded with
segment 0). A document therefore has one id across rows: a segment whose first token has
position 0 starts a new document, any other segment continues the previous row's last one.
"""
from __future__ import annotations

import numpy as np
from absl import logging

from hybrid_nope.data.pipeline.packing import PADDING_SEGMENT
from hybrid_nope.errors import ConfigError

NOT_A_DOCUMENT = -1  # document id of padding tokens


def document_ids(segment_ids_RT: np.ndarray, positions_RT: np.ndarray) -> np.ndarray:
  """int64 [R, T]: a global document id per token (0, 1, ... in stream order), -1 on padding."""
  seg, pos = np.asarray(segment_ids_RT), np.asarray(positions_RT)
  if seg.shape != pos.shape or seg.ndim != 2:
    raise ValueError(f"segment_ids {seg.shape} and positions {pos.shape} must be equal [R, T]")
  out = np.full(seg.shape, NOT_A_DOCUMENT, np.int64)
  next_id, last_id = 0, None
  for r in range(seg.shape[0]):
    starts = np.flatnonzero(np.diff(seg[r], prepend=seg[r, 0] - 1) != 0)
    ends = np.append(starts[1:], seg.shape[1])
    for a, b in zip(starts, ends):
      if seg[r, a] == PADDING_SEGMENT:
        continue
      continues = a == 0 and pos[r, 0] > 0 and last_id is not None
      if not continues:
        last_id, next_id = next_id, next_id + 1
      out[r, a:b] = last_id
  return out


def probe_size(probe_batch_size: int, eval_rows: int) -> int:
  """Rows the probe measures: metrics.probe_batch_size is the most, an eval set with fewer rows
  is measured whole, said in one line (its documents are what the statistics need:
  check_documents)."""
  if eval_rows < probe_batch_size:
    logging.info("recency probe: measures all %d eval rows (metrics.probe_batch_size=%d is the "
                 "most it measures)", eval_rows, probe_batch_size)
  return min(probe_batch_size, eval_rows)


def choose_rows(doc_ids_RT: np.ndarray, count: int) -> np.ndarray:
  """`count` row indices (sorted) that together cover as many distinct documents as possible.

  Greedy maximum coverage, deterministic: each pick is the row adding the most documents not
  yet covered, ties broken by the most documents in the row, then the lowest index.
  """
  R = doc_ids_RT.shape[0]
  if not 1 <= count <= R:
    raise ValueError(f"config.metrics.probe_batch_size={count} must be in [1, {R}] (the eval "
                     f"set has {R} rows: eval.batch_size x eval.num_batches)")
  row_docs = [set(np.unique(row[row != NOT_A_DOCUMENT]).tolist()) for row in doc_ids_RT]
  covered: set[int] = set()
  chosen: list[int] = []
  free = set(range(R))
  for _ in range(count):
    best = min(free, key=lambda r: (-len(row_docs[r] - covered), -len(row_docs[r]), r))
    chosen.append(best)
    free.remove(best)
    covered |= row_docs[best]
  return np.array(sorted(chosen), np.int64)


MIN_CLUSTERS = 20  # Fewer documents than this: a cluster-robust standard error is unreliable.
# Fewer than this: no standard error over documents at all (recency.mean_and_stderr: NaN).
MIN_DOCUMENTS = 2


def check_documents(num_documents: int, num_rows: int) -> None:
  """Refuses a probe whose documents cannot give a standard error, naming both numbers."""
  if num_documents < MIN_DOCUMENTS:
    raise ConfigError(
        f"the recency probe's {num_rows} eval rows (metrics.probe_batch_size) hold "
        f"{num_documents} document(s), but its standard errors over documents need at least "
        f"{MIN_DOCUMENTS}: use an eval set with more documents, or raise "
        f"metrics.probe_batch_size")


def clusters(doc_ids_BT: np.ndarray) -> tuple[np.ndarray, int]:
  """int32 [B, T] cluster ids 0..C-1, one per probe document, and C (padding gets 0; its pairs
  never count).

  Standard errors are over documents: pairs of one document are correlated, in one row or
  across rows (a document continued into the next row is one cluster, not two independent ones),
  and distinct documents are independent.
  """
  docs = np.unique(doc_ids_BT[doc_ids_BT != NOT_A_DOCUMENT])
  dense = np.searchsorted(docs, np.where(doc_ids_BT == NOT_A_DOCUMENT,
                                         docs[0] if docs.size else 0, doc_ids_BT))
  return dense.astype(np.int32), max(int(docs.size), 1)


def shuffled_within_documents(tokens_BT: np.ndarray, doc_ids_BT: np.ndarray,
                              seed: int = 0) -> np.ndarray:
  """The tokens with each row's piece of each document permuted at random (padding stays).

  The shuffled-token control: the same tokens, documents, positions and pairs, with the order
  inside a document destroyed. The permutation depends only on `seed` and the probe, so every
  run and step sees the same control.
  """
  rng = np.random.default_rng(seed)
  out = np.array(tokens_BT, copy=True)
  for b in range(out.shape[0]):
    for doc in np.unique(doc_ids_BT[b][doc_ids_BT[b] != NOT_A_DOCUMENT]):
      where = np.flatnonzero(doc_ids_BT[b] == doc)
      out[b, where] = out[b, rng.permutation(where)]
  return out
