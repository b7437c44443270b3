"""Byte-level tokenizer: ids 0..255 are raw bytes, plus BOS and EOS.

Bytes need no vocabulary file, so the embedded demo corpus trains with nothing to download.
Text sources (jsonl, parquet, hf) tokenise with `text_tokenizer(config.data.tokenizer)`: this
one ("byte") or a tokenizer.json of the `tokenizers` package, local or a URL.
"""

import hashlib

import numpy as np

from hybrid_nope.config_values import BYTE_TOKENIZER as BYTE


BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class ByteTokenizer:
  """UTF-8 bytes in, int32 ids out; BOS/EOS wrap each document."""

  BOS_ID = BOS_ID
  EOS_ID = EOS_ID
  vocab_size = VOCAB_SIZE
  identity = BYTE  # What a data fingerprint and a text index record of the tokenizer.

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

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]


class JsonTokenizer:
  """A tokenizer.json read with the `tokenizers` package; a document is encoded with the
  file's own special tokens (its post-processor, e.g. Llama-3's leading <|begin_of_text|>)."""

  def __init__(self, path: str, key: str | None = "data.tokenizer"):
    import tokenizers  # pylint: disable=g-import-not-at-top
    from hybrid_nope.run import storage  # pylint: disable=g-import-not-at-top
    from hybrid_nope.errors import ConfigError  # pylint: disable=g-import-not-at-top
    try:
      text = storage.read_text(path)
      self._tokenizer = tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # OSError, or tokenizers' own exception types for a bad file.
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      named = f" (config.{key})" if key else ""
      raise ConfigError(f"{path}{named} is not a tokenizers JSON file: {reason}") from None
    self.path = path
    self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
    self.identity = "sha1:" + hashlib.sha1(text.encode("utf-8")).hexdigest()

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tokenizer.encode(text).ids, np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.int32) for e in self._tokenizer.encode_batch(texts)]


def text_tokenizer(name: str, key: str = "data.tokenizer"):
  """ByteTokenizer for "byte", else the tokenizer.json at `name` (a path or URL)."""
  return ByteTokenizer() if name == BYTE else JsonTokenizer(name, key)
