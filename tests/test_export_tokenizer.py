"""hybrid_nope/export/tokenizer.py: an export carries the tokenizer its run's config names.

The byte tokenizer's own encoding, the mds --tokenizer copy and its refusals are checked in
tests/test_export_hf.py beside the rest of the export; here, which tokenizer each kind of run
gets (issue 50, item 3: text-source runs exported none).
"""
import json
import os

import pytest

from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer
from hybrid_nope.export import hf
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.model.definition import init_model
from tests.helpers import tiny_config

TEXTS = ["def f(x):\n\treturn x  ", "héllo ✓ 😀"]


def _word_tokenizer(path) -> bytes:
  """A small tokenizers JSON file (not the byte tokenizer); returns its bytes."""
  import tokenizers
  from tokenizers import models, pre_tokenizers
  vocab = {"[UNK]": 0, "<s>": 1, "hello": 2, "world": 3}
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(path))
  return path.read_bytes()


def _export(config, out) -> list[str]:
  """What hf.export writes for `config` (a fresh initialisation standing in for a checkpoint)."""
  plan = export_tokenizer.plan(config, None)
  _, params = init_model(config.model, seed=0)
  files, _ = hf.write_model(str(out), config, params, plan)
  return files


@pytest.mark.parametrize("source", ["jsonl", "parquet", "hf"])
def test_a_byte_tokenised_text_run_exports_the_byte_tokenizer(source, tmp_path):
  import tokenizers
  config = tiny_config(data__source=source, data__path=str(tmp_path / "data"),
                       data__tokenizer="byte")
  plan = export_tokenizer.plan(config, None)
  assert "byte tokenizer" in plan.note and (plan.bos_id, plan.eos_id) == (256, 257)
  assert sorted(os.path.basename(f) for f in plan.write(str(tmp_path))) == [
      "tokenizer.json", "tokenizer_config.json"]
  tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  for text in TEXTS:
    assert tok.encode(text).ids == ByteTokenizer().encode(text, add_eos=False).tolist()
  with pytest.raises(export_tokenizer.TokenizerError, match="byte tokenizer.*drop --tokenizer"):
    export_tokenizer.plan(config, str(tmp_path / "tokenizer.json"))


def test_the_export_of_a_jsonl_byte_run_loads_in_transformers(tmp_path):
  config = tiny_config(data__source="jsonl", data__path=str(tmp_path / "train.jsonl"))
  assert config.data.tokenizer == "byte"  # The default: what a jsonl run tokenises with.
  out = tmp_path / "hf"
  names = sorted(os.path.basename(f) for f in _export(config, out))
  assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
  cfg = json.loads((out / "config.json").read_text())
  assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (256, 257)
  transformers = pytest.importorskip("transformers")
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  for text in TEXTS:
    assert tok(text)["input_ids"] == ByteTokenizer().encode(text, add_eos=False).tolist()
  assert (tok.bos_token_id, tok.eos_token_id) == (256, 257)


def test_a_run_with_data_tokenizer_exports_that_file_byte_for_byte(tmp_path):
  given = tmp_path / "tok" / "tokenizer.json"
  given.parent.mkdir()
  raw = _word_tokenizer(given)
  config = tiny_config(data__source="jsonl", data__path=str(tmp_path / "train.jsonl"),
                       data__tokenizer=str(given))
  out = tmp_path / "hf"
  names = sorted(os.path.basename(f) for f in _export(config, out))
  assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
  assert (out / "tokenizer.json").read_bytes() == raw
  assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == \
      "PreTrainedTokenizerFast"
  assert "config.data.tokenizer" in export_tokenizer.plan(config, None).note
  transformers = pytest.importorskip("transformers")
  assert transformers.AutoTokenizer.from_pretrained(str(out))("hello world")["input_ids"] == [2, 3]


def test_the_hf_files_beside_data_tokenizer_come_with_it(tmp_path):
  given = tmp_path / "tokenizer.json"
  _word_tokenizer(given)
  beside = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                       "eos_token": "[UNK]"}).encode()
  (tmp_path / "tokenizer_config.json").write_bytes(beside)
  config = tiny_config(data__source="parquet", data__tokenizer=str(given))
  plan = export_tokenizer.plan(config, None)
  assert (plan.bos_id, plan.eos_id) == (1, 0)
  out = tmp_path / "out"
  out.mkdir()
  assert sorted(os.path.basename(f) for f in plan.write(str(out))) == [
      "tokenizer.json", "tokenizer_config.json"]
  assert (out / "tokenizer_config.json").read_bytes() == beside


def test_a_missing_or_unfit_data_tokenizer_fails_in_one_line_naming_it(tmp_path):
  gone = str(tmp_path / "moved" / "tokenizer.json")
  config = tiny_config(data__source="jsonl", data__tokenizer=gone)
  with pytest.raises(export_tokenizer.TokenizerError,
                     match=f"^config.data.tokenizer={gone} does not exist") as caught:
    export_tokenizer.plan(config, None)
  assert "\n" not in str(caught.value)
  bad = tmp_path / "bad.json"
  bad.write_text("{}")
  config.data.tokenizer = str(bad)
  with pytest.raises(export_tokenizer.TokenizerError, match="is not a tokenizers JSON file"):
    export_tokenizer.plan(config, None)
  _word_tokenizer(bad)
  config.model.vocab_size = 3
  with pytest.raises(export_tokenizer.TokenizerError, match="vocab_size=3 is below the 4 ids"):
    export_tokenizer.plan(config, None)
  config.model.vocab_size = 258
  with pytest.raises(export_tokenizer.TokenizerError, match="copies itself; drop --tokenizer"):
    export_tokenizer.plan(config, str(bad))
