"""Tests for hybrid_nope.data.sources.textbook_chapters: the tfds builder (array_record, no TensorFlow),
its tokenisation through a tokenizer.json, and the eval rows read back through grain.

The tokenizer is a tiny WordLevel model trained here in-process (nothing is fetched); the
chapters are tests/testdata/textbook_chapters/chapters.jsonl.
"""

import json
import os

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, processors, trainers

from hybrid_nope import errors
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import textbook_chapters as tc
from hybrid_nope.errors import UserError

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
CHAPTERS = os.path.join(TESTDATA, "textbook_chapters", "chapters.jsonl")
BOS = 1


def read_chapters():
  with open(CHAPTERS) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
  """A WordLevel tokenizer.json trained on the chapters, adding <bos> like Llama-3 does."""
  tokenizer = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.train_from_iterator([c["text"] for c in read_chapters()],
                                trainers.WordLevelTrainer(special_tokens=["<unk>", "<bos>"]))
  tokenizer.post_processor = processors.TemplateProcessing(
      single="<bos> $A", special_tokens=[("<bos>", BOS)])
  path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
  tokenizer.save(str(path))
  return str(path)


@pytest.fixture(scope="module")
def prepared(tokenizer_path, tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  return tc.prepare(os.path.dirname(CHAPTERS), str(data_dir), tokenizer=tokenizer_path)


def all_ids(directory):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  source = tfds.builder_from_directory(directory).as_data_source(tc.SPLIT)
  return [source[i]["input_ids"] for i in range(len(source))]


def test_builds_array_record_tokenised_in_source_order(prepared, tokenizer_path):
  assert prepared.endswith(os.path.join("textbook_chapters", "default", "1.0.0"))
  assert any(".array_record" in f for f in os.listdir(prepared))
  tokenizer = tokenizers.Tokenizer.from_file(tokenizer_path)
  ids = all_ids(prepared)
  chapters = read_chapters()
  assert len(ids) == len(chapters)
  for got, chapter in zip(ids, chapters):
    assert got.dtype == np.int32 and got[0] == BOS
    np.testing.assert_array_equal(got, tokenizer.encode(chapter["text"]).ids)


def test_parquet_and_pretokenised_sources(prepared, tokenizer_path, tmp_path):
  chapters = read_chapters()
  pq.write_table(pa.table({"text": [c["text"] for c in chapters[:5]]}),
                 tmp_path / "train-00000-of-00002.parquet")
  pq.write_table(pa.table({"text": [c["text"] for c in chapters[5:]]}),
                 tmp_path / "train-00001-of-00002.parquet")
  from_parquet = tc.prepare(str(tmp_path), str(tmp_path / "out"), tokenizer=tokenizer_path)
  expected = all_ids(prepared)
  for a, b in zip(all_ids(from_parquet), expected, strict=True):
    np.testing.assert_array_equal(a, b)

  pretokenised = tmp_path / "ids" / "chapters.jsonl"
  pretokenised.parent.mkdir()
  pretokenised.write_text("".join(json.dumps({"input_ids": ids.tolist()}) + "\n"
                                  for ids in expected))
  direct = tc.prepare(str(pretokenised), str(tmp_path / "out2"), name="ids")
  for a, b in zip(all_ids(direct), expected, strict=True):
    np.testing.assert_array_equal(a, b)


def test_bad_sources_fail_naming_the_record(tokenizer_path, tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tc.prepare(str(tmp_path / "nope"), str(tmp_path / "o1"), tokenizer=tokenizer_path)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"title": "x"}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:1 has no string field 'text'"):
    tc.prepare(str(bad), str(tmp_path / "o2"), tokenizer=tokenizer_path)
  with pytest.raises(ValueError, match=r"bad\.jsonl:1 has no 'input_ids'.*tokenizer\.json"):
    tc.prepare(str(bad), str(tmp_path / "o3"))
  bad.write_text('{"text": "a"}\nnot json\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl line 2 is not valid JSON"):
    tc.prepare(str(bad), str(tmp_path / "o4"), tokenizer=tokenizer_path)


def test_a_folder_of_txt_files_is_one_record_per_file(tmp_path):
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "two.txt").write_text("second text\n")
  (tmp_path / "a.txt").write_text("first ✓")
  files = tc.source_files(str(tmp_path))
  assert files == [str(tmp_path / "a.txt"), str(tmp_path / "b" / "two.txt")]
  assert [list(tc.read_records(f, ("text", "input_ids"))) for f in files] == [
      [(files[0], {"text": "first ✓"})], [(files[1], {"text": "second text\n"})]]


def test_eval_rows_are_chapters_from_their_first_token(prepared):
  seq_len = 64
  rows = tc.eval_rows(prepared, seq_len=seq_len, num_rows=8, vocab_size=1000)
  chapters = {tuple(ids[:seq_len + 1]): ids for ids in all_ids(prepared)}
  for i in range(8):
    n = int((rows["segment_ids"][i] > 0).sum())  # real input tokens
    ids = next(full for head, full in chapters.items()
               if head[:n] == tuple(rows["inputs"][i][:n]))
    assert n == min(ids.size, seq_len)
    np.testing.assert_array_equal(rows["inputs"][i][:n], ids[:n])
    np.testing.assert_array_equal(rows["positions"][i][:n], np.arange(n))
    targets = min(ids.size - 1, seq_len)
    np.testing.assert_array_equal(rows["targets"][i][:targets], ids[1:targets + 1])
    np.testing.assert_array_equal(rows["weights"][i], np.arange(seq_len) < targets)
  # a fixed-seed shuffle: the same rows every time, not the file's first chapters
  again = tc.eval_rows(os.path.dirname(os.path.dirname(os.path.dirname(prepared))),
                       seq_len=seq_len, num_rows=8, vocab_size=1000)
  for key in rows:
    np.testing.assert_array_equal(rows[key], again[key])


def test_eval_rows_errors(prepared, tmp_path):
  with pytest.raises(ValueError, match=r"config\.eval\.num_batches asks for 13 eval rows.*12"):
    tc.eval_rows(prepared, seq_len=16, num_rows=13, vocab_size=1000)
  with pytest.raises(ValueError, match=r"chapter \d+ \(.*chapters\.jsonl:\d+\).*outside \[0, model\.vocab_size=3\)"):
    tc.eval_rows(prepared, seq_len=16, num_rows=2, vocab_size=3)
  with pytest.raises(tc.EvalDataError, match=r"config\.eval\.path.*found none"):
    tc.eval_rows(str(tmp_path), seq_len=16, num_rows=2, vocab_size=1000)


def test_eval_batches_of_the_mds_source(prepared):
  config = ml_collections.ConfigDict({
      "data": {"source": "mds", "seq_len": 32}, "model": {"vocab_size": 1000},
      "eval": {"path": prepared, "batch_size": 3, "num_batches": 2}})
  batches = loader.eval_batches(config)
  assert len(batches) == 2
  for batch in batches:
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: ((3, 32), np.float32 if k == "weights" else np.int32) for k in loader.BATCH_KEYS}
  config.eval.path = ""
  with pytest.raises(ValueError, match=r"config\.eval\.path"):
    loader.eval_batches(config)


