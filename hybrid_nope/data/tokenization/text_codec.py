"""Text to a run's token ids and back, as its training data was tokenised (score, generate, and
the samples a run writes while it trains).

- a byte source (data.source=stdlib; registry.byte_tokenised), or a text source with
  data.tokenizer="byte": the byte tokenizer (data/tokenization/tokenizer.py). Text starts with BOS as every
  training document does; the documents end with EOS, which is the end of a generation.
- otherwise: a tokenizer.json (`tokenizer_path`, else the one the data carries or a text
  source's data.tokenizer: the source's tokenizer_files) with its own special tokens. Which id
  ends a document is not recorded with mds or text data, so generation stops at one only when
  named (`eos_token`); a documents directory's tokenizer (hybrid_nope.data.tokenization.bpe) ends each
  document with its EOS token, the default there (`Source.eos_token`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.data.sources import registry
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer
from hybrid_nope.errors import UserError


class TextCodecError(UserError):
  pass


@dataclasses.dataclass(frozen=True)
class TextCodec:
  encode: Callable[[str], np.ndarray]   # text -> int32 ids, with the data's leading specials
  decode: Callable[[np.ndarray], str]   # ids -> text, special tokens left out
  eos_id: int | None                    # the id that ends a document, if known


def text_codec(config, tokenizer_path: str | None = None,
               eos_token: str | None = None) -> TextCodec:
  """The run's codec (module docstring). `eos_token` names the end-of-document token of a
  tokenizer.json (e.g. "<|end_of_text|>"); the byte tokenizer's is its EOS."""
  source = registry.named(config)
  if tokenizer_path is None and registry.byte_tokenised(config):
    if eos_token is not None:
      raise TextCodecError(f"eos_token={eos_token!r}: the byte tokenizer "
                           f"(data.source={config.data.source}) "
                           f"has its own EOS (id {ByteTokenizer.EOS_ID}); name none")
    byte_tokenizer = ByteTokenizer()
    return TextCodec(lambda text: byte_tokenizer.encode(text, add_bos=True, add_eos=False),
                     byte_tokenizer.decode, ByteTokenizer.EOS_ID)
  found = [tokenizer_path] if tokenizer_path else source.tokenizer_files(config)
  if not found or not storage.exists(found[0]):
    raise TextCodecError(f"no tokenizer.json for this run (data.source={config.data.source}"
                         f"{', tokenizer ' + tokenizer_path if tokenizer_path else ''}): pass "
                         "--tokenizer=/path/to/tokenizer.json")
  import tokenizers  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.Tokenizer.from_str(storage.read_text(found[0]))
  eos_id = None
  if eos_token is None:
    eos_token = source.eos_token  # A prepared directory's tokenizer names its own.
  if eos_token is not None:
    eos_id = tokenizer.token_to_id(eos_token)
    if eos_id is None:
      raise TextCodecError(f"eos_token={eos_token!r} is not a token of {found[0]}")
  return TextCodec(lambda text: np.asarray(tokenizer.encode(text).ids, np.int32),
                   lambda ids: tokenizer.decode([int(i) for i in ids]), eos_id)
