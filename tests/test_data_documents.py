"""Tests for hybrid_nope.data.sources.documents and data.source="documents" (a small corpus written here):
the directory it writes, its rows, and the pipeline, check, validation, fingerprint and tokenizer
paths that read it."""
import json
import os

import numpy as np
import pytest

from hybrid_nope.data import check, fingerprint
from hybrid_nope.data.sources import registry
from hybrid_nope.data.sources import documents
from hybrid_nope.data.formats import mds
from hybrid_nope.data.pipeline import packing, loader
from hybrid_nope.data.tokenization.text_codec import text_codec
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer
from hybrid_nope.errors import ConfigError, UserError
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.validate import validate
from tests.helpers import tiny_config

CORPUS = {"name": "fake", "title": "A fake corpus", "licence": "public domain (made here)",
          "source": "tests/test_data_documents.py"}
FRACTION = 0.25
SEQ_LEN = 64  # tests.helpers.TINY's
# The byte tokenizer's exact tokenizers form (ids 0..255 bytes, BOS 256, EOS 257): the ids
# below are the bytes, so what is checked is the directory, not a tokenizer.
TOKENIZER = export_tokenizer.byte_level_tokenizer().to_str()


def _docs(count=40):
  """Documents of 20..300 bytes: several shorter than a row (padding), several longer."""
  rng = np.random.default_rng(0)
  words = ["and", "the", "light", "was", "good", "evening", "morning", "day", "’", "void"]
  return [(f"doc {i}", " ".join(rng.choice(words, int(rng.integers(4, 60)))).encode("utf-8")
           + b".\n") for i in range(count)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("documents") / "corpus")
  documents.write(out, _docs(), eval_fraction=FRACTION, corpus=CORPUS, tokenizer=TOKENIZER)
  return out


def _config(path, **overrides):
  eval_docs = documents.read_manifest(path)["splits"]["eval"]["documents"]
  values = dict(data__source="documents", data__path=path, metrics__probe_pool_rows=eval_docs,
                eval__batch_size=2, eval__num_batches=2)
  return tiny_config(**{**values, **overrides})


def test_write_splits_by_the_fixed_rule_and_reads_back(corpus):
  docs = _docs()
  manifest = documents.read_manifest(corpus)
  tokenizer = ByteTokenizer()
  for split in documents.SPLITS:
    want = [(n, d) for n, d in docs if documents.is_eval(n, FRACTION) == (split == "eval")]
    ids = documents.documents(corpus, split)
    assert [tokenizer.decode(x).encode("utf-8") for x in ids] == [d for _, d in want]
    assert all(x[0] == tokenizer.BOS_ID and x[-1] == tokenizer.EOS_ID for x in ids)
    ds = mds.MDSDataset(os.path.join(corpus, split))
    assert [ds[i]["name"] for i in range(len(ds))] == [n for n, _ in want]
    assert manifest["splits"][split] == {"documents": len(want),
                                         "bytes": sum(len(d) for _, d in want),
                                         "tokens": sum(len(d) + 2 for _, d in want)}
  assert {k: manifest[k] for k in CORPUS} == CORPUS
  assert (manifest["eval_fraction"], manifest["vocab_size"]) == (FRACTION, 258)


def test_train_rows_pack_as_the_stdlib_corpus_and_eval_rows_are_one_document_each(corpus):
  train = documents.train_rows(corpus, SEQ_LEN)
  expected = packing.pack_documents(list(documents.documents(corpus, "train")), SEQ_LEN)
  for key in packing.ROW_KEYS:
    np.testing.assert_array_equal(train[key], expected[key])
  assert not train["inputs"].flags.writeable
  rows = documents.eval_rows(corpus, SEQ_LEN)
  docs = documents.documents(corpus, "eval")
  assert rows["inputs"].shape == (len(docs), SEQ_LEN)
  padded = 0
  for r, ids in enumerate(docs):
    n = min(ids.size, SEQ_LEN)
    np.testing.assert_array_equal(rows["inputs"][r, :n], ids[:n])
    np.testing.assert_array_equal(rows["positions"][r, :n], np.arange(n))
    assert (rows["segment_ids"][r, :n] == 1).all() and (rows["segment_ids"][r, n:] == 0).all()
    assert rows["weights"][r].sum() == min(ids.size, SEQ_LEN + 1) - 1
    padded += n < SEQ_LEN
  assert padded > 0  # Short documents give the probe padding.


