"""Tests for hybrid_nope.data.sources.stdlib_corpus."""

import hashlib
import os
import pathlib
import subprocess
import sys

import pytest

from hybrid_nope.data.sources import stdlib_corpus

FRACTION = 0.05


def _paths(split, fraction=FRACTION):
  return [path for path, _ in stdlib_corpus.documents(split, fraction)]


def test_documents_are_stdlib_files_sorted_by_path():
  docs = stdlib_corpus.documents("train", FRACTION)
  paths = [path for path, _ in docs]
  assert paths == sorted(paths)
  assert len(paths) > 100
  assert all(path.endswith(".py") for path in paths)
  root = stdlib_corpus.stdlib_root()
  everything = dict(docs + stdlib_corpus.documents("eval", FRACTION))
  assert everything["os.py"] == (root / "os.py").read_bytes()


def test_no_third_party_code():
  for path in _paths("train") + _paths("eval"):
    parts = pathlib.PurePosixPath(path).parts
    assert not {"site-packages", "dist-packages", ".venv"} & set(parts), path


def test_splits_are_disjoint_cover_everything_and_are_about_the_fraction():
  train, evals = set(_paths("train")), set(_paths("eval"))
  assert not train & evals
  everything = {path for path, _ in stdlib_corpus._all_documents()}
  assert train | evals == everything
  assert 0.02 < len(evals) / len(everything) < 0.09


def test_larger_fraction_only_moves_documents_into_eval():
  assert set(_paths("eval", FRACTION)) < set(_paths("eval", 0.2))


def test_split_is_stable_across_processes_with_different_hash_seeds():
  code = ("import hashlib; from hybrid_nope.data.sources import stdlib_corpus as c; "
          f"print(hashlib.sha256(repr(c.documents('eval', {FRACTION})).encode()).hexdigest())")
  env = dict(os.environ, PYTHONHASHSEED="12345",
             PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
  other = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
  here = hashlib.sha256(repr(stdlib_corpus.documents("eval", FRACTION)).encode()).hexdigest()
  assert other == here


def test_bad_split_names_split():
  with pytest.raises(ValueError, match="split='test'"):
    stdlib_corpus.documents("test", FRACTION)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_fraction_names_eval_fraction(fraction):
  with pytest.raises(ValueError, match="eval_fraction"):
    stdlib_corpus.documents("train", fraction)


def test_empty_split_raises():
  with pytest.raises(ValueError, match="empty"):
    stdlib_corpus.documents("eval", 1e-12)
