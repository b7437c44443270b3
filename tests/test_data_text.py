"""Text sources (data.source jsonl, parquet, hf): reading, on-the-fly tokenisation, packing as
MDS raw domains are, per-process shards, exact resume from rows consumed, fsspec URLs, the
length index's cache, and the one-line refusals. Small files the tests write
(tests/text_sources.py); the training runs end to end are test_data_text_end_to_end.py."""
import json
import os

import fsspec
import numpy as np
import pytest

from hybrid_nope import errors, validate
from hybrid_nope.data import fingerprint
from hybrid_nope.data.formats import mds, text_files
from hybrid_nope.data.pipeline import packing, loader
from hybrid_nope.data.sources import prolong
from hybrid_nope.data.tokenization import text_codec
from hybrid_nope.data.formats import text_index
from hybrid_nope.data.sources import text_rows
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer
from tests import text_sources
from tests.helpers import (assert_process_shards_interleave, assert_same_batches, take,
                           tiny_config)

T = 64


def config(source, path, tmp_path, **overrides):
  return tiny_config(**{**dict(data__source=source, data__path=str(path),
                               data__cache_dir=str(tmp_path / "cache"), data__eval_fraction=0.2,
                               data__seq_len=T, data__batch_size=4,
                               metrics__probe_pool_rows=4), **overrides})


@pytest.fixture(params=text_sources.SOURCES)
def source(request):
  return request.param


@pytest.fixture
def corpus(source, tmp_path):
  records = text_sources.documents()
  return source, text_sources.write(source, tmp_path / "data", records), records


def test_each_format_reads_every_document_in_order_and_by_index(corpus, tmp_path):
  source, path, records = corpus
  readers = text_files.readers(source, path, "text")
  assert len(readers) == 2  # two files, or a saved dataset's two arrow shards
  scanned = [t for r in readers for batch in r.scan() for t in batch]
  assert scanned == [r["text"] for r in records]
  by_index = [r.text(i) for r in readers for i in reversed(range(len(
      r.offsets) - 1 if hasattr(r, "offsets") else int(r.group_rows.sum())))]
  assert sorted(by_index) == sorted(scanned)


def test_a_glob_and_a_single_file_name_their_files(tmp_path):
  text_sources.write("jsonl", tmp_path, text_sources.documents(10))
  assert [p for _, p in text_files.files("jsonl", str(tmp_path / "part-1.jsonl"))] == [
      str(tmp_path / "part-1.jsonl")]
  assert len(text_files.files("jsonl", str(tmp_path / "part-*.jsonl"))) == 2


