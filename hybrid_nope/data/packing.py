"""Pack tokenised documents into fixed-length training rows (pure numpy).

The documents are concatenated into one stream and cut into rows of seq_len + 1 tokens,
consecutive rows sharing one token: row k = stream[k*T : k*T + T + 1]. Every stream token but
the first is then a target exactly once, and no document is cut short or padded. Attention and
the loss both stay inside a document: segment ids separate documents, positions count from each
document's BOS (continuing across rows), and a target from another document gets weight 0.
"""

import logging

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
