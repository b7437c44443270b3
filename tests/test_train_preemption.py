# Tiers (pytest.ini): the tests marked integration here train in a subprocess with a file-size
# limit (a full disk), or twice end to end around a signal, so they are `make test-all` only;
# the watcher's own checks and a signal inside a hook's write stay in `make test`.
# test-all only: a failed asynchronous checkpoint save stops the run within two steps, or at the
# end when it was the last save, in one line with exit code 2 whose advice works
# (test_a_failed_async_save_stops_the_run_in_one_line_whose_advice_works); a signal during the
# init hook saves step 0 within seconds and the resume redoes the hook
# (test_a_signal_during_the_init_hook_saves_step_0_within_seconds).
"""Signals: SIGTERM or Ctrl-C save and exit; inside an eval or a hook they stop it at once; a
second Ctrl-C aborts."""
import json
import os
import signal
import time

import pytest

from hybrid_nope.train import loop
from hybrid_nope.run.checkpoint import Checkpointer
from hybrid_nope.train.preemption import Interrupted, PreemptionWatcher
from tests.helpers import tiny_config


def test_a_signal_between_steps_sets_the_flag_and_a_second_ctrl_c_aborts():
  # What was there before: Python's default_int_handler, or SIG_IGN where the suite runs as a
  # shell's background job (the shell ignores SIGINT for those).
  before = signal.getsignal(signal.SIGINT)
  watcher = PreemptionWatcher()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert watcher.should_stop(1, None)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    watcher.close()
  assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_inside_an_interruptible_section_stops_it_at_once():
  watcher = PreemptionWatcher()
  try:
    start = time.perf_counter()
    with pytest.raises(Interrupted):
      with watcher.interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    assert time.perf_counter() - start < 5
    with pytest.raises(Interrupted):  # Signalled before: the next section does not start.
      with watcher.interruptible():
        pass
  finally:
    watcher.close()


HOOK_SECONDS = 600


def slow_hook_signalled_by(signum, sent):
  """A hook factory whose hook, at step 0, receives `signum` (its time into `sent`) and would
  then work for HOOK_SECONDS."""
  def factory(context):
    del context

    def hook(step, params):
      del params
      if step == 0:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signum)
        time.sleep(HOOK_SECONDS)
    return hook
  return factory


