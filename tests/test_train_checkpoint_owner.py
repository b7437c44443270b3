# Tiers (pytest.ini): two workdirs started together on one checkpoint directory train through
# launch/train.py, so that test is integration, `make test-all` only
# (test_two_workdirs_started_together_on_one_checkpoint_directory_one_trains); the claim's rules
# are checked here in `make test`.
"""One workdir per checkpoint directory: the marker a start writes, the refusal of a second
workdir (naming both, writing nothing), and the moves and copies that keep a run its own."""
import json
import logging
import os
import shutil

import pytest

from hybrid_nope.run import run_dir
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.checkpoint_owner import CheckpointOwnedError, claim


def tree(path):
  """Every file under `path` with its bytes: what a refused start must leave as it was."""
  found = {}
  for root, _, files in os.walk(path):
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        found[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return found


def fake_steps(directory, *steps):
  for step in steps:
    os.makedirs(os.path.join(directory, str(step), "state"))
    with open(os.path.join(directory, str(step), "state", "x"), "w") as f:
      f.write(f"step {step}")


def test_a_start_names_its_workdir_and_run_id_and_keeps_them(tmp_path):
  workdir = str(tmp_path / "run")
  owner = claim(workdir)
  marker = json.loads(open(RunDir(workdir).checkpoint_owner).read())
  assert marker["workdir"] == workdir and marker["run_id"] == owner.run_id
  assert marker["directory"] == RunDir(workdir).checkpoints
  assert claim(workdir).run_id == owner.run_id  # A rerun: the same run.


def test_a_second_workdir_on_one_checkpoint_directory_is_refused_naming_both(tmp_path):
  shared = str(tmp_path / "shared")
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  owner = claim(a, shared)
  fake_steps(shared, 10)
  before = tree(shared)
  for directory in (shared, "../shared"):  # Absolute, or relative to the workdir.
    with pytest.raises(CheckpointOwnedError) as e:
      claim(b, directory)
    message = str(e.value)
    assert "\n" not in message and a in message and b in message and owner.run_id in message
  assert tree(shared) == before  # Nothing written, nothing deleted.
  assert claim(a, shared).run_id == owner.run_id
  # The advice: give it its own directory (or none).
  assert claim(b, str(tmp_path / "b_checkpoints")).workdir == b
  assert claim(b).workdir == b


def test_a_workdir_moved_or_copied_with_its_checkpoints_takes_them_along(tmp_path, caplog):
  a = tmp_path / "a"
  owner = claim(str(a))
  shutil.copytree(a, tmp_path / "copy")
  with caplog.at_level(logging.WARNING, logger="absl"):
    copied = claim(str(tmp_path / "copy"))
  assert copied.run_id == owner.run_id and "moved or copied here" in caplog.text
  assert claim(str(a)).workdir == str(a)  # Each directory has its own marker.


def test_a_moved_workdir_on_a_shared_directory_follows_the_advice_to_delete_the_marker(tmp_path):
  shared, a = str(tmp_path / "shared"), tmp_path / "a"
  claim(str(a), shared)
  fake_steps(shared, 4)
  a.mkdir()
  (a / run_dir.CONFIG).write_text("{}")  # The run's records, moved with the workdir below.
  os.rename(a, tmp_path / "moved")
  with pytest.raises(CheckpointOwnedError, match="was moved to .*delete .*owner.json and rerun"):
    claim(str(tmp_path / "moved"), shared)
  os.remove(RunDir(str(tmp_path / "moved"), shared).checkpoint_owner)
  assert claim(str(tmp_path / "moved"), shared).workdir == str(tmp_path / "moved")


def test_a_workdir_reached_through_a_symbolic_link_is_the_same_run(tmp_path):
  """Paths are compared as the file system sees them: a link to the workdir, with its
  checkpoint directory outside it, is the run itself both ways round; another workdir is not."""
  shared, real = str(tmp_path / "shared"), tmp_path / "real"
  real.mkdir()
  os.symlink(real, tmp_path / "link")
  owner = claim(str(tmp_path / "link"), shared)
  fake_steps(shared, 4)
  assert claim(str(real), shared).run_id == owner.run_id
  assert claim(str(tmp_path / "link"), shared).run_id == owner.run_id
  with pytest.raises(CheckpointOwnedError, match="belongs to the run in"):
    claim(str(tmp_path / "other"), shared)
  # A marker written before paths were resolved names the link: it is still this run's.
  marker = RunDir(str(real), shared).checkpoint_owner
  with open(marker) as f:
    old = json.load(f)
  with open(marker, "w") as f:
    json.dump({**old, "workdir": str(tmp_path / "link")}, f)
  assert claim(str(real), shared).run_id == owner.run_id


def test_unowned_steps_are_refused_to_a_workdir_with_no_run(tmp_path):
  shared = str(tmp_path / "shared")
  fake_steps(shared, 4, 8)
  with pytest.raises(CheckpointOwnedError, match=r"holds steps \['4', '8'\] but names no owner"):
    claim(str(tmp_path / "new"), shared)
  assert not os.path.exists(RunDir(str(tmp_path / "new"), shared).checkpoint_owner)
  assert claim(str(tmp_path / "new"), str(tmp_path / "own")).run_id  # The advice.


@pytest.mark.parametrize("content, why", [
    ("", "JSONDecodeError"), ("[1, 2]", "TypeError"), ('{"workdir": "x"}', "KeyError"),
    ('{"workdir": "/w", "directory": "/w/checkpoints", "run_id": []}', "its run_id is \\[\\]"),
    ('{"workdir": 3, "directory": "/w/checkpoints", "run_id": "abc"}', "its workdir is 3"),
    ('{"workdir": "/w", "directory": null, "run_id": "abc"}', "its directory is None")])
def test_an_unreadable_marker_is_one_line_and_the_advice_works(tmp_path, content, why):
  """A value of the wrong type is refused too (it was written back as `run_id: "[]"`)."""
  workdir = str(tmp_path / "run")
  path = RunDir(workdir).checkpoint_owner
  os.makedirs(os.path.dirname(path))
  with open(path, "w") as f:
    f.write(content)
  with pytest.raises(CheckpointOwnedError,
                     match=f"owner.json is unreadable \\({why}.*delete it and rerun") as e:
    claim(workdir)
  assert "\n" not in str(e.value)
  os.remove(path)
  assert claim(workdir).workdir == workdir


def test_a_start_that_loses_the_race_for_the_marker_is_refused(tmp_path, monkeypatch):
  """Two workdirs claim at once: the second finds the first's marker only when it writes."""
  from hybrid_nope.run import checkpoint_owner
  shared, a, b = str(tmp_path / "shared"), str(tmp_path / "a"), str(tmp_path / "b")
  real_create = checkpoint_owner._create

  def first_a_wins(path, owner):
    if owner.workdir == b:
      monkeypatch.setattr(checkpoint_owner, "_create", real_create)
      claim(a, shared)
    return real_create(path, owner)

  monkeypatch.setattr(checkpoint_owner, "_create", first_a_wins)
  with pytest.raises(CheckpointOwnedError, match="belongs to the run in " + a):
    claim(b, shared)
  assert json.loads(open(RunDir(a, shared).checkpoint_owner).read())["workdir"] == a


@pytest.mark.parametrize("process", [0, 1])
def test_every_process_meets_the_barrier_on_every_path(tmp_path, monkeypatch, process):
  """A fresh claim, a resume (the marker found) and a lost race each pass the one barrier, on
  process 0 and on the others: a process that skipped it hung a two-process resume."""
  import jax
  from jax.experimental import multihost_utils
  from hybrid_nope.run import checkpoint_owner
  barriers, index = [], [0]
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: index[0])
  monkeypatch.setattr(multihost_utils, "sync_global_devices", barriers.append)
  workdir = str(tmp_path / "run")
  first = claim(workdir)  # Process 0 writes the marker: a fresh claim.
  index[0] = process
  assert claim(workdir) == first  # The resume: the marker is found.
  real_create, attempts = checkpoint_owner._create, []

  def lose_the_first_race(path, owner):  # Another start wrote first; the retry writes.
    attempts.append(path)
    return len(attempts) > 1 and real_create(path, owner)

  monkeypatch.setattr(checkpoint_owner, "_create", lose_the_first_race)
  assert claim(str(tmp_path / "other")).workdir.endswith("other")
  assert barriers == ["hybrid_nope checkpoint owner"] * 3


