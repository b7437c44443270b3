"""One trainer per workdir: a live holder refuses a second one; a gone holder is taken over."""
import json
import logging
import socket
import subprocess
import sys
import time

import pytest

from hybrid_nope.train import loop
from hybrid_nope.run.run_dir import LOCK
from hybrid_nope.run.workdir_lock import WorkdirLock, WorkdirLockedError
from tests.helpers import tiny_config


def hold(workdir, pid, host=None, heartbeat=None):
  (workdir / LOCK).write_text(json.dumps({
      "host": host or socket.gethostname(), "pid": pid,
      "heartbeat": time.time() if heartbeat is None else heartbeat}))


@pytest.fixture
def live_pid():
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
  yield proc.pid
  proc.kill()
  proc.wait()


def test_a_lock_is_created_refreshed_and_released(tmp_path):
  lock = WorkdirLock(str(tmp_path), heartbeat_seconds=0.05)
  lock.acquire()
  first = json.loads((tmp_path / LOCK).read_text())
  time.sleep(0.3)
  assert json.loads((tmp_path / LOCK).read_text())["heartbeat"] > first["heartbeat"]
  lock.release()
  assert not (tmp_path / LOCK).exists()


def test_a_second_trainer_on_the_workdir_refuses_in_one_line(tmp_path, live_pid):
  hold(tmp_path, live_pid)
  with pytest.raises(WorkdirLockedError, match=rf"^another trainer runs on this workdir: .* "
                     rf"pid {live_pid} on {socket.gethostname()}"):
    loop.train(tiny_config(), str(tmp_path))
  assert json.loads((tmp_path / LOCK).read_text())["pid"] == live_pid  # Left as it was.
  assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # Nothing else written.


def test_a_lock_of_an_exited_pid_is_taken_over_with_a_warning(tmp_path, caplog):
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True)
  hold(tmp_path, int(proc.stdout))
  with caplog.at_level(logging.WARNING, logger="absl"):
    lock = WorkdirLock(str(tmp_path))
    lock.acquire()
  assert "has exited" in caplog.text
  lock.release()


def test_another_hosts_lock_holds_while_its_heartbeat_is_fresh(tmp_path, caplog):
  hold(tmp_path, 1, host="other-host", heartbeat=time.time() - 60)
  with pytest.raises(WorkdirLockedError, match="other-host"):
    WorkdirLock(str(tmp_path), stale_seconds=600).acquire()
  hold(tmp_path, 1, host="other-host", heartbeat=time.time() - 700)
  with caplog.at_level(logging.WARNING, logger="absl"):
    lock = WorkdirLock(str(tmp_path), stale_seconds=600)
    lock.acquire()
  assert "heartbeat is 70" in caplog.text and "stale after 600 s" in caplog.text
  lock.release()


@pytest.mark.parametrize("text, what", [
    ("[1, 2]", "a JSON list"),
    (json.dumps({"host": socket.gethostname(), "pid": "abc", "heartbeat": 1.0}), "pid abc"),
    (json.dumps({"host": "other-host", "pid": 7, "heartbeat": "yesterday"}), "heartbeat text"),
    ("{\"host\": ", "torn JSON")])
def test_a_lock_file_that_is_no_lock_record_is_taken_over_in_one_warning(tmp_path, caplog,
                                                                         text, what):
  (tmp_path / LOCK).write_text(text)
  with caplog.at_level(logging.WARNING, logger="absl"):
    lock = WorkdirLock(str(tmp_path))
    lock.acquire()  # Before: TypeError/ValueError/AttributeError tracebacks.
  assert "is not a lock record" in caplog.text, what
  assert json.loads((tmp_path / LOCK).read_text())["pid"] == lock._me["pid"]
  lock.release()


def test_a_lock_that_is_a_directory_refuses_in_one_line_and_its_advice_works(tmp_path):
  (tmp_path / LOCK).mkdir()
  with pytest.raises(WorkdirLockedError) as refused:
    WorkdirLock(str(tmp_path)).acquire()  # Before: IsADirectoryError.
  message = str(refused.value)
  assert "\n" not in message and f"rm -r '{tmp_path / LOCK}'" in message
  (tmp_path / LOCK).rmdir()  # The advice, followed.
  lock = WorkdirLock(str(tmp_path))
  lock.acquire()
  lock.release()


def test_a_live_pid_with_a_stale_heartbeat_is_refused_with_a_hint_that_works(tmp_path,
                                                                              live_pid):
  hold(tmp_path, live_pid, heartbeat=time.time() - 84 * 60)
  with pytest.raises(WorkdirLockedError, match=rf"stopped 84 min ago, so pid {live_pid} may be "
                     rf"an unrelated process .* remove '{tmp_path / LOCK}' and rerun"):
    WorkdirLock(str(tmp_path)).acquire()
  hold(tmp_path, live_pid)  # A fresh heartbeat: no hint.
  with pytest.raises(WorkdirLockedError) as fresh:
    WorkdirLock(str(tmp_path)).acquire()
  assert "may be an unrelated" not in str(fresh.value)
  (tmp_path / LOCK).unlink()  # The hint, followed.
  lock = WorkdirLock(str(tmp_path))
  lock.acquire()
  lock.release()
