"""Byte-level tokenizer: ids 0..255 are raw bytes, plus BOS and EOS.

Bytes need no vocabulary file, so the embedded demo corpus trains with nothing to download.
"""

import numpy as np

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class ByteTokenizer:
  """UTF-8 bytes in, int32 ids out; BOS/EOS wrap each document."""

  BOS_ID = BOS_ID
  EOS_ID = EOS_ID
  vocab_size = VOCAB_SIZE

  def encode(self, text_or_bytes: str | bytes, add_bos: bool = True,
             add_eos: bool = True) -> np.ndarray:
    """Returns int32 ids [len(bytes) + add_bos + add_eos]."""
    if isinstance(text_or_bytes, str):
      data = text_or_bytes.encode("utf-8")
    elif isinstance(text_or_bytes, (bytes, bytearray, memoryview)):
      data = bytes(text_or_bytes)
    else:
      raise TypeError(f"encode expects str or bytes, got {type(text_or_bytes).__name__}")
    ids = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    bos = [BOS_ID] if add_bos else []
    eos = [EOS_ID] if add_eos else []
    return np.concatenate([np.array(bos, np.int32), ids, np.array(eos, np.int32)])

  def decode(self, ids) -> str:
    """Bytes back to text; BOS/EOS are skipped, invalid UTF-8 becomes U+FFFD."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
      raise ValueError(f"decode expects a 1-D sequence of integer ids, got dtype "
                       f"{ids.dtype} shape {ids.shape}")
    bad = np.flatnonzero((ids < 0) | (ids >= VOCAB_SIZE))
    if bad.size:
      raise ValueError(f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside the "
                       f"byte vocabulary [0, {VOCAB_SIZE})")
    data = ids[ids < 256].astype(np.uint8).tobytes()
    return data.decode("utf-8", errors="replace")
