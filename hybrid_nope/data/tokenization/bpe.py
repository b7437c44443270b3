"""A byte-level BPE tokenizer trained here, with the `tokenizers` package, for a prepared corpus
(hybrid_nope.data.sources.documents; the English prose corpus's `make prose`).

Byte-level: the text's UTF-8 bytes are the alphabet (GPT-2's ByteLevel pre-tokenizer and
decoder, no normaliser), so every text encodes and `decode(encode(text)) == text` exactly. The
vocabulary is `vocab_size` ids in all: BOS_TOKEN (id 0) and EOS_TOKEN (id 1), the 256 byte
symbols, then the merges learnt in order. Its post-processor starts a text with BOS, as every
training document starts (as the byte tokenizer's exported form does, export/tokenizer.py); a
document's EOS is appended by whoever writes documents (`encode_document`).

Deterministic: the same texts in the same order give the same tokenizer.json, byte for byte
(tests/test_data_bpe.py trains twice, in two processes).
"""
from __future__ import annotations

import numpy as np

from hybrid_nope.errors import UserError

BOS_TOKEN, EOS_TOKEN = "<|bos|>", "<|eos|>"  # Export's names for the byte tokenizer's too.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)
MIN_VOCAB = len(SPECIAL_TOKENS) + 256  # The specials and the byte alphabet, before any merge.


class BPEError(UserError):
  """A vocabulary the texts cannot fill, or a tokenizer.json without our special tokens."""


def train(texts: list[str], vocab_size: int) -> str:
  """The tokenizer.json text of a byte-level BPE of exactly `vocab_size` ids learnt on `texts`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
    raise BPEError(f"vocab_size={vocab_size!r}: expected an int >= {MIN_VOCAB} (the special "
                   f"tokens {list(SPECIAL_TOKENS)} and the 256 bytes)")
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=2, show_progress=False,
      special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  size = tok.get_vocab_size(with_added_tokens=True)
  if size != vocab_size:
    raise BPEError(f"the texts ({len(texts)} of them, {sum(map(len, texts)):,} characters) "
                   f"yield {size} ids, not vocab_size={vocab_size}: too few pairs repeat; "
                   f"choose a smaller vocab_size")
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
      special_tokens=[(BOS_TOKEN, tok.token_to_id(BOS_TOKEN))])
  return tok.to_str(pretty=True) + "\n"


class Tokenizer:
  """A tokenizer.json with BOS_TOKEN and EOS_TOKEN (what `train` writes): documents in, ids out."""

  def __init__(self, text: str, where: str = "tokenizer.json"):
    import tokenizers  # pylint: disable=g-import-not-at-top
    try:
      self._tokenizer = tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own exception types for a bad file.
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise BPEError(f"{where} is not a tokenizers JSON file: {reason}") from None
    self.bos_id = self._tokenizer.token_to_id(BOS_TOKEN)
    self.eos_id = self._tokenizer.token_to_id(EOS_TOKEN)
    if self.bos_id is None or self.eos_id is None:
      raise BPEError(f"{where} lacks the special tokens {list(SPECIAL_TOKENS)} that start and "
                     f"end a document")
    self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

  def encode_document(self, data: bytes) -> np.ndarray:
    """int32 [L]: BOS, the text's ids, EOS."""
    ids = self._tokenizer.encode(data.decode("utf-8"), add_special_tokens=False).ids
    return np.asarray([self.bos_id, *ids, self.eos_id], np.int32)

  def decode(self, ids) -> str:
    """The text of `ids`, special tokens left out."""
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
