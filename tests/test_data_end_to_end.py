# Tiers (pytest.ini): test_trains_on_the_mds_fixtures is an end-to-end training run, so it is
# integration, `make test-all` only (its fixtures stay shared with test_data_check.py).
# test-all only: a run trains on the committed MDS fixtures (test_trains_on_the_mds_fixtures; the
# MDS reader and the mix are checked in `make test` by test_data_mds.py).
"""Training runs end to end on CPU on the committed MDS fixtures (a ProLong-like directory with
packed, zstd-compressed and raw domains) with TextbookChapters eval."""

import json
import os
import sys

import numpy as np
import pytest

from hybrid_nope.data import textbook_chapters
from hybrid_nope.train import loop
from tests.helpers import tiny_config

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
PROLONG = os.path.join(TESTDATA, "mds", "prolong")
DOMAINS = ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.3", "fineweb-edu@0.2")


@pytest.fixture(scope="module")
def eval_path(tmp_path_factory):
  """TextbookChapters prepared from the committed jsonl, byte-tokenised like the fixtures."""
  sys.path.insert(0, TESTDATA)
  import fixture_samples  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
  source = tmp_path_factory.mktemp("chapters") / "chapters.jsonl"
  source.write_text("".join(
      json.dumps({"input_ids": ByteTokenizer().encode(c["text"]).tolist()}) + "\n"
      for c in fixture_samples.chapters()))
  return textbook_chapters.prepare(str(source), str(tmp_path_factory.mktemp("tfds")))


def config(eval_path, **overrides):
  # The fixture has 12 chapters: the probe is chosen from 8 of them.
  return tiny_config(data__source="mds", data__path=PROLONG, data__domains=DOMAINS,
                     eval__path=eval_path, model__vocab_size=258, metrics__probe_pool_rows=8,
                     **overrides)


def records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.integration
def test_trains_on_the_mds_fixtures(eval_path, tmp_path, monkeypatch):
  """Resuming exactly is covered by test_data_prolong (the iterator through orbax) and
  test_train_loop (the loop); here one short run goes through every part on real files."""
  monkeypatch.setenv("HYBRID_NOPE_MDS_CACHE", str(tmp_path / "cache"))
  summary = loop.train(config(eval_path, train__steps=4, checkpoint__every_steps=4,
                              eval__every_steps=2), str(tmp_path / "run"))
  losses = {r["step"]: r["loss"] for r in records(tmp_path / "run") if "loss" in r}
  assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
  evals = [r for r in records(tmp_path / "run") if "eval_loss" in r]
  assert [r["step"] for r in evals] == [2, 4] and np.isfinite(summary["eval_loss"])
  assert list((tmp_path / "cache").rglob("shard.00000.mds"))  # the zstd domain was read
