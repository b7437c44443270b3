"""eval/lm_eval_tasks/rolling_text/documents.py: which local files become the task's documents.
Loading them through `datasets` and scoring them with lm-eval is `make check-lm-eval`'s part
(tests/hf/check_lm_eval.py); `datasets` is not in this venv."""
import importlib.util
import os
import re

import pytest

from tests.helpers import REPO

TASK_DIR = os.path.join(REPO, "eval", "lm_eval_tasks", "rolling_text")
_spec = importlib.util.spec_from_file_location("documents", os.path.join(TASK_DIR, "documents.py"))
documents = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(documents)


def _touch(path):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("x")
  return path


def test_directories_expand_recursively_in_sorted_order_grouped_by_builder(tmp_path):
  root = str(tmp_path)
  b_txt = _touch(os.path.join(root, "chapters", "b.txt"))
  a_txt = _touch(os.path.join(root, "chapters", "sub", "a.txt"))
  c_jsonl = _touch(os.path.join(root, "chapters", "c.jsonl"))
  d_parquet = _touch(os.path.join(root, "chapters", "d.parquet"))
  _touch(os.path.join(root, "chapters", "notes.md"))  # not a document file: not picked up
  single = _touch(os.path.join(root, "extra.txt"))
  got = documents.data_files([single, os.path.join(root, "chapters")])
  assert got == {"text": [single, b_txt, a_txt], "json": [c_jsonl],
                 "parquet": [d_parquet]}
  assert documents.data_files(single) == {"text": [single]}  # one path as a plain string


@pytest.mark.parametrize("files, named", [
    (None, "files=None"), ([], "files=[]"), ([3], "files=[3]"),
    (["/nonexistent/chapters"], "/nonexistent/chapters does not exist")])
def test_bad_files_value_names_it(files, named):
  with pytest.raises(documents.DocumentsError, match=re.escape(named)):
    documents.data_files(files)


def test_empty_directory_and_unknown_extension_are_refused(tmp_path):
  with pytest.raises(documents.DocumentsError, match="holds no"):
    documents.data_files(str(tmp_path))
  notes = _touch(os.path.join(str(tmp_path), "notes.md"))
  with pytest.raises(documents.DocumentsError, match=re.escape(f"{notes} is not one of")):
    documents.data_files(notes)


def test_task_yaml_loads_documents_with_the_function_it_names():
  with open(os.path.join(TASK_DIR, "rolling_text.yaml")) as f:
    yaml_text = f.read()
  module, function = re.search(r"custom_dataset: !function (\w+)\.(\w+)", yaml_text).groups()
  assert module == "documents" and callable(getattr(documents, function))
  assert re.search(r"^output_type: loglikelihood_rolling$", yaml_text, re.M)
  assert re.search(rf"^doc_to_target: {documents.TEXT_FIELD}$", yaml_text, re.M)
