"""A run's text codec: bytes with BOS and their EOS, or a tokenizer.json with a named EOS."""
import numpy as np
import pytest

from hybrid_nope.data.tokenization import tokenizer as byte_tokenizer
from hybrid_nope.data.tokenization.text_codec import TextCodecError, text_codec
from hybrid_nope.export.tokenizer import EOS_TOKEN, byte_level_tokenizer
from tests.helpers import tiny_config

TEXT = "naïve código\n"


def test_bytes_start_with_bos_decode_back_and_end_at_eos():
  codec = text_codec(tiny_config())
  ids = codec.encode(TEXT)
  assert ids[0] == byte_tokenizer.BOS_ID and list(ids[1:]) == list(TEXT.encode())
  assert codec.decode(np.append(ids, byte_tokenizer.EOS_ID)) == TEXT
  assert codec.eos_id == byte_tokenizer.EOS_ID
  with pytest.raises(TextCodecError, match="eos_token"):
    text_codec(tiny_config(), eos_token="</s>")


def test_a_tokenizer_json_codes_as_it_does_and_stops_only_at_a_named_token(tmp_path):
  path = str(tmp_path / "tokenizer.json")
  byte_level_tokenizer().save(path)  # The byte tokenizer's exact tokenizers form.
  codec = text_codec(tiny_config(), tokenizer_path=path)
  np.testing.assert_array_equal(codec.encode(TEXT), text_codec(tiny_config()).encode(TEXT))
  assert codec.decode(codec.encode(TEXT)) == TEXT and codec.eos_id is None
  assert text_codec(tiny_config(), path, EOS_TOKEN).eos_id == byte_tokenizer.EOS_ID
  with pytest.raises(TextCodecError, match="'<nope>' is not a token"):
    text_codec(tiny_config(), path, "<nope>")
  with pytest.raises(TextCodecError, match="--tokenizer"):
    text_codec(tiny_config(), str(tmp_path / "missing.json"))
