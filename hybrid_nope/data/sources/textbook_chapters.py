"""TextbookChapters evaluation set: a tensorflow-datasets builder and the eval rows.

Prepare once from a local copy (no network, no TensorFlow; array_record files):

  python -m hybrid_nope.data.sources.textbook_chapters --source=/data/TextbookChapters/data \
      --tokenizer=/models/llama3/tokenizer.json --data_dir=/data/tfds

`--source` is a .jsonl / .parquet / .txt file or a directory of them (searched recursively, in
sorted path order), e.g. the princeton-nlp/TextbookChapters parquet files (a .txt file is one
record, its UTF-8 text: any text set, e.g. for an imported model); each record has a
text field (tokenised with the given Hugging Face tokenizer.json, special tokens added as the
tokenizer's post-processor defines, e.g. Llama-3's <|begin_of_text|>) or already-tokenised
`input_ids`. The command prints the prepared directory, DATA_DIR/textbook_chapters/NAME/1.0.0;
pass it (or DATA_DIR, if it holds one prepared config) as config.eval.path. The tokenizer.json
is copied into it, so that the trainer can check model.vocab_size against it at the start
(`loader.check_vocabulary`).

Eval rows (`eval_rows`) are read back through grain: a fixed-seed shuffle of the chapters
(the same set whatever data.seed is), one chapter per row from its first token, truncated to
seq_len + 1 tokens and padded (segment 0, weight 0) when shorter. Token index i of a row is
then position i of its chapter, so the loss per position bucket (index // bucket size) shows
how well the model uses long context.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys

from etils import epath
import grain
import numpy as np
import tensorflow_datasets as tfds

from hybrid_nope.data.pipeline import packing
from hybrid_nope.data.sources import prolong
from hybrid_nope.errors import UserError

NAME = "textbook_chapters"
SPLIT = "train"  # the release's only split; all of it is eval data here
EVAL_SHUFFLE_SEED = 0
_EXTENSIONS = (".jsonl", ".json", ".parquet", ".txt")
TOKENIZER_BASENAME = "tokenizer.json"  # The copy in the prepared directory.


class EvalDataError(UserError):
  """A config.eval.path that holds no usable prepared eval set, or too few chapters."""


def source_files(source: str) -> list[str]:
  if os.path.isfile(source):
    files = [source]
  elif os.path.isdir(source):
    files = sorted(p for ext in _EXTENSIONS
                   for p in glob.glob(os.path.join(source, "**", f"*{ext}"), recursive=True))
  else:
    raise FileNotFoundError(f"TextbookChapters source {source} does not exist")
  if not files or not all(f.endswith(_EXTENSIONS) for f in files):
    raise FileNotFoundError(f"TextbookChapters source {source} has no {'/'.join(_EXTENSIONS)} "
                            f"files")
  return files


def read_records(path: str, fields: tuple[str, ...]):
  """Yields (record id, record) with only `fields` kept, from a .jsonl/.json or .parquet file;
  a .txt file is one record, its text under fields[0] (the text field)."""
  if path.endswith(".txt"):
    with open(path, encoding="utf-8") as f:
      yield path, {fields[0]: f.read()}
    return
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    parquet = pq.ParquetFile(path)
    columns = [f for f in fields if f in parquet.schema_arrow.names]
    row = 0
    for batch in parquet.iter_batches(batch_size=256, columns=columns):
      for record in batch.to_pylist():
        yield f"{path}:{row}", record
        row += 1
    return
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {line_number} is not valid JSON: {e}") from None
      if not isinstance(record, dict):
        raise ValueError(f"{path} line {line_number} is not a JSON object")
      yield f"{path}:{line_number}", {k: record[k] for k in fields if k in record}


class TextbookChaptersConfig(tfds.core.BuilderConfig):
  """Where the local copy is and how to tokenise it."""

  def __init__(self, *, source: str, tokenizer: str | None = None, text_field: str = "text",
               name: str = "default"):
    digest = "pre-tokenised input_ids"
    if tokenizer:
      with open(tokenizer, "rb") as f:
        digest = f"tokenizer.json sha256 {hashlib.sha256(f.read()).hexdigest()}"
    super().__init__(name=name, version="1.0.0",
                     description=f"from {source}, field {text_field!r}, {digest}")
    self.source, self.tokenizer, self.text_field = source, tokenizer, text_field


class TextbookChapters(tfds.core.GeneratorBasedBuilder):
  """Chapters as token ids, in source order (shuffling disabled)."""

  VERSION = tfds.core.Version("1.0.0")
  # tfds derives this through importlib_resources, which it does not install on Python >= 3.9;
  # the builder has no checksums file or metadata next to it either way.
  code_path = epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="TextbookChapters (princeton-nlp) tokenised for long-context evaluation.",
        features=tfds.features.FeaturesDict({
            "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "id": tfds.features.Text(),
        }),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # everything is local
    return {SPLIT: self._generate_examples()}

  def _generate_examples(self):
    config = self.builder_config
    tokenizer = None
    if config.tokenizer:
      import tokenizers  # pylint: disable=g-import-not-at-top
      tokenizer = tokenizers.Tokenizer.from_file(config.tokenizer)
    key = 0
    batch: list[tuple[str, str]] = []

    def flush():
      nonlocal key
      encodings = tokenizer.encode_batch([text for _, text in batch])
      for (record_id, _), encoding in zip(batch, encodings):
        yield key, {"input_ids": _checked_ids(encoding.ids, record_id), "id": record_id}
        key += 1
      batch.clear()

    for path in source_files(config.source):
      for record_id, record in read_records(path, (config.text_field, "input_ids")):
        if tokenizer is not None:
          text = record.get(config.text_field)
          if not isinstance(text, str):
            raise ValueError(f"{record_id} has no string field {config.text_field!r} "
                             f"(fields: {sorted(record)})")
          batch.append((record_id, text))
          if len(batch) == 64:
            yield from flush()
        else:
          if "input_ids" not in record:
            raise ValueError(f"{record_id} has no 'input_ids'; to tokenise its "
                             f"{config.text_field!r} field pass a tokenizer.json")
          yield key, {"input_ids": _checked_ids(record["input_ids"], record_id),
                      "id": record_id}
          key += 1
    if batch:
      yield from flush()


def _checked_ids(ids, record_id: str) -> np.ndarray:
  ids = np.asarray(ids)
  if ids.ndim != 1 or ids.size < 2 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"{record_id}: expected at least 2 integer token ids, got dtype "
                     f"{ids.dtype} shape {ids.shape}")
  if ids.min() < 0 or ids.max() >= 2**31:
    raise ValueError(f"{record_id}: token ids must be in [0, 2**31), got "
                     f"[{ids.min()}, {ids.max()}]")
  return ids.astype(np.int32)


def prepare(source: str, data_dir: str, *, tokenizer: str | None = None,
            text_field: str = "text", name: str = "default") -> str:
  """Builds the array_record dataset; returns its directory (the value for eval.path)."""
  config = TextbookChaptersConfig(source=source, tokenizer=tokenizer, text_field=text_field,
                                  name=name)
  builder = TextbookChapters(config=config, data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  if tokenizer:
    shutil.copyfile(tokenizer, os.path.join(os.fspath(builder.data_dir), TOKENIZER_BASENAME))
  return os.fspath(builder.data_dir)


def dataset_dir(path: str) -> str:
  """The prepared version directory: `path` itself, or the one prepared dataset below it."""
  if os.path.isfile(os.path.join(path, "dataset_info.json")):
    return path
  found = sorted(os.path.dirname(p) for p in glob.glob(
      os.path.join(path, "**", "dataset_info.json"), recursive=True))
  if len(found) != 1:
    raise EvalDataError(
        f"config.eval.path={path!r} must be a prepared TextbookChapters directory (with "
        f"dataset_info.json; python -m hybrid_nope.data.sources.textbook_chapters prints it), or hold "
        f"exactly one; found {found or 'none'}")
  return found[0]


def chapter_row(input_ids: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
  """One chapter from its first token: seq_len + 1 tokens at most, padded when shorter."""
  n = min(input_ids.size, seq_len + 1)
  return prolong.cut_row(np.asarray(input_ids[:n], np.int32), np.array([0]),
                         np.array([input_ids.size]), 0, seq_len)


def eval_rows(path: str, *, seq_len: int, num_rows: int, vocab_size: int,
              num_rows_key: str = "eval.num_batches", at_most: bool = False
              ) -> dict[str, np.ndarray]:
  """num_rows eval rows ([num_rows, seq_len] per key) from the prepared dataset at `path`;
  `at_most`: num_rows is the most to read (every chapter where there are fewer), else a set
  with fewer chapters is refused naming `num_rows_key`."""
  directory = dataset_dir(path)
  try:
    source = tfds.builder_from_directory(directory).as_data_source(SPLIT)
  except Exception as e:  # tfds raises many kinds for a half-written or foreign directory.
    raise EvalDataError(f"config.eval.path={path!r}: {directory} is not a readable prepared "
                        f"TextbookChapters set ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}); prepare it again "
                        f"with python -m hybrid_nope.data.sources.textbook_chapters") from None
  if at_most:
    num_rows = min(num_rows, len(source))
  elif num_rows > len(source):
    raise EvalDataError(f"config.{num_rows_key} asks for {num_rows} eval rows but {directory} "
                        f"(config.eval.path) has only {len(source)} chapters")

  def to_row(index_and_example):
    index, example = index_and_example
    ids = example["input_ids"]
    record = example["id"].decode() if isinstance(example["id"], bytes) else example["id"]
    if ids.size < 2:
      raise EvalDataError(f"chapter {index} ({record}) of {directory} has fewer than 2 "
                          f"tokens")
    if ids.min() < 0 or ids.max() >= vocab_size:
      bad = int(np.argmax((ids < 0) | (ids >= vocab_size)))
      raise EvalDataError(f"token id {int(ids[bad])} at position {bad} of chapter {index} "
                          f"({record}) of {directory} is outside [0, "
                          f"model.vocab_size={vocab_size}); was it tokenised with another "
                          f"tokenizer?")
    return chapter_row(ids, seq_len)

  order = grain.MapDataset.range(len(source)).shuffle(seed=EVAL_SHUFFLE_SEED)[:num_rows]
  chapters = grain.MapDataset.source(source)
  rows = list(order.map(lambda i: (int(i), chapters[int(i)])).map(to_row))
  return {k: np.stack([r[k] for r in rows]) for k in packing.ROW_KEYS}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,  # The input format is described there.
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--source", required=True,
                      help=".jsonl / .json / .parquet / .txt file, or a directory searched "
                      "recursively for them (sorted path order); each record holds a text field "
                      "(see --text_field) or already-tokenised input_ids; a .txt file is one "
                      "record of text")
  parser.add_argument("--data_dir", required=True, help="tfds data_dir to write into")
  parser.add_argument("--tokenizer", default=None,
                      help="Hugging Face tokenizer.json that tokenises the text field (needed "
                      "unless the records hold input_ids); copied into the prepared directory")
  parser.add_argument("--text_field", default="text", help="the records' text field")
  parser.add_argument("--name", default="default", help="builder config name")
  args = parser.parse_args(argv)
  print(prepare(args.source, args.data_dir, tokenizer=args.tokenizer,
                text_field=args.text_field, name=args.name))


if __name__ == "__main__":
  main(sys.argv[1:])