def mds_eval_config(path, **eval_overrides):
  return ml_collections.ConfigDict({
      "data": {"source": "mds", "seq_len": 32}, "model": {"vocab_size": 1000},
      "eval": {"path": str(path), "batch_size": 3, "num_batches": 2, **eval_overrides}})


def one_line_user_error(call) -> str:
  with pytest.raises(UserError) as e:
    call()
  assert "\n" not in str(e.value)
  return str(e.value)


def test_an_empty_eval_directory_is_a_one_line_error_naming_eval_path(tmp_path):
  message = one_line_user_error(lambda: loader.eval_batches(mds_eval_config(tmp_path)))
  assert message.startswith(f"config.eval.path={str(tmp_path)!r} must be a prepared "
                            f"TextbookChapters directory") and message.endswith("found none")


def test_a_broken_prepared_directory_is_a_one_line_error_naming_it(prepared, tmp_path):
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "dataset_info.json").write_text("{not json")
  message = one_line_user_error(lambda: loader.eval_batches(mds_eval_config(broken)))
  assert message.startswith(f"config.eval.path={str(broken)!r}: {broken} is not a readable "
                            f"prepared TextbookChapters set")


def test_more_eval_batches_than_chapters_is_a_one_line_error_naming_num_batches(prepared):
  message = one_line_user_error(
      lambda: loader.eval_batches(mds_eval_config(prepared, num_batches=5)))
  assert message == (f"config.eval.num_batches asks for 15 eval rows but {prepared} "
                     f"(config.eval.path) has only 12 chapters")


