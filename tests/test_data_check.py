# Tiers (pytest.ini): test_the_command_exits_2_listing_the_problem runs launch/check_data.py in a
# subprocess, so it is integration, `make test-all` only.
# test-all only: launch/check_data.py ends a failed check with its problems listed and exit code
# 2 (test_the_command_exits_2_listing_the_problem; the checks themselves are in `make test`).
"""launch/check_data.py's checks (hybrid_nope.data.check) on the committed MDS fixtures (two
packed domains, one zstd-compressed, and a raw domain) and a prepared TextbookChapters set."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tokenizers
from tokenizers import models

from hybrid_nope.data import check
from hybrid_nope.data.formats import mds
from tests.helpers import REPO, tiny_config, tiny_flags
from tests.test_data_end_to_end import DOMAINS, PROLONG, eval_path  # noqa: F401 (a fixture)

SHARES = {"book-65536": 0.5, "thestackv1_concat_by_repo-65536": 0.3, "fineweb-edu": 0.2}


def _tokenizer(path, size):
  vocab = {f"t{i}": i for i in range(size)}
  tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")).save(str(path))


@pytest.fixture
def data(tmp_path):
  """A copy of the fixture domains with a 258-id tokenizer.json (the byte tokenizer's size)."""
  root = tmp_path / "prolong"
  shutil.copytree(PROLONG, root)
  _tokenizer(root / "tokenizer.json", 258)
  return root


def _config(data, eval_path, **overrides):  # noqa: F811
  return tiny_config(data__source="mds", data__path=str(data), data__domains=DOMAINS,
                     data__cache_dir=str(data.parent / "cache"), eval__path=eval_path,
                     model__vocab_size=258, metrics__probe_pool_rows=8, **overrides)


def _expected(directory, seq_len):
  """(shards, samples, tokens, rows) counted from index.json and every sample's input_ids, and
  the rows prolong's docstring defines: ceil((L - 1) / T) per stream of L tokens (a packed
  sample; a raw domain's samples concatenated)."""
  index = json.load(open(os.path.join(directory, "index.json")))
  ds = mds.MDSDataset(directory, cache_dir=str(directory) + "_cache")
  lengths = [ds[i]["input_ids"].size for i in range(len(ds))]
  packed = "indices" in ds.columns
  streams = lengths if packed else [sum(lengths)]
  rows = sum(math.ceil((n - 1) / seq_len) for n in streams if n >= 2)
  return len(index["shards"]), sum(s["samples"] for s in index["shards"]), sum(lengths), rows


def test_reports_each_domain_the_eval_set_and_the_vocabulary(data, eval_path):  # noqa: F811
  report = check.check(_config(data, eval_path))
  assert [d.name for d in report.domains] == list(SHARES)
  for d in report.domains:
    assert d.share == pytest.approx(SHARES[d.name])
    assert (d.shards, d.samples, d.tokens, d.rows) == _expected(data / d.name, 64)
  assert {d.name: d.kind for d in report.domains}["fineweb-edu"] == "raw"
  assert report.chapters == 12  # tests/testdata/textbook_chapters/chapters.jsonl
  assert (report.eval_rows, report.probe_rows) == (2 * 2, 8)
  assert 0 < report.eval_tokens <= report.eval_rows * 64
  assert report.tokenizers == [str(data / "tokenizer.json")] and report.tokenizer_size == 258
  text = report.text()
  assert f"train data: {data} (data.path), 3 domains" in text
  total = text.splitlines()[5].split()
  assert total[0] == "total" and int(total[-1].replace(",", "")) == sum(
      d.rows for d in report.domains)
  assert "tokenizer: " + str(data / "tokenizer.json") + ": 258 token ids <= " \
         "model.vocab_size 258" in text
  assert text.endswith("OK: the data is in place for this config")


@pytest.mark.parametrize("problem, expected", [
    ("no domain directory", "domain 'fineweb-edu' of config.data.domains has no directory "
                            "{data}/fineweb-edu under config.data.path"),
    ("no index.json", "{data}/book-65536/index.json is missing"),
    ("no shard file", "shard file {data}/book-65536/shard.00001.mds (shards[1] of "
                      "{data}/book-65536/index.json) is missing"),
    ("a larger vocabulary", "config.model.vocab_size=258 is smaller than "
                            "{data}/tokenizer.json's 300 token ids"),
    ("no tokenizer", "no tokenizer.json in config.data.path={data} or in the eval directory"),
])
def test_what_is_missing_or_wrong_is_a_line_naming_it(data, eval_path, problem,  # noqa: F811
                                                      expected):
  if problem == "no domain directory":
    shutil.rmtree(data / "fineweb-edu")
  elif problem == "no index.json":
    os.remove(data / "book-65536" / "index.json")
  elif problem == "no shard file":
    os.remove(data / "book-65536" / "shard.00001.mds")
  elif problem == "a larger vocabulary":
    _tokenizer(data / "tokenizer.json", 300)
  else:
    os.remove(data / "tokenizer.json")
  with pytest.raises(check.DataCheckError) as error:
    check.check(_config(data, eval_path))
  header, line, origin = str(error.value).splitlines()
  assert header == "1 problem with the data of this config (data.source=mds):"
  assert line.startswith("  " + expected.format(data=data))
  assert origin.startswith('The data and how to fetch and prepare it: docs/reproduce.md, "Data"')
  assert "princeton-nlp/prolong-data-64K" in origin


def test_every_problem_is_listed_in_one_run(data, eval_path, tmp_path):  # noqa: F811
  """A shard and a domain gone and a tokenizer larger than the model's vocabulary, then also the
  eval set elsewhere: each on its line, then docs/reproduce.md with the dataset ids."""
  shutil.rmtree(data / "fineweb-edu")
  os.remove(data / "book-65536" / "shard.00001.mds")
  _tokenizer(data / "tokenizer.json", 300)
  with pytest.raises(check.DataCheckError) as error:
    check.check(_config(data, eval_path))
  lines = str(error.value).splitlines()
  assert lines[0] == "3 problems with the data of this config (data.source=mds):"
  assert [l.split(" (")[0].split(" is ")[0] for l in lines[1:4]] == [
      f"  shard file {data}/book-65536/shard.00001.mds",
      f"  domain 'fineweb-edu' of config.data.domains has no directory {data}/fineweb-edu under "
      "config.data.path",
      "  config.model.vocab_size=258"]
  for dataset_id in ("princeton-nlp/prolong-data-64K", "princeton-nlp/TextbookChapters",
                     "meta-llama/Meta-Llama-3-8B"):
    assert dataset_id in lines[4] and "docs/reproduce.md" in lines[4]
  with open(os.path.join(REPO, "docs", "reproduce.md")) as f:  # The ids are the docs' ones.
    docs = f.read()
  assert "\n## Data\n" in docs and all(i in docs for i in (
      "princeton-nlp/prolong-data-64K", "meta-llama/Meta-Llama-3-8B",
      "princeton-nlp/TextbookChapters"))
  missing_eval = str(tmp_path / "no_chapters")
  with pytest.raises(check.DataCheckError) as error:
    check.check(_config(data, missing_eval))
  lines = str(error.value).splitlines()
  assert lines[3].startswith(f"  config.eval.path='{missing_eval}' must be a prepared")
  assert lines[0].startswith("3 problems")  # The tokenizer's check needs the eval directory.


@pytest.mark.integration
def test_the_command_exits_2_listing_the_problem(data, eval_path):  # noqa: F811
  os.remove(data / "book-65536" / "index.json")
  flags = tiny_flags(data__source="mds", data__path=data, data__domains=repr(DOMAINS),
                     eval__path=eval_path, model__vocab_size=258, metrics__probe_pool_rows=8)
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "launch", "check_data.py"), "--config=configs/demo.py",
       *flags], cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  header, problem, origin = proc.stderr.strip().splitlines()[-3:]
  assert header == "check_data.py: 1 problem with the data of this config (data.source=mds):"
  assert problem == (f"  {data}/book-65536/index.json is missing: an MDS dataset directory "
                     f"needs the index.json written by MDSWriter")
  assert origin.startswith("The data and how to fetch and prepare it: docs/reproduce.md")
  assert np.all([not line.startswith("OK") for line in proc.stdout.splitlines()])
