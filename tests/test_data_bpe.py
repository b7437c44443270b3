"""Tests for hybrid_nope.data.tokenization.bpe: the byte-level BPE trained for a prepared corpus (on a small
text made here; nothing is downloaded)."""
import subprocess
import sys

import pytest

from hybrid_nope.data.tokenization import bpe
from tests.helpers import REPO

TEXTS = [("In the beginning God created the heaven and the earth. And the earth was without "
          "form, and void; and darkness was upon the face of the deep. " * 3),
         "And God said, Let there be light: and there was light.\n" * 4,
         "And God saw the light, that it was good: and God divided the light from the darkness.",
         "Now these are the names of the children of Israel, which came into Egypt; every man "
         "and his household came with Jacob.\n"]
VOCAB = 300


def test_training_twice_gives_the_same_bytes_in_one_process_and_in_another():
  first = bpe.train(TEXTS, VOCAB)
  assert bpe.train(TEXTS, VOCAB) == first
  code = (f"from hybrid_nope.data.tokenization import bpe; from tests.test_data_bpe import TEXTS, VOCAB; "
          f"import sys; sys.stdout.write(bpe.train(TEXTS, VOCAB))")
  other = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True).stdout
  assert other == first


def test_the_vocabulary_is_the_size_asked_with_bos_and_eos_first():
  tok = bpe.Tokenizer(bpe.train(TEXTS, VOCAB))
  assert tok.vocab_size == VOCAB and (tok.bos_id, tok.eos_id) == (0, 1)
  with pytest.raises(bpe.BPEError, match="vocab_size=100: expected an int >= 258"):
    bpe.train(TEXTS, 100)
  with pytest.raises(bpe.BPEError, match="yield .* ids, not vocab_size=100000"):
    bpe.train(TEXTS, 100_000)  # Too few repeating pairs to learn that many merges.


@pytest.mark.parametrize("text", [
    TEXTS[0], "unseen words: zygote, quux, naïve café, 東京, emoji 🙂, tabs\tand\r\nlines\n",
    "  leading and trailing spaces  ", "\n\n"])
def test_documents_round_trip_exactly_and_are_wrapped_in_bos_and_eos(text):
  tok = bpe.Tokenizer(bpe.train(TEXTS, VOCAB))
  ids = tok.encode_document(text.encode("utf-8"))
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and ids.max() < VOCAB
  assert tok.bos_id not in ids[1:-1] and tok.eos_id not in ids[1:-1]
  assert tok.decode(ids) == text


def test_merges_compress_the_text_they_were_learnt_on():
  tok = bpe.Tokenizer(bpe.train(TEXTS, VOCAB))
  data = TEXTS[0].encode("utf-8")
  assert tok.encode_document(data).size - 2 < len(data) * 0.6  # 42 merges: about 2 bytes a token


def test_a_tokenizer_without_our_special_tokens_is_refused_naming_it():
  import tokenizers  # pylint: disable=g-import-not-at-top
  plain = tokenizers.Tokenizer(tokenizers.models.BPE()).to_str()
  with pytest.raises(bpe.BPEError, match=r"x/tokenizer.json lacks the special tokens"):
    bpe.Tokenizer(plain, "x/tokenizer.json")
  with pytest.raises(bpe.BPEError, match="x/tokenizer.json is not a tokenizers JSON file"):
    bpe.Tokenizer("{", "x/tokenizer.json")