@pytest.mark.parametrize("docs, fraction, message", [
    ([("a", b"x"), ("a", b"y")], 0.5, "names repeat"),
    ([("a", b"x"), ("b", b"")], 0.5, "'b' has an empty name or no bytes"),
    ([("a", b"x")], 0.5, "leaves the .* split of 1 documents empty"),
    ([("a", b"x"), ("b", b"y")], 1.0, r"eval_fraction must be in \(0, 1\)"),
])
def test_write_refuses_what_it_cannot_split(tmp_path, docs, fraction, message):
  with pytest.raises(documents.DocumentsError, match=message):
    documents.write(str(tmp_path / "out"), docs, eval_fraction=fraction, corpus=CORPUS,
                    tokenizer=TOKENIZER)
  assert not (tmp_path / "out").exists()
  with pytest.raises(documents.DocumentsError, match=r"corpus needs non-empty strings \['licence'"):
    documents.write(str(tmp_path / "out"), _docs(), eval_fraction=FRACTION,
                    corpus={**CORPUS, "licence": ""}, tokenizer=TOKENIZER)


def test_a_missing_foreign_or_inconsistent_directory_fails_naming_the_file(tmp_path, corpus):
  with pytest.raises(documents.DocumentsError, match=f"{tmp_path}/corpus.json does not exist"):
    documents.read_manifest(str(tmp_path))
  (tmp_path / "corpus.json").write_text('{"format": "other"}')
  with pytest.raises(documents.DocumentsError, match="expected format 'hybrid_nope.documents'"):
    documents.read_manifest(str(tmp_path))
  copy = tmp_path / "copy"
  os.makedirs(copy)
  for name in (*documents.SPLITS, documents.TOKENIZER):
    os.symlink(os.path.join(corpus, name), copy / name)
  manifest = json.loads(open(os.path.join(corpus, "corpus.json")).read())
  manifest["splits"]["train"]["documents"] += 1
  (copy / "corpus.json").write_text(json.dumps(manifest))
  with pytest.raises(documents.DocumentsError, match="train/index.json holds .* documents but"):
    documents.documents(str(copy), "train")


def test_pipeline_reads_the_documents_source(corpus):
  config = _config(corpus)
  validate(config)
  batch = next(loader.train_iterator(config))
  assert batch["inputs"].shape == (2, SEQ_LEN) and batch["inputs"].max() < 258
  batches = loader.eval_batches(config)
  np.testing.assert_array_equal(batches[0]["inputs"],
                                documents.eval_rows(corpus, SEQ_LEN)["inputs"][:2])
  assert len(loader.probe_pool(config)["inputs"]) == config.metrics.probe_pool_rows
  assert loader.check_vocabulary(config) == 258
  with pytest.raises(ConfigError, match="model.vocab_size=200 .*tokenizer.json's 258"):
    loader.check_vocabulary(_config(corpus, model__vocab_size=200))
  everything = loader.probe_pool(_config(corpus, metrics__probe_pool_rows=999))
  assert len(everything["inputs"]) == config.metrics.probe_pool_rows  # All the eval documents.
  bigger_probe = loader.probe_pool(_config(corpus, metrics__probe_pool_rows=999,
                                           metrics__probe_batch_size=999))
  assert len(bigger_probe["inputs"]) == len(everything["inputs"])  # the probe measures them all


def test_validate_refuses_a_path_without_a_prepared_corpus_naming_data_path(tmp_path):
  config = tiny_config(data__source="documents", data__path=str(tmp_path / "missing"))
  with pytest.raises(ConfigError, match="config.data.path=.*missing.* is invalid: expected a "
                     "directory prepared by launch/prepare_prose.py.*make prose"):
    validate(config)
  validate(config, check_paths=False)


