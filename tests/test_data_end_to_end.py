# Tiers (pytest.ini): test_trains_on_the_mds_fixtures is an end-to-end training run, so it is
# integration, `make test-all` only (its fixtures stay shared with test_data_check.py).
# test-all only: a run trains on the committed MDS fixtures (test_trains_on_the_mds_fixtures; the
# MDS reader and the mix are checked in `make test` by test_data_mds.py).
"""Training runs end to end on CPU on the committed MDS fixtures (a ProLong-like directory with
packed, zstd-compressed and raw domains) with TextbookChapters eval."""

import json
import os
import re
import sys

import numpy as np
import pytest

from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import textbook_chapters
from hybrid_nope.errors import UserError
from hybrid_nope.train import loop
from configs import swa256_350m
from tests.helpers import TINY, tiny_config

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
PROLONG = os.path.join(TESTDATA, "mds", "prolong")
DOMAINS = ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.3", "fineweb-edu@0.2")


def prepared_chapters(tmp_path_factory, num: int = 12) -> str:
  """TextbookChapters of `num` fixture chapters, byte-tokenised like the MDS fixtures."""
  sys.path.insert(0, TESTDATA)
  import fixture_samples  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
  source = tmp_path_factory.mktemp("chapters") / "chapters.jsonl"
  source.write_text("".join(
      json.dumps({"input_ids": ByteTokenizer().encode(c["text"]).tolist()}) + "\n"
      for c in fixture_samples.chapters(num)))
  return textbook_chapters.prepare(str(source), str(tmp_path_factory.mktemp("tfds")))


@pytest.fixture(scope="module")
def eval_path(tmp_path_factory):
  """TextbookChapters prepared from the committed chapters."""
  return prepared_chapters(tmp_path_factory)


def config(eval_path, **overrides):
  # The fixture has 12 chapters: the probe is chosen from 8 of them.
  return tiny_config(**{**dict(data__source="mds", data__path=PROLONG, data__domains=DOMAINS,
                              eval__path=eval_path, model__vocab_size=258,
                              metrics__probe_pool_rows=8), **overrides})


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


def bad_token_data(root):
  """data.path with one packed domain "bad" in one shard (any row read checks it whole): 20
  samples of 200 byte tokens (int32), sample 3 holding the token id -1."""
  from hybrid_nope.data.formats import mds  # pylint: disable=g-import-not-at-top
  samples = []
  for i in range(20):
    ids = ((np.arange(200) * 7 + i) % 256).astype(np.int32)
    if i == 3:
      ids[17] = -1
    samples.append({"input_ids": ids, "indices": np.array([[0, 100], [100, 200]], np.uint32),
                    "domain": "bad"})
  mds.write_mds(str(root / "bad"), {"input_ids": "ndarray:int32", "indices": "ndarray:uint32",
                                    "domain": "str"}, samples)
  return root


BAD_SETTINGS = dict(data__domains=("bad@1",), train__steps=1, train__warmup_steps=0,
                    checkpoint__every_steps=1, eval__every_steps=1)


def refused_bad_token(eval_path, tmp_path, monkeypatch):
  """(workdir, the refusal's message) of a fresh start on bad_token_data."""
  monkeypatch.setenv("HYBRID_NOPE_MDS_CACHE", str(tmp_path / "cache"))
  data = bad_token_data(tmp_path / "data")
  workdir = tmp_path / "run"
  with pytest.raises(UserError) as e:
    loop.train(config(eval_path, data__path=str(data), **BAD_SETTINGS), str(workdir))
  return workdir, str(e.value)


def advised_config(eval_path, workdir, message):
  advised = re.search(r"--config\.data\.exclude_samples='(.*)' \(or", message).group(1)
  assert advised == '("bad/shard.00000.mds:3",)'
  return config(eval_path, data__path=str(workdir.parent / "data"), **BAD_SETTINGS,
                data__exclude_samples=("bad/shard.00000.mds:3",))


def test_a_bad_token_is_refused_before_any_record(eval_path, tmp_path, monkeypatch):
  # Issue 38 case 4: the refusal came at step 1, after step 0's records (metrics.jsonl,
  # tensorboard, config.json), so the rerun it advised was refused for those records. The
  # first batch's shards are checked now, before anything is written.
  workdir, message = refused_bad_token(eval_path, tmp_path, monkeypatch)
  assert message.startswith("token id -1 at position 17 of input_ids in sample 3 of ")
  assert not [f for f in os.listdir(workdir) if f != "checkpoints"], os.listdir(workdir)
  assert next(loader.train_iterator(advised_config(eval_path, workdir, message)))[
      "inputs"].min() >= 0  # The advised exclusion reads past the bad sample.


@pytest.mark.integration
def test_the_bad_token_refusals_advised_rerun_trains(eval_path, tmp_path, monkeypatch):
  workdir, message = refused_bad_token(eval_path, tmp_path, monkeypatch)
  summary = loop.train(advised_config(eval_path, workdir, message), str(workdir))
  assert summary["step"] == 1 and np.isfinite(summary["loss"])


def paper_config_shrunk(eval_path, **overrides):
  """configs/swa256_350m.py as a newcomer shrinks it to a tiny model on the MDS fixtures: the
  model, lengths, batch and eval sizes (TINY), the metrics keys left at the paper's (the far lag
  inside the shorter rows)."""
  config = swa256_350m.get_config()
  tiny = {key: value for key, value in TINY.items() if key != "metrics.probe_batch_size"}
  values = {**tiny, "data.source": "mds", "data.path": PROLONG, "data.domains": DOMAINS,
            "eval.path": eval_path, "model.vocab_size": 258, **overrides}
  for key, value in values.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


@pytest.mark.integration
def test_a_paper_config_trains_on_24_chapters_with_the_paper_probe_pool(tmp_path_factory,
                                                                        tmp_path, monkeypatch,
                                                                        caplog):
  """Issue 50, item 5: the held-out newcomer run (a paper config on official-writer MDS data,
  24 TextbookChapters rows) was refused for metrics.probe_pool_rows=256 > 24 rows. The pool is
  the most rows to choose from: it trains and records, saying it chose from all 24."""
  monkeypatch.setenv("HYBRID_NOPE_MDS_CACHE", str(tmp_path / "cache"))
  config = paper_config_shrunk(prepared_chapters(tmp_path_factory, 24),
                               **{"train.steps": 4, "checkpoint.every_steps": 4,
                                  "eval.every_steps": 2})
  assert (config.metrics.probe_pool_rows, config.metrics.probe_batch_size) == (256, 32)
  with caplog.at_level("INFO"):
    summary = loop.train(config, str(tmp_path / "run"), hooks=[RecencyHook.for_run])
  assert summary["step"] == 4 and np.isfinite(summary["loss"])
  assert "recency probe: chosen from all 24 eval rows (metrics.probe_pool_rows=256 is the most " \
         "it chooses from)" in caplog.messages
  probe = json.loads((tmp_path / "run" / "recency_probe.json").read_text())
  assert "recency probe: measures all 24 eval rows (metrics.probe_batch_size=32 is the most " \
         "it measures)" in caplog.messages
  assert len(probe["rows"]) == 24 and probe["documents"] == 24  # One chapter per row.
  with open(tmp_path / "run" / "recency.jsonl") as f:
    steps = {json.loads(line)["step"] for line in f}
  assert steps == {0, 4}
