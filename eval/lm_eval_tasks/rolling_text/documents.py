"""Documents for the `rolling_text` lm-evaluation-harness task, read from local files.

lm-eval calls `load(**metadata)` (the task's `custom_dataset`) with its --metadata merged with
--model_args; the key read here is `files`: one path or a list of them, each a file or a
directory searched recursively. One .txt file is one document (TextbookChapters-style: a
chapter per file); .jsonl, .json and .parquet files hold one document per record, in its
`text` field (the princeton-nlp/TextbookChapters parquet files as they are). Records are read
by Hugging Face `datasets`' own json / parquet / text builders; nothing touches the network.
"""
from __future__ import annotations

import glob
import os

# File extension -> the `datasets` builder that reads it (text: one row per whole file).
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TEXT_FIELD = "text"


class DocumentsError(ValueError):
  """A `files` value that names no readable documents."""


def data_files(files) -> dict[str, list[str]]:
  """{builder: [paths]} for `files` (a path or a list of paths): each builder's files in the
  order given, a directory's in sorted path order."""
  if isinstance(files, str):
    files = [files]
  if not files or not all(isinstance(f, str) for f in files):
    raise DocumentsError(f"metadata files={files!r}: expected a path or a list of paths to "
                         f"{', '.join(BUILDERS)} files or directories of them, e.g. "
                         "--metadata='{\"files\": [\"/data/chapters\"]}'")
  grouped: dict[str, list[str]] = {}
  for path in files:
    if os.path.isdir(path):
      found = sorted(p for ext in BUILDERS
                     for p in glob.glob(os.path.join(path, "**", f"*{ext}"), recursive=True))
      if not found:
        raise DocumentsError(f"metadata files: directory {path} holds no "
                             f"{'/'.join(BUILDERS)} file")
    elif os.path.isfile(path):
      found = [path]
    else:
      raise DocumentsError(f"metadata files: {path} does not exist")
    for p in found:
      ext = os.path.splitext(p)[1].lower()
      if ext not in BUILDERS:
        raise DocumentsError(f"metadata files: {p} is not one of {', '.join(BUILDERS)}")
      grouped.setdefault(BUILDERS[ext], []).append(os.path.abspath(p))
  return grouped


def load(files=None, **_):
  """The task's dataset: {"test": rows with a `text` column}. Other metadata keys (the model
  arguments lm-eval merges in) are not ours and are ignored."""
  import datasets  # pylint: disable=g-import-not-at-top  (lm-eval's environment has it)

  parts = []
  for builder, paths in data_files(files).items():
    kwargs = {"sample_by": "document"} if builder == "text" else {}
    part = datasets.load_dataset(builder, data_files=paths, split="train", **kwargs)
    if TEXT_FIELD not in part.column_names:
      raise DocumentsError(f"metadata files: records in {paths[0]} ... have no "
                           f"'{TEXT_FIELD}' field (columns: {part.column_names})")
    parts.append(part.select_columns([TEXT_FIELD]))
  return datasets.DatasetDict({"test": datasets.concatenate_datasets(parts)})