def test_a_probe_pool_larger_than_the_chapters_takes_them_all(prepared):
  """probe_pool_rows is the most rows to choose from (issue 50, item 5: it was refused); a
  smaller pool reads the same first rows of the fixed order as before."""
  config = mds_eval_config(prepared)
  config.metrics = ml_collections.ConfigDict({"probe_pool_rows": 256, "probe_batch_size": 4})
  pool = loader.probe_pool(config)
  every = tc.eval_rows(prepared, seq_len=32, num_rows=12, vocab_size=1000)
  assert len(pool["inputs"]) == 12
  for k in loader.BATCH_KEYS:
    np.testing.assert_array_equal(pool[k], every[k])
  config.metrics.probe_pool_rows = 5
  for k in loader.BATCH_KEYS:
    np.testing.assert_array_equal(loader.probe_pool(config)[k], every[k][:5])


def test_prepare_keeps_the_tokenizer_and_the_vocabulary_is_checked_against_it(
    prepared, tokenizer_path, tmp_path):
  copy = os.path.join(prepared, "tokenizer.json")
  assert open(copy, "rb").read() == open(tokenizer_path, "rb").read()
  size = tokenizers.Tokenizer.from_file(tokenizer_path).get_vocab_size(with_added_tokens=True)
  data = tmp_path / "prolong"
  data.mkdir()
  config = mds_eval_config(prepared)
  config.data.path = str(data)
  config.model.vocab_size = size
  assert loader.check_vocabulary(config) == size
  config.model.vocab_size = size - 1
  with pytest.raises(errors.ConfigError) as e:
    loader.check_vocabulary(config)
  assert str(e.value) == (f"config.model.vocab_size={size - 1} is smaller than {copy}'s {size} "
                          f"token ids: pass --config.model.vocab_size={size} or more")
  # A tokenizer.json beside the training domains is checked too.
  bigger = tokenizers.Tokenizer.from_file(tokenizer_path)
  bigger.add_tokens([f"extra{i}" for i in range(10)])
  bigger.save(str(data / "tokenizer.json"))
  config.model.vocab_size = size
  with pytest.raises(errors.ConfigError, match=rf"{data / 'tokenizer.json'}'s {size + 10} "):
    loader.check_vocabulary(config)
  (data / "tokenizer.json").write_text("{}")
  with pytest.raises(errors.ConfigError, match="is not a tokenizers JSON file"):
    loader.check_vocabulary(config)


def test_pretokenised_eval_data_carries_no_tokenizer(tmp_path):
  source = tmp_path / "ids.jsonl"
  source.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
  prepared = tc.prepare(str(source), str(tmp_path / "tfds"))
  assert not os.path.exists(os.path.join(prepared, "tokenizer.json"))
  config = mds_eval_config(prepared)
  config.data.path = str(tmp_path)
  assert loader.check_vocabulary(config) is None
