# Tiers (pytest.ini): every test here is an end-to-end training run (the launch/train.py command
# line, killed with SIGKILL and rerun), so integration: `make test-all` only. Reading, packing,
# sharding, resume from rows consumed and the refusals are tests/test_data_text.py's, in
# `make test`.
"""The demo config trains on a jsonl, a parquet and a saved `datasets` corpus, and a run killed
with SIGKILL mid-run, then rerun with the same command, gives bit-identical losses at every step
to an uninterrupted run."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hybrid_nope.data.sources import stdlib_corpus
from hybrid_nope.train import loop
from hybrid_nope.run.checkpoint import Checkpointer
from tests import text_sources
from tests.helpers import REPO, tiny_config, tiny_flags
from tests.test_train_loop import losses_by_step as losses, read_metrics, recorded_steps

STEPS, EVERY = 20, 5
RUN = dict(train__steps=STEPS, checkpoint__every_steps=EVERY, eval__every_steps=10,
           data__eval_fraction=0.2, metrics__probe_pool_rows=256)  # a probe of 2+ documents


@pytest.fixture(scope="module")
def records():
  """Real text: 150 files of the stdlib corpus (those that are UTF-8), one record each."""
  docs = [(name, data) for name, data in stdlib_corpus.documents("train", 0.05)[:160]]
  out = []
  for name, data in docs:
    try:
      out.append({"text": data.decode("utf-8"), "path": name})
    except UnicodeDecodeError:
      continue
  return out[:150]


def command(workdir, data: dict) -> list[str]:
  return [sys.executable, os.path.join(REPO, "launch", "train.py"), "--config=configs/demo.py",
          f"--workdir={workdir}", *tiny_flags(**RUN, **data)]


@pytest.mark.integration
@pytest.mark.parametrize("source", text_sources.SOURCES)
def test_a_kill_9_then_the_same_command_resumes_bit_identically(source, records, tmp_path):
  path = text_sources.write(source, tmp_path / "data", records, files=3)
  data = dict(data__source=source, data__path=path, data__cache_dir=str(tmp_path / "cache"))
  reference = tmp_path / "reference"
  loop.train(tiny_config(**RUN, **data), str(reference))
  expected = losses(reference)
  assert sorted(expected) == list(range(1, STEPS + 1))
  assert all(np.isfinite(list(expected.values())))
  assert [r["step"] for r in read_metrics(reference) if "eval_loss" in r] == [10, 20]

  workdir = tmp_path / "killed"
  proc = subprocess.Popen(command(workdir, data), cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  deadline = time.time() + 300
  # Recency is recorded right after a save starts, and orbax starts a save only when the
  # previous one is final: seeing step 2·EVERY there means checkpoint EVERY is complete.
  while not recorded_steps(workdir) & {2 * EVERY}:
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = Checkpointer(str(workdir), keep=100).latest_step()
  assert killed_at is not None and EVERY <= killed_at < STEPS, killed_at
  done = subprocess.run(command(workdir, data), cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  got = losses(workdir)
  assert sorted(got) == list(range(1, STEPS + 1))
  np.testing.assert_array_equal([got[s] for s in range(1, STEPS + 1)],
                                [expected[s] for s in range(1, STEPS + 1)])
  print(f"{source}: killed after checkpoint {killed_at}, resumed: {STEPS} of {STEPS} losses "
        f"bit-identical (final {got[STEPS]!r})")