@pytest.mark.integration
def test_two_workdirs_started_together_on_one_checkpoint_directory_one_trains(tmp_path):
  """The sweep of the report: two runs with --config.checkpoint.directory=../shared at once.
  One trains; the other refuses at start in one line naming both, and writes no step."""
  import subprocess
  import sys
  from tests.helpers import REPO, tiny_flags
  workdirs = [str(tmp_path / name) for name in ("a", "b")]
  procs = [subprocess.Popen([sys.executable, "launch/train.py", "--config=configs/demo.py",
                             f"--workdir={w}", *tiny_flags(checkpoint__directory="../shared")],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True) for w in workdirs]
  results = [(p.wait(timeout=900), p.stderr.read()) for p in procs]
  assert sorted(code for code, _ in results) == [0, 2], [err[-2000:] for _, err in results]
  winner = [w for w, (code, _) in zip(workdirs, results) if code == 0][0]
  loser, (_, err) = [(w, r) for w, r in zip(workdirs, results) if r[0] == 2][0]
  (line,) = [l for l in err.splitlines() if l.startswith("train.py:")]
  assert winner in line and loser in line and "belongs to the run in" in line
  shared = str(tmp_path / "shared")
  owner = json.loads(open(os.path.join(shared, run_dir.CHECKPOINT_OWNER)).read())
  assert owner["workdir"] == winner
  assert sorted(n for n in os.listdir(shared) if n.isdigit()) == ["4", "8"]
  assert not os.path.exists(os.path.join(loser, run_dir.METRICS))
  before = tree(shared)
  again = subprocess.run([sys.executable, "launch/train.py", "--config=configs/demo.py",
                          f"--workdir={loser}", *tiny_flags(checkpoint__directory="../shared")],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
  assert again.returncode == 2 and tree(shared) == before  # A rerun too: untouched.
