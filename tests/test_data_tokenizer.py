"""Tests for hybrid_nope.data.tokenization.tokenizer."""

import numpy as np
import pytest

from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_ids_and_vocab():
  assert (TOK.BOS_ID, TOK.EOS_ID, TOK.vocab_size) == (256, 257, 258)


def test_encode_wraps_utf8_bytes_in_bos_eos():
  ids = TOK.encode("aé")
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [256, ord("a"), 0xC3, 0xA9, 257])


def test_encode_flags_and_bytes_input():
  np.testing.assert_array_equal(TOK.encode(b"\x00\xff", add_bos=False), [0, 255, 257])
  np.testing.assert_array_equal(TOK.encode(b"xy", add_eos=False), [256, 120, 121])
  assert TOK.encode("", add_bos=False, add_eos=False).shape == (0,)


@pytest.mark.parametrize("text", ["", "hello", "def f(x):\n\treturn x  # ünïcødé ✓ 🐍"])
def test_round_trip(text):
  assert TOK.decode(TOK.encode(text)) == text
  assert TOK.decode(list(TOK.encode(text, add_bos=False))) == text


def test_decode_skips_bos_eos_anywhere_and_replaces_bad_utf8():
  assert TOK.decode([256, 104, 257, 256, 105, 257]) == "hi"
  assert TOK.decode([ord("a"), 0xFF, ord("b")]) == "a\ufffdb"


@pytest.mark.parametrize("bad", [258, -1, 1000])
def test_decode_out_of_range_names_the_id(bad):
  with pytest.raises(ValueError, match=f"token id {bad} at index 1"):
    TOK.decode([65, bad, 66])


def test_encode_rejects_non_text():
  with pytest.raises(TypeError, match="int"):
    TOK.encode(5)
