"""The tensors of a Hugging Face checkpoint directory: model.safetensors, or the shards that
model.safetensors.index.json names, read one tensor at a time with safetensors' numpy loader
(bfloat16 as ml_dtypes'), so a model is never held twice. Local files only."""
from __future__ import annotations

import contextlib
import json
import os

import ml_dtypes
import numpy as np

from hybrid_nope.errors import UserError
from hybrid_nope.export.hf import WEIGHTS_FILE

INDEX_FILE = "model.safetensors.index.json"
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


class WeightsError(UserError):
  """A weights file or index that cannot be read as float safetensors; names the file."""


class Weights:
  """The checkpoint's tensors (model.safetensors, or the shards model.safetensors.index.json
  names): `file_of` {name: file}, `metadata` (the files' headers' __metadata__, merged),
  `shape(name)` from the header alone, `get(name)` reads one. Use as a context manager."""

  def __init__(self, hf_dir: str):
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    index, single = os.path.join(hf_dir, INDEX_FILE), os.path.join(hf_dir, WEIGHTS_FILE)
    if os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
        file_of = {name: os.path.join(hf_dir, file) for name, file in weight_map.items()}
      except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise WeightsError(f"{index}: expected JSON with a 'weight_map' of tensor name -> "
                           f"shard file ({type(e).__name__}: {e})") from None
    elif os.path.isfile(single):
      file_of = None
    else:
      raise WeightsError(f"{hf_dir} has neither {WEIGHTS_FILE} nor {INDEX_FILE}: expected "
                         f"safetensors weights (a pytorch_model.bin is not read; transformers' "
                         f"save_pretrained writes safetensors)")
    self._stack, self._open = contextlib.ExitStack(), {}
    for path in sorted(set(file_of.values())) if file_of else [single]:
      try:
        self._open[path] = self._stack.enter_context(safe_open(path, framework="np"))
      except Exception as e:  # safetensors raises its own kinds for a missing or bad file.
        self.close()
        raise WeightsError(f"{path} cannot be read as safetensors ({type(e).__name__}: "
                           f"{str(e)[:200]})") from None
    self.file_of = file_of or {name: single for name in self._open[single].keys()}
    self.metadata = {}
    for handle in self._open.values():
      self.metadata.update(handle.metadata() or {})

  def __enter__(self) -> "Weights":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _call(self, name: str, read):
    """read(handle) for the file holding `name`; a name its file lacks names both."""
    try:
      return read(self._open[self.file_of[name]])
    except Exception as e:  # safetensors' own kinds: a listed name its shard lacks, say.
      raise WeightsError(f"tensor {name} of {self.file_of[name]} cannot be read "
                         f"({type(e).__name__}: {str(e)[:200]})") from None

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._call(name, lambda f: f.get_slice(name).get_shape()))

  def get(self, name: str) -> np.ndarray:
    array = self._call(name, lambda f: f.get_tensor(name))
    if array.dtype not in FLOAT_DTYPES:
      raise WeightsError(f"tensor {name} of {self.file_of[name]} has dtype {array.dtype}: "
                         f"expected float32, bfloat16 or float16 (quantised weights are not "
                         f"read)")
    return array

  def close(self) -> None:
    self._stack.close()
