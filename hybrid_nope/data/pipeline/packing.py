"""Pack tokenised documents into fixed-length training rows (pure numpy): the one home of
packing for every source.

The documents are concatenated into one stream and cut into rows of seq_len + 1 tokens,
consecutive rows sharing one token: row k = stream[k*T : k*T + T + 1]. Every stream token but
the first is then a target exactly once, and no document is cut short. Attention and the loss
both stay inside a document: segment ids separate documents, positions count from each
document's first token (continuing across rows), and a target from another document gets
weight 0. Two forms of the same rule:
  pack_documents  all rows at once, in memory; the tail that fills no whole row is dropped
                  (the stdlib corpus, prepared byte documents);
  StreamRows      row k on demand, reading only the documents it overlaps; the last row is
                  padded (token 0, segment 0, weight 0) where the stream ends (MDS raw domains,
                  jsonl / parquet / saved datasets, from cached ids or bytes), each by `cut_row`.
"""

import logging
from typing import Callable

import numpy as np

PADDING_SEGMENT = 0
# What every row source yields and every batch holds, each [.., seq_len].
ROW_KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")
ROW_DTYPES = {"inputs": np.int32, "targets": np.int32, "segment_ids": np.int32,
              "positions": np.int32, "weights": np.float32}

_log = logging.getLogger(__name__)


def loss_weights(input_segment_ids: np.ndarray, target_segment_ids: np.ndarray) -> np.ndarray:
  """float32 weights: 1 where the target continues the input's document, else 0.

  A target in another segment is the first token of the next document (nothing to predict it
  from), and segment 0 is padding.
  """
  if input_segment_ids.shape != target_segment_ids.shape:
    raise ValueError(f"input_segment_ids shape {input_segment_ids.shape} != "
                     f"target_segment_ids shape {target_segment_ids.shape}")
  same_document = input_segment_ids == target_segment_ids
  return (same_document & (target_segment_ids != PADDING_SEGMENT)).astype(np.float32)