@pytest.mark.parametrize("signum", [signal.SIGTERM,  # Ctrl-C takes the same path (above).
                                    pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_a_signal_during_the_init_hook_saves_step_0_within_seconds(tmp_path, signum):
  sent = []
  summary = loop.train(tiny_config(), str(tmp_path), hooks=[slow_hook_signalled_by(signum, sent)])
  assert summary["preempted"] and summary["step"] == 0
  assert time.perf_counter() - sent[0] < HOOK_SECONDS / 10  # Cut short, not waited out.
  assert Checkpointer(str(tmp_path), keep=10).all_steps() == [0]
  # The resume redoes the hook the signal cut short, then trains.
  calls = []
  summary = loop.train(tiny_config(), str(tmp_path),
                       hooks=[lambda context: lambda step, params: calls.append(step)])
  assert summary["step"] == 8 and calls == [0, 4, 8]


FULL_DISK_RUN = """
import json, resource, signal, sys, time
from hybrid_nope import cli
from hybrid_nope.train import loop
from tests.helpers import tiny_config
# A write past the limit fails (EFBIG), as on a full disk. Every checkpoint writes a _METADATA
# of ~25 KB (its size follows the state's tree, not its values); the run's own records stay
# under 8 KB. (The OCDBT data files vary in number and size from save to save.) argv: workdir,
# steps, the step from which the limit holds (1: the first save, at 4, fails; 6: the save at 8;
# 999: none).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
def hook(step, params):
  if step == int(sys.argv[3]):
    resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, resource.RLIM_INFINITY))
  # Steps after the save as slow as a real run's (0.5 s), so its failure is known by the next.
  time.sleep(0.5 * (step >= 4))
def main(argv):
  loop.train(tiny_config(train__steps=int(sys.argv[2]), metrics__every_steps=1,
                         train__log_every_steps=4, **json.loads(sys.argv[4])), sys.argv[1],
             hooks=[lambda context: hook])
cli.run(main, positional="workdir, steps, limit step, overrides")
"""


def _full_disk_run(workdir, steps, limit_step, **overrides):
  import subprocess
  import sys
  from tests.helpers import REPO
  return subprocess.run([sys.executable, "-c", FULL_DISK_RUN, str(workdir), str(steps),
                         str(limit_step), json.dumps(overrides)], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=REPO))


# 8 steps, limit from step 1: the save at step 4 fails and step 5 or 6 stops the run. 4 steps:
# the run's last save fails, and the run ends with that error too. Neither has a checkpoint to
# resume; limit from step 6: the save at 8 fails, and step 4's is the one to resume from.
@pytest.mark.parametrize("steps, limit_step, failed, good", [(8, 1, 4, None), (4, 1, 4, None),
                                                            (8, 6, 8, 4)])
@pytest.mark.integration
def test_a_failed_async_save_stops_the_run_in_one_line_whose_advice_works(tmp_path, steps,
                                                                          limit_step, failed,
                                                                          good):
  # Issue 38 case 5: the line came after 349-374 lines and 4 tracebacks from orbax's threads,
  # and with no checkpoint saved yet its "rerun to resume" was refused.
  from hybrid_nope.run.run_dir import RunDir
  proc = _full_disk_run(tmp_path, steps, limit_step)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  since = [l for i, l in enumerate(lines) if any(f"step {failed}/{steps} " in m
                                                 for m in lines[:i + 1])]
  assert 1 <= len(since) <= 5, since  # From the progress line of the failing save's step.
  last = lines[-1]
  assert last.startswith(f"-c: saving checkpoint step {failed} to ") and "failed (" in last, last
  assert RunDir(str(tmp_path)).library_errors in last, last
  with open(tmp_path / "metrics.jsonl") as f:
    trained = [r["step"] for r in map(json.loads, f) if "loss" in r]
  assert max(trained) <= failed + 2  # Stopped within two steps, not at the next save.
  # The advice, followed once the disk has room (no limit now).
  if good is None:
    assert "rerun with --config.train.overwrite=True to start afresh" in last, last
    again = _full_disk_run(tmp_path, steps, 999, train__overwrite=True)
  else:
    assert f"rerun the same command: it resumes from step {good}, the newest good" in last, last
    again = _full_disk_run(tmp_path, steps, 999)
  assert again.returncode == 0, again.stderr[-3000:]
  assert Checkpointer(str(tmp_path), keep=10).latest_step() == steps


class SignalOnFloat:
  """A metric value whose conversion to float delivers SIGTERM: the signal lands inside a
  writer call."""

  def __float__(self):
    os.kill(os.getpid(), signal.SIGTERM)
    return 1.0


def test_a_signal_inside_a_hooks_write_waits_for_the_write_then_stops_the_hook(tmp_path):
  def factory(context):
    def hook(step, params):
      del params
      context.writer.write(step, {"a": SignalOnFloat(), "b": 2.0})
      time.sleep(HOOK_SECONDS)
    return hook
  summary = loop.train(tiny_config(), str(tmp_path), hooks=[factory])
  assert summary["preempted"] and summary["step"] == 0
  with open(tmp_path / "metrics.jsonl") as f:
    written = [json.loads(l) for l in f]
  assert {"step": 0, "a": 1.0, "b": 2.0} in written  # The write finished whole.


SECOND_CTRL_C = """
import os, signal, time
from hybrid_nope import cli
from hybrid_nope.train.preemption import PreemptionWatcher
def main(argv):
  watcher = PreemptionWatcher()
  try:
    os.kill(os.getpid(), signal.SIGINT)  # The first: the run would save at the next step.
    os.kill(os.getpid(), signal.SIGINT)  # The second: abort now.
    time.sleep(60)
  finally:
    watcher.close()
cli.run(main)
"""


def test_a_second_ctrl_c_under_a_launch_script_exits_130_in_one_line():
  # Issue 38 case 6: the second Ctrl-C printed a KeyboardInterrupt traceback (60 lines in a
  # training run) below the warning of the first.
  import subprocess
  import sys
  from tests.helpers import REPO
  proc = subprocess.run([sys.executable, "-c", SECOND_CTRL_C], cwd=REPO, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.returncode == 130
  lines = proc.stderr.strip().splitlines()
  assert "Traceback" not in proc.stderr, proc.stderr
  assert len(lines) == 2 and "SIGINT received" in lines[0], lines
  assert lines[1].startswith("-c: Ctrl-C twice: stopped at once, without saving"), lines