def test_rows_are_packed_exactly_as_an_mds_raw_domain_of_the_same_tokens(corpus, tmp_path):
  """The train split's byte tokens written as a raw MDS domain (one document per sample)
  gives the same rows, row for row: one packing for every source."""
  source, path, records = corpus
  c = text_rows.corpus(config(source, path, tmp_path))
  tokenizer = ByteTokenizer()
  train = [tokenizer.encode(records[d]["text"]) for d in c.documents["train"]]
  mds.write_mds(str(tmp_path / "mds"), {"input_ids": "ndarray:int32"},
                ({"input_ids": ids} for ids in train))
  for masking in (True, False):
    domain = prolong.DomainRows(str(tmp_path / "mds"), seq_len=T, document_masking=masking,
                                vocab_size=258, cache_dir=str(tmp_path / "mds_cache"))
    rows = c.rows("train", T, masking)
    assert len(rows) == len(domain) == -(-(sum(map(len, train)) - 1) // T)
    assert_same_batches([rows[k] for k in range(len(rows))],
                        [domain[k] for k in range(len(domain))])
  # ...and, but for the padded last row, as the in-memory packing of the stdlib corpus.
  packed, rows = packing.pack_documents(train, T), c.rows("train", T, True)
  assert_same_batches([rows[k] for k in range(len(packed["inputs"]))],
                      [{k: v[i] for k, v in packed.items()} for i in range(len(packed["inputs"]))])


def test_the_split_follows_the_stdlib_rule_on_file_and_record(corpus, tmp_path):
  source, path, records = corpus
  c = text_rows.corpus(config(source, path, tmp_path))
  names = [f"{os.path.basename(r.name)}:{i}" for r in c.readers
           for i in range(int(c.index.counts[c.readers.index(r)]))]
  from hybrid_nope.data.sources.stdlib_corpus import is_eval_path  # pylint: disable=g-import-not-at-top
  assert [d for d, n in enumerate(names) if is_eval_path(n, 0.2)] == list(c.documents["eval"])
  assert 0 < len(c.documents["eval"]) < len(records)


def test_eval_rows_are_the_eval_stream_in_order(corpus, tmp_path):
  source, path, _ = corpus
  cfg = config(source, path, tmp_path)
  rows = text_rows.corpus(cfg).rows("eval", T, True)
  batches = loader.eval_batches(cfg)
  assert_same_batches(batches, [{k: np.stack([rows[2 * b + i][k] for i in range(2)])
                                 for k in packing.ROW_KEYS} for b in range(2)])
  np.testing.assert_array_equal(loader.probe_pool(cfg)["inputs"],
                                np.stack([rows[i]["inputs"] for i in range(4)]))


def test_two_processes_read_disjoint_rows_that_cover_each_epoch(corpus, tmp_path, monkeypatch):
  source, path, _ = corpus
  cfg = config(source, path, tmp_path, data__batch_size=2)  # One row per process and batch.
  num_rows = len(text_rows.corpus(cfg).rows("train", T, True))
  read = {0: [], 1: []}
  original = packing.StreamRows.__getitem__
  for p in range(2):
    monkeypatch.setattr(packing.StreamRows, "__getitem__",
                        lambda self, k, p=p: read[p].append(k) or original(self, k))
    it = loader.train_iterator(cfg, process_index=p, process_count=2)
    read[p].clear()  # Without the first global batch, which the iterator reads to check it.
    take(it, (num_rows + 1 - p) // 2)  # Global rows p, p + 2, ... of the first epoch.
  assert not set(read[0]) & set(read[1])
  assert sorted(read[0] + read[1]) == list(range(num_rows))
  monkeypatch.setattr(packing.StreamRows, "__getitem__", original)
  cfg.data.batch_size = 4
  whole = take(loader.train_iterator(cfg), 3)
  shards = [take(loader.train_iterator(cfg, process_index=p, process_count=2), 3)
            for p in range(2)]
  assert_process_shards_interleave(shards, whole)


def test_a_resume_from_the_rows_consumed_reads_on_exactly(corpus, tmp_path):
  source, path, _ = corpus
  cfg = config(source, path, tmp_path)
  whole = take(loader.train_iterator(cfg), 12)  # past one epoch: reshuffled
  resumed = loader.train_iterator(cfg, start_row=7 * 4)
  assert_same_batches(take(resumed, 5), whole[7:])
  it = loader.train_iterator(cfg)
  take(it, 3)
  state = it.get_state()
  again = loader.train_iterator(cfg)
  again.set_state(state)
  assert_same_batches(take(again, 4), whole[3:7])


def test_a_url_reads_as_the_local_files(corpus, tmp_path):
  source, path, _ = corpus
  fs = fsspec.filesystem("memory")
  for name in sorted(os.listdir(path)):
    fs.pipe_file(f"/text-{source}/{name}", open(os.path.join(path, name), "rb").read())
  local, remote = (config(source, p, tmp_path) for p in (path, f"memory://text-{source}"))
  assert_same_batches(take(loader.train_iterator(remote), 4),
                      take(loader.train_iterator(local), 4))
  assert_same_batches(loader.eval_batches(remote), loader.eval_batches(local))


def tiny_tokenizer(path):
  """A word-level tokenizer.json: the words of text_sources.documents, [UNK], and <s> before
  each document (its post-processor)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  words = ["<s>", "[UNK]", "alpha", "beta", "gamma", "délta", "εψιλον", "zeta", "eta"]
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
  tok.save(str(path))
  return tok


def test_a_tokenizer_json_tokenises_on_the_fly(tmp_path):
  tok = tiny_tokenizer(tmp_path / "tokenizer.json")
  records = text_sources.documents()
  path = text_sources.write("jsonl", tmp_path / "data", records)
  cfg = config("jsonl", path, tmp_path, data__tokenizer=str(tmp_path / "tokenizer.json"),
               model__vocab_size=9)
  c = text_rows.corpus(cfg)
  stream = np.concatenate([tok.encode(records[d]["text"]).ids for d in c.documents["train"]])
  rows = c.rows("train", T, True)
  np.testing.assert_array_equal(np.concatenate([rows[k]["inputs"] for k in range(len(rows))])[
      :stream.size], stream)
  assert loader.check_vocabulary(cfg) == 9
  cfg.model.vocab_size = 8
  with pytest.raises(errors.ConfigError, match="tokenizer.json's 9 token ids"):
    loader.check_vocabulary(cfg)
  codec = text_codec.text_codec(cfg)
  np.testing.assert_array_equal(codec.encode("beta zeta"), [0, 3, 7])


def test_an_empty_text_without_special_tokens_is_named_in_a_warning_and_adds_nothing(
    tmp_path, caplog):
  tok = tiny_tokenizer(tmp_path / "tokenizer.json")
  tok.post_processor = None  # No <s>: an empty text gives no token.
  tok.save(str(tmp_path / "tokenizer.json"))
  records = [{"text": "alpha beta " * 9}] * 20
  records[7] = {"text": ""}
  path = text_sources.write("jsonl", tmp_path / "data", records, files=1)
  with caplog.at_level("WARNING"):
    c = text_rows.TextCorpus("jsonl", path, "text", str(tmp_path / "tokenizer.json"),
                             str(tmp_path / "cache"), 0.2, True)
  assert "1 documents give no tokens with data.tokenizer (the first: " in caplog.text
  assert "part-0.jsonl line 8)" in caplog.text and c.index.lengths[7] == 0
  rows = c.rows("train", T, True)
  assert len(rows) == -(-(int(c.index.lengths[c.documents["train"]].sum()) - 1) // T)


def test_the_byte_tokenizer_is_the_text_codec_of_a_byte_tokenised_text_source(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", text_sources.documents(10))
  codec = text_codec.text_codec(config("jsonl", path, tmp_path))
  assert codec.eos_id == ByteTokenizer.EOS_ID and codec.decode(codec.encode("ab")) == "ab"


def test_the_index_is_cached_and_rebuilt_when_a_file_changes(tmp_path, monkeypatch):
  records = text_sources.documents()
  path = text_sources.write("jsonl", tmp_path / "data", records)
  cfg = config("jsonl", path, tmp_path)
  first = text_rows.corpus(cfg)
  assert len(os.listdir(tmp_path / "cache" / text_index.SUBDIR)) == 1

  def no_build(*args):
    raise AssertionError("the cached index was not used")
  monkeypatch.setattr(text_index, "_build", no_build)
  again = text_rows.TextCorpus("jsonl", path, "text", "byte", str(tmp_path / "cache"), 0.2,
                               True)
  np.testing.assert_array_equal(again.index.lengths, first.index.lengths)
  np.testing.assert_array_equal(again.readers[1].offsets, first.readers[1].offsets)
  assert again.rows("train", T, True)[3]["inputs"].tolist() == first.rows(
      "train", T, True)[3]["inputs"].tolist()
  monkeypatch.undo()
  text_sources.write_jsonl(os.path.join(path, "part-1.jsonl"), records[30:][::-1])
  changed = text_rows.corpus(cfg)
  assert changed is not first and len(os.listdir(tmp_path / "cache" / text_index.SUBDIR)) == 2
  assert fingerprint.data_fingerprint(cfg, [])["text.index_sha1"] != first.fingerprint()[
      "text.index_sha1"]


def test_a_document_changed_in_place_since_its_index_fails_naming_it(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", [{"text": "abcdef"}] * 40, files=1)
  c = text_rows.TextCorpus("jsonl", path, "text", "byte", str(tmp_path / "cache"), 0.2,
                               True)
  file = os.path.join(path, "part-0.jsonl")
  lines = open(file, encoding="utf-8").read().splitlines(keepends=True)
  lines[5] = json.dumps({"text": "é"}) + "\n"  # "\u00e9": the same bytes, 2 tokens fewer
  assert len(lines[5]) == len(json.dumps({"text": "abcdef"}) + "\n")
  open(file, "w", encoding="utf-8").write("".join(lines))
  with pytest.raises(text_files.TextDataError,
                     match=r"part-0.jsonl line 6 tokenises to 4 tokens, but its index says 8"):
    for d in range(40):
      c.tokens(d)



def test_blank_lines_at_the_end_and_in_the_middle_of_a_jsonl_file_are_skipped(tmp_path):
  """As pyarrow's JSON reader (`datasets`') and pandas skip them; the documents around them,
  the index and the lines named in messages are those of the file without them."""
  docs = [json.dumps({"text": t}) + "\n" for t in ("alpha", "beta", "gamma", "delta")]
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "a.jsonl").write_text(
      "\n" + docs[0] + docs[1] + "  \n\n" + docs[2] + docs[3] + "\n \t\n")
  reader, = text_files.readers("jsonl", str(tmp_path / "data"), "text")
  assert [t for batch in reader.scan() for t in batch] == ["alpha", "beta", "gamma", "delta"]
  assert [reader.text(i) for i in range(4)] == ["alpha", "beta", "gamma", "delta"]
  assert [reader.where(i).rsplit(" ", 1)[1] for i in range(4)] == ["2", "3", "6", "7"]
  c = text_rows.TextCorpus("jsonl", str(tmp_path / "data"), "text", "byte",
                           str(tmp_path / "cache"), 0.25, True)
  assert c.index.lengths.size == 4  # Byte tokens of each text, with its <eos>.
  (tmp_path / "data" / "a.jsonl").write_text(docs[0] + "\n" + '{"text": \n')
  with pytest.raises(text_files.TextDataError, match=r"a.jsonl line 3 is not JSON"):
    list(text_files.readers("jsonl", str(tmp_path / "data"), "text")[0].scan())

def write_bad(kind, tmp_path):
  """(source, data.path) of a corpus with one fault of `kind`."""
  d = tmp_path / "bad"
  d.mkdir()
  good = [{"text": "fine"}] * 3
  if kind == "jsonl-missing-field":
    text_sources.write_jsonl(d / "a.jsonl", good + [{"body": "x"}])
  elif kind == "jsonl-number":
    text_sources.write_jsonl(d / "a.jsonl", good + [{"text": 7}])
  elif kind == "jsonl-null":
    text_sources.write_jsonl(d / "a.jsonl", good + [{"text": None}])
  elif kind == "jsonl-not-json":
    (d / "a.jsonl").write_text('{"text": "fine"}\n{"text": \n')
  elif kind == "jsonl-empty":
    (d / "a.jsonl").write_text("")
  elif kind == "parquet-missing-column":
    text_sources.write_parquet(d / "a.parquet", [{"body": "x"}])
  elif kind == "parquet-number":
    text_sources.write_parquet(d / "a.parquet", [{"text": 1}, {"text": 2}])
  elif kind == "parquet-null":
    text_sources.write_parquet(d / "a.parquet", good + [{"text": None}])
  elif kind == "parquet-empty":
    (d / "a.parquet").write_bytes(b"")
  elif kind == "parquet-no-rows":
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), d / "a.parquet")
  elif kind == "hf-number":
    text_sources.write_saved_dataset(d, [{"text": 1}] * 3, shards=1)
    return "hf", str(d), "data-00000-of-00001.arrow"
  elif kind == "hf-not-saved":
    return "hf", str(d), str(d)
  elif kind == "hf-no-train-split":
    text_sources.write_saved_dataset_dict(d, {"validation": good})
    return "hf", str(d), str(d)
  source = kind.split("-")[0]
  return source, str(d), f"a.{source}"


BAD = {
    "jsonl-missing-field": ("line 4: no field 'text' .*config.data.text_field", "data.text_field"),
    "jsonl-number": ("line 4: field 'text' is int, expected a string", "data.text_field"),
    "jsonl-null": ("line 4: field 'text' is NoneType, expected a string", "data.text_field"),
    "jsonl-not-json": ("line 2 is not JSON", "data.path"),
    "jsonl-empty": ("the file is empty", "data.path"),
    "parquet-missing-column": ("no column 'text' .*'body'", "data.text_field"),
    "parquet-number": ("column 'text' is int64, expected a string column", "data.text_field"),
    "parquet-null": ("row 3: field 'text' is NoneType", "data.text_field"),
    "parquet-empty": ("is not a parquet file", "data.path"),
    "parquet-no-rows": ("holds no rows", "data.path"),
    "hf-number": ("column 'text' is int64, expected a string column", "data.text_field"),
    "hf-not-saved": ("is not a directory written by datasets' save_to_disk", "data.path"),
    "hf-no-train-split": ("splits \\['validation'\\] but no 'train'", "data.path"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_file_fails_in_one_line_naming_the_file_and_the_key(kind, tmp_path):
  source, path, file = write_bad(kind, tmp_path)
  with pytest.raises(errors.UserError) as e:
    text_rows.corpus(config(source, path, tmp_path))
  message = str(e.value)
  assert "\n" not in message and file in message and BAD[kind][1] in message, message
  assert __import__("re").search(BAD[kind][0], message), message


@pytest.mark.parametrize("path, match", [
    ("missing.jsonl", "does not exist"), ("nothing-*.jsonl", "matches no files"),
    (".", "is a directory without .jsonl/.json files")])
def test_a_bad_path_names_the_key(path, match, tmp_path):
  (tmp_path / "notes.txt").write_text("not data")
  with pytest.raises(errors.UserError, match=f"config.data.path=.*{match}"):
    text_rows.corpus(config("jsonl", tmp_path / path, tmp_path))


@pytest.mark.parametrize("key, value, match", [
    ("data.path", "", "config.data.path='' is invalid"),
    ("data.text_field", "", "config.data.text_field='' is invalid"),
    ("data.tokenizer", "", "config.data.tokenizer='' is invalid"),
    ("data.eval_fraction", 1.5, "config.data.eval_fraction=1.5 is invalid")])
def test_validate_names_a_bad_text_key(key, value, match, tmp_path):
  cfg = config("parquet", tmp_path, tmp_path)
  section, name = key.split(".")
  cfg[section][name] = value
  with pytest.raises(errors.ConfigError, match=match):
    validate.validate(cfg)


def test_a_bad_tokenizer_file_and_an_empty_split_name_their_keys(tmp_path):
  path = text_sources.write("jsonl", tmp_path / "data", text_sources.documents(4), files=1)
  (tmp_path / "tokenizer.json").write_text("{}")
  with pytest.raises(errors.ConfigError, match=r"tokenizer.json \(config.data.tokenizer\) is "
                     "not a tokenizers JSON file"):
    text_rows.corpus(config("jsonl", path, tmp_path, data__tokenizer=str(tmp_path /
                                                                        "tokenizer.json")))
  with pytest.raises(errors.ConfigError, match="config.data.eval_fraction=0.001 leaves the eval "
                     "split of the 4 documents"):
    text_rows.corpus(config("jsonl", path, tmp_path, data__eval_fraction=0.001))


def test_our_saved_dataset_layout_is_what_datasets_writes(tmp_path):
  """Where `datasets` is installed (it is not a dependency: skipped otherwise), its own
  save_to_disk directory reads as ours does."""
  datasets = pytest.importorskip("datasets")
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  records = text_sources.documents()
  # A fingerprint given: datasets' own hashing of a table may fail on a newer pyarrow.
  ours = text_sources.write("hf", tmp_path / "ours", records)
  datasets.Dataset(pa.Table.from_pylist(records), fingerprint="t").save_to_disk(
      str(tmp_path / "theirs"), num_shards=2)
  for name in ("state.json", "dataset_info.json"):
    assert json.load(open(os.path.join(ours, name))) == json.load(
        open(tmp_path / "theirs" / name)) | ({"_fingerprint": "tests"} if name == "state.json"
                                             else {})
  read = [[t for r in text_files.readers("hf", p, "text") for b in r.scan() for t in b]
          for p in (ours, str(tmp_path / "theirs"))]
  assert read[0] == read[1] == [r["text"] for r in records]