def pack_documents(docs_tokens: list[np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
  """Packs documents (each already BOS ... EOS) into S = (num_tokens - 1) // seq_len rows.

  Returns inputs, targets, segment_ids, positions (int32) and weights (float32), each [S, T]
  with T = seq_len. The stream's tail that does not fill a whole row is dropped, and the count
  is logged. Arrays may be read-only views of one shared stream; copy before writing.
  """
  if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
  if not docs_tokens:
    raise ValueError("pack_documents got no documents")
  for i, doc in enumerate(docs_tokens):
    if doc.ndim != 1 or doc.size == 0 or not np.issubdtype(doc.dtype, np.integer):
      raise ValueError(f"document {i} must be a non-empty 1-D integer array (at least its BOS), "
                       f"got dtype {doc.dtype} shape {doc.shape}")

  lengths = np.array([doc.size for doc in docs_tokens], dtype=np.int64)
  stream = np.concatenate(docs_tokens).astype(np.int32, copy=False)
  if stream.size >= 2**31:
    raise ValueError(f"{stream.size} tokens overflow the int32 index arithmetic; pack the "
                     f"documents in chunks of fewer than 2**31 tokens")
  num_rows = (stream.size - 1) // seq_len
  if num_rows == 0:
    raise ValueError(f"{stream.size} tokens are too few for one row of seq_len={seq_len} "
                     f"(needs seq_len + 1 = {seq_len + 1})")
  used = num_rows * seq_len + 1
  _log.info("pack_documents: %d tokens -> %d rows of seq_len=%d; dropped the last %d tokens",
            stream.size, num_rows, seq_len, stream.size - used)

  document = np.repeat(np.arange(lengths.size, dtype=np.int32), lengths)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
  position = np.arange(stream.size, dtype=np.int32) - starts[document]

  def rows(x):  # [used] -> read-only [S, T+1] view, row k = x[k*T : k*T+T+1]
    return np.lib.stride_tricks.sliding_window_view(x[:used], seq_len + 1)[::seq_len]

  token_rows = rows(stream)
  document_rows = rows(document)
  # Renumber documents 1, 2, ... inside each row (0 stays free for padding).
  segment_rows = document_rows - document_rows[:, :1] + 1
  return {
      "inputs": token_rows[:, :-1],
      "targets": token_rows[:, 1:],
      "segment_ids": segment_rows[:, :-1],
      "positions": rows(position)[:, :-1],
      "weights": loss_weights(segment_rows[:, :-1], segment_rows[:, 1:]),
  }


def cut_row(tokens: np.ndarray, doc_starts: np.ndarray, doc_ends: np.ndarray, first: int,
            seq_len: int) -> dict[str, np.ndarray]:
  """One training row from stream[first : first + n] (n = tokens.size, 2 <= n <= seq_len + 1).

  doc_starts / doc_ends: sorted, non-overlapping [start, end) of the stream's documents, in
  stream coordinates (only those near the row are needed); a token no document covers gets
  segment 0 and weight 0. Returns ROW_KEYS, each [seq_len], padded past n.
  """
  n, T = tokens.size, seq_len
  if not 2 <= n <= T + 1:
    raise ValueError(f"a row needs 2..{T + 1} tokens, got {n}")
  p = first + np.arange(n, dtype=np.int64)
  doc = np.searchsorted(doc_starts, p, side="right") - 1
  clipped = np.maximum(doc, 0)
  inside = (doc >= 0) & (p < doc_ends[clipped]) if doc_ends.size else np.zeros(n, bool)
  m = min(n, T)  # inputs; n - 1 targets
  first_doc = doc[inside].min() if inside.any() else 0
  row = {k: np.zeros(T, ROW_DTYPES[k]) for k in ROW_KEYS}
  row["inputs"][:m] = tokens[:m]
  row["targets"][:n - 1] = tokens[1:]
  row["segment_ids"][:m] = np.where(inside[:m], doc[:m] - first_doc + 1, PADDING_SEGMENT)
  row["positions"][:m] = np.where(inside[:m], p[:m] - doc_starts[clipped[:m]], 0)
  row["weights"][:n - 1] = inside[:-1] & inside[1:] & (doc[:-1] == doc[1:])
  return row


class StreamRows:
  """The rows of documents 0..D-1 concatenated in order, row k read on demand.

  `lengths` int [D]: each document's token count (0: the document is left out of the stream).
  `read(d, lo, hi)` returns tokens [lo, hi) of document d (integer array). A stream of L tokens
  gives ceil((L - 1) / seq_len) rows, the last padded. Without `document_masking` a row is one
  sequence (positions count from the row's start), as ProLong's single_seq.
  """

  def __init__(self, lengths: np.ndarray, read: Callable[[int, int, int], np.ndarray], *,
               seq_len: int, document_masking: bool = True):
    self.lengths = np.asarray(lengths, np.int64)
    self.read = read
    self.seq_len = int(seq_len)
    self.document_masking = bool(document_masking)
    self.starts = np.concatenate([[0], np.cumsum(self.lengths)])  # [D + 1], stream offsets
    self.num_tokens = int(self.starts[-1])
    self.num_rows = -(-(self.num_tokens - 1) // self.seq_len) if self.num_tokens >= 2 else 0

  def __len__(self) -> int:
    return self.num_rows

  def __getitem__(self, row: int) -> dict[str, np.ndarray]:
    if not 0 <= row < self.num_rows:
      raise IndexError(f"row {row} out of range ({self.num_rows} rows)")
    first = int(row) * self.seq_len
    stop = min(first + self.seq_len + 1, self.num_tokens)
    s0 = int(np.searchsorted(self.starts, first, side="right")) - 1
    s1 = int(np.searchsorted(self.starts, stop - 1, side="right")) - 1
    docs = [d for d in range(s0, s1 + 1) if self.lengths[d]]  # Not the left-out ones.
    pieces = [self.read(d, max(first - int(self.starts[d]), 0),
                        min(stop - int(self.starts[d]), int(self.lengths[d]))) for d in docs]
    tokens = np.concatenate(pieces).astype(np.int32)
    if self.document_masking:
      starts, ends = self.starts[docs], self.starts[np.array(docs) + 1]
    else:
      starts, ends = np.array([first]), np.array([stop])
    return cut_row(tokens, starts, ends, first, self.seq_len)
