"""Reading a Hugging Face checkpoint's tensors (hybrid_nope/export/safetensors_dir.py): one file
or shards named by the index, the metadata, and each bad file or tensor named."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

from hybrid_nope.export import hf
from hybrid_nope.export.safetensors_dir import INDEX_FILE, Weights, WeightsError

TENSORS = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
           "b.weight": (np.arange(4, dtype=np.float32) - 1.5).astype(ml_dtypes.bfloat16),
           "c.weight": np.full((3,), 0.25, np.float16)}


def sharded(tmp_path, shards=(("a.weight",), ("b.weight", "c.weight"))) -> str:
  index = {"metadata": {"total_size": 0}, "weight_map": {}}
  for i, names in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    hf.write_safetensors(str(tmp_path / file), {n: TENSORS[n] for n in names},
                         metadata={"format": "pt", f"shard{i}": "yes"})
    index["weight_map"].update({n: file for n in names})
  (tmp_path / INDEX_FILE).write_text(json.dumps(index))
  return str(tmp_path)


def test_one_file_and_shards_read_the_same_tensors_and_metadata(tmp_path):
  (tmp_path / "one").mkdir()
  hf.write_safetensors(str(tmp_path / "one" / hf.WEIGHTS_FILE), TENSORS, {"format": "pt"})
  (tmp_path / "shards").mkdir()
  for directory in (str(tmp_path / "one"), sharded(tmp_path / "shards")):
    with Weights(directory) as weights:
      assert sorted(weights.file_of) == sorted(TENSORS)
      for name, want in TENSORS.items():
        assert weights.shape(name) == want.shape
        got = weights.get(name)
        assert got.dtype == want.dtype and np.array_equal(got, want)
  with Weights(str(tmp_path / "shards")) as weights:
    assert weights.metadata == {"format": "pt", "shard0": "yes", "shard1": "yes"}


def test_each_bad_file_or_tensor_is_named(tmp_path):
  with pytest.raises(WeightsError, match=f"has neither {hf.WEIGHTS_FILE} nor {INDEX_FILE}"):
    Weights(str(tmp_path))
  (tmp_path / hf.WEIGHTS_FILE).write_bytes(b"\x08" + b"\x00" * 7 + b"not json")
  with pytest.raises(WeightsError, match=f"{tmp_path / hf.WEIGHTS_FILE} cannot be read as "
                                         f"safetensors"):
    Weights(str(tmp_path))
  hf.write_safetensors(str(tmp_path / hf.WEIGHTS_FILE), {"ids": np.arange(3, dtype=np.int64)})
  with Weights(str(tmp_path)) as weights, pytest.raises(WeightsError, match="dtype int64"):
    weights.get("ids")
  (tmp_path / INDEX_FILE).write_text("{}")
  with pytest.raises(WeightsError, match=f"{INDEX_FILE}: expected JSON with a 'weight_map'"):
    Weights(str(tmp_path))


def test_an_index_naming_a_missing_shard_or_tensor_is_refused(tmp_path):
  directory = sharded(tmp_path)
  index = json.loads((tmp_path / INDEX_FILE).read_text())
  index["weight_map"]["d.weight"] = index["weight_map"]["a.weight"]  # Not in that shard.
  (tmp_path / INDEX_FILE).write_text(json.dumps(index))
  with Weights(directory) as weights, pytest.raises(WeightsError, match="tensor d.weight of"):
    weights.get("d.weight")
  os.remove(tmp_path / index["weight_map"]["c.weight"])
  with pytest.raises(WeightsError, match="model-00002-of-00002.safetensors cannot be read"):
    Weights(directory)