def test_check_reports_the_corpus_and_lists_a_missing_shard(corpus, tmp_path):
  text = check.check(_config(corpus)).text()
  assert "data.source=documents" in text and "A fake corpus (fake)" in text
  assert "licence: public domain (made here)" in text and text.endswith("OK: the data is in "
                                                                         "place for this config")
  assert f"{corpus}/tokenizer.json: 258 token ids" in text
  broken = tmp_path / "broken"
  os.makedirs(broken)
  for name in ("corpus.json", "train", "tokenizer.json"):
    os.symlink(os.path.join(corpus, name), broken / name)
  os.makedirs(broken / "eval")
  os.symlink(os.path.join(corpus, "eval", "index.json"), broken / "eval" / "index.json")
  with pytest.raises(check.DataCheckError, match=r"shard.00000.mds.*missing") as e:
    check.check(_config(str(broken), metrics__probe_pool_rows=1))
  header, problem, origin = str(e.value).splitlines()
  assert header == "1 problem with the data of this config (data.source=documents):"
  assert str(broken) in problem and "make prose" in origin
  assert 'docs/reproduce.md, "A second corpus: English prose"' in origin
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "reproduce.md")) as f:
    assert "\n## A second corpus: English prose\n" in f.read()


def test_fingerprint_text_codec_and_export_use_the_directory_tokenizer(corpus, tmp_path):
  config = _config(corpus)
  assert not registry.SOURCES["documents"].byte_tokens
  prints = fingerprint.data_fingerprint(config, loader.eval_batches(config))
  assert prints["data.source"] == "documents" and "train.tokens_sha1" in prints
  assert "data.eval_fraction" not in prints  # The split is the directory's, not the config's.
  codec = text_codec(config)
  assert codec.eos_id == ByteTokenizer.EOS_ID and codec.decode(codec.encode("light")) == "light"
  assert codec.encode("light")[0] == ByteTokenizer.BOS_ID
  plan = export_tokenizer.plan(config, None)
  assert f"tokenizer copied from {corpus}/tokenizer.json (258 tokens" in plan.note
  assert (plan.bos_id, plan.eos_id) == (ByteTokenizer.BOS_ID, ByteTokenizer.EOS_ID)
  written = plan.write(str(tmp_path))
  assert open(written[0]).read() == TOKENIZER


def test_another_tokenizer_changes_the_fingerprint(corpus, tmp_path):
  from hybrid_nope.data.tokenization import bpe  # pylint: disable=g-import-not-at-top
  other = str(tmp_path / "bpe")
  docs = _docs()
  documents.write(other, docs, eval_fraction=FRACTION, corpus=CORPUS,
                  tokenizer=bpe.train([d.decode() for _, d in docs], 270))
  prints = [fingerprint.data_fingerprint(c, loader.eval_batches(c))
            for c in (_config(corpus), _config(other))]
  assert prints[0]["train.tokens_sha1"] != prints[1]["train.tokens_sha1"]
  assert prints[0]["eval.rows_sha1"] != prints[1]["eval.rows_sha1"]


def test_a_byte_directory_of_the_earlier_format_is_refused_naming_it(corpus, tmp_path):
  old = tmp_path / "old"
  os.makedirs(old)
  for split in documents.SPLITS:
    os.symlink(os.path.join(corpus, split), old / split)
  manifest = json.loads(open(os.path.join(corpus, "corpus.json")).read())
  del manifest["tokenizer"]  # As the byte-tokenised `make prose` wrote it.
  (old / "corpus.json").write_text(json.dumps(manifest))
  for read in (documents.read_manifest, lambda p: documents.documents(p, "eval")):
    with pytest.raises(documents.DocumentsError) as e:
      read(str(old))
    assert str(e.value).startswith(f"{old} holds byte-tokenised documents prepared before")
    assert "\n" not in str(e.value) and "make prose" in str(e.value)
