"""The token ids cached beside a text source's index (hybrid_nope.data.formats.text_ids): each document
tokenised once per corpus and tokenizer, never reused for another tokenizer or other data,
refused at the wrong size, and rows identical with and without them."""
import dataclasses
import os
import types

import numpy as np
import pytest

from hybrid_nope.data.formats import text_ids, text_index
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import text_rows
from hybrid_nope.data.tokenization import tokenizer
from tests import text_sources
from tests.helpers import assert_same_batches, take, tiny_config

T = 64
WORDS = ["alpha", "beta", "gamma", "délta", "εψιλον", "zeta", "eta", "theta", "ιώτα",
         "kappa"]  # text_sources.documents' words


def word_tokenizer(path, reverse=False) -> str:
  """A tokenizer.json of WORDS (in reverse order if `reverse`: the same texts, other ids), with
  <s> before each document."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  words = ["<s>", "[UNK]", *(WORDS[::-1] if reverse else WORDS)]
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
  tok.save(str(path))
  return str(path)


@pytest.fixture
def encoded(monkeypatch):
  """The texts a tokenizer.json encodes (one entry per document, batch or single), as a list."""
  texts = []
  encode, encode_batch = tokenizer.JsonTokenizer.encode, tokenizer.JsonTokenizer.encode_batch
  monkeypatch.setattr(tokenizer.JsonTokenizer, "encode",
                      lambda self, text: texts.append(text) or encode(self, text))
  monkeypatch.setattr(tokenizer.JsonTokenizer, "encode_batch",
                      lambda self, batch: texts.extend(batch) or encode_batch(self, batch))
  return texts


def open_corpus(source, path, tokenizer_path, cache) -> text_rows.TextCorpus:
  return text_rows.TextCorpus(source, str(path), "text", tokenizer_path, str(cache), 0.2, True)


def all_rows(c: text_rows.TextCorpus, order=None) -> list[dict]:
  out = []
  for split in text_rows.SPLITS:
    rows = c.rows(split, T, True)
    out += [rows[int(k)] for k in (order(len(rows)) if order else range(len(rows)))]
  return out


def assert_same_rows(a: list[dict], b: list[dict]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("source", text_sources.SOURCES)
def test_each_document_is_tokenised_once_however_many_rows_are_read(source, tmp_path, encoded):
  records = text_sources.documents()
  path = text_sources.write(source, tmp_path / "data", records)
  tok = word_tokenizer(tmp_path / "tokenizer.json")
  c = open_corpus(source, path, tok, tmp_path / "cache")
  rng = np.random.default_rng(0)
  for _ in range(2):  # Every row, twice, shuffled: a long document's rows far apart.
    all_rows(c, order=rng.permutation)
  assert len(encoded) == len(records)  # The index's one scan, nothing after.
  assert sorted(encoded) == sorted(r["text"] for r in records)
  encoded.clear()
  again = open_corpus(source, path, tok, tmp_path / "cache")
  assert_same_rows(all_rows(again), all_rows(c))
  assert not encoded  # A start on the same data and tokenizer tokenises nothing.


def test_ids_of_another_tokenizer_or_other_data_are_never_reused(tmp_path, encoded):
  """Each is found under its own key: another tokenizer or a changed file builds its own ids."""
  records = text_sources.documents()
  path = text_sources.write("jsonl", tmp_path / "data", records)
  cache = tmp_path / "cache"
  first = word_tokenizer(tmp_path / "a.json")
  other = word_tokenizer(tmp_path / "b.json", reverse=True)
  open_corpus("jsonl", path, first, cache)
  encoded.clear()
  c = open_corpus("jsonl", path, other, cache)
  assert len(encoded) == len(records)  # Tokenised anew with the other tokenizer.
  expected = tokenizer.JsonTokenizer(other)
  stream = np.concatenate([expected.encode(records[d]["text"]) for d in c.documents["train"]])
  rows = c.rows("train", T, True)
  got = np.concatenate([rows[k]["inputs"] for k in range(len(rows))])[:stream.size]
  np.testing.assert_array_equal(got, stream)
  assert len([f for f in os.listdir(cache / text_index.SUBDIR) if ".ids-" in f]) == 2
  changed = [{"text": r["text"].upper()} for r in records[30:]]  # One file's text, other ids.
  text_sources.write_jsonl(os.path.join(path, "part-1.jsonl"), changed)
  encoded.clear()
  c = open_corpus("jsonl", path, other, cache)
  assert len(encoded) == len(records)
  assert len([f for f in os.listdir(cache / text_index.SUBDIR) if ".ids-" in f]) == 3
  np.testing.assert_array_equal(c.read(59, 0, 2), [0, 1])  # <s>, then an upper-cased [UNK].


def test_rows_are_identical_with_and_without_the_cached_ids(tmp_path):
  records = text_sources.documents()
  path = text_sources.write("parquet", tmp_path / "data", records)
  c = open_corpus("parquet", path, word_tokenizer(tmp_path / "tokenizer.json"), tmp_path / "c")
  assert c.index.ids is not None and c.index.ids.dtype == np.uint16
  on_the_fly = open_corpus("parquet", path, str(tmp_path / "tokenizer.json"), tmp_path / "c")
  on_the_fly.index = dataclasses.replace(on_the_fly.index, ids=None)
  assert_same_rows(all_rows(c), all_rows(on_the_fly))


def test_a_resume_from_the_rows_consumed_reads_on_exactly_from_the_cached_ids(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", text_sources.documents())
  cfg = tiny_config(data__source="jsonl", data__path=str(path), data__eval_fraction=0.2,
                    data__cache_dir=str(tmp_path / "cache"), data__seq_len=T,
                    data__batch_size=4, model__vocab_size=12,
                    data__tokenizer=word_tokenizer(tmp_path / "tokenizer.json"))
  assert text_rows.corpus(cfg).index.ids is not None
  whole = take(loader.train_iterator(cfg), 12)
  assert_same_batches(take(loader.train_iterator(cfg, start_row=7 * 4), 5), whole[7:])


def _jsonl_corpus_and_its_ids(tmp_path):
  """(records, path, tokenizer, every row, the ids file) of a jsonl corpus read once."""
  records = text_sources.documents()
  path = text_sources.write("jsonl", tmp_path / "data", records)
  tok = word_tokenizer(tmp_path / "tokenizer.json")
  first = all_rows(open_corpus("jsonl", path, tok, tmp_path / "cache"))
  (ids_file,) = [tmp_path / "cache" / text_index.SUBDIR / f
                 for f in os.listdir(tmp_path / "cache" / text_index.SUBDIR) if ".ids-" in f]
  return records, path, tok, first, ids_file


def test_ids_of_the_wrong_size_are_refused_in_one_warning_and_built_again(
    tmp_path, encoded, caplog):
  records, path, tok, first, ids_file = _jsonl_corpus_and_its_ids(tmp_path)
  with open(ids_file, "r+b") as f:
    f.truncate(os.path.getsize(ids_file) - 2)
  encoded.clear()
  with caplog.at_level("WARNING"):
    again = open_corpus("jsonl", path, tok, tmp_path / "cache")
  warned = [r.getMessage() for r in caplog.records if "token ids" in r.getMessage()]
  assert len(warned) == 1 and str(ids_file) in warned[0] and "building the index" in warned[0]
  assert len(encoded) == len(records)
  assert_same_rows(all_rows(again), first)


def test_a_cache_that_cannot_be_written_tokenises_on_the_fly_and_says_so(tmp_path, caplog):
  records = text_sources.documents()
  path = text_sources.write("hf", tmp_path / "data", records)
  tok = word_tokenizer(tmp_path / "tokenizer.json")
  expected = all_rows(open_corpus("hf", path, tok, tmp_path / "cache"))
  blocked = tmp_path / "blocked"
  blocked.mkdir()
  (blocked / text_index.SUBDIR).write_text("a file where the index directory would be")
  with caplog.at_level("WARNING"):
    c = open_corpus("hf", path, tok, blocked)
  assert c.index.ids is None and "cannot cache the token ids at " in caplog.text
  assert_same_rows(all_rows(c), expected)


def test_the_byte_tokenizer_caches_no_ids_and_the_dtype_fits_the_vocabulary(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", text_sources.documents(10))
  c = open_corpus("jsonl", path, "byte", tmp_path / "cache")
  assert c.index.ids is None
  assert not [f for f in os.listdir(tmp_path / "cache" / text_index.SUBDIR) if ".ids-" in f]
  assert text_ids.dtype(types.SimpleNamespace(vocab_size=1 << 16)) == np.uint16
  assert text_ids.dtype(types.SimpleNamespace(vocab_size=128_256)) == np.uint32
  assert text_ids.path("/c/text-index/k.npz", types.SimpleNamespace(vocab_size=9)) == (
      "/c/text-index/k.ids-uint16")


def test_verify_hashes_always_rebuilds_ids_edited_under_the_same_size(tmp_path, encoded, caplog):
  records, path, tok, first, ids_file = _jsonl_corpus_and_its_ids(tmp_path)
  with open(ids_file, "r+b") as f:
    f.write(b"\x05\x00")  # The first id, <s>, now another word's.
  encoded.clear()
  with caplog.at_level("WARNING"):
    again = text_rows.TextCorpus("jsonl", str(path), "text", tok, str(tmp_path / "cache"), 0.2,
                                 "always")
  assert f"token ids {ids_file} have sha256 " in caplog.text and len(encoded) == len(records)
  assert_same_rows(all_rows(again), first)
