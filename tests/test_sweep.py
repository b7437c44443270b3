"""The sweep runner: planning, skipping finished runs, resuming partial ones, packing records."""
import json
import os
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from hybrid_nope import sweep
from hybrid_nope.run.reader import open_readonly
from tests.helpers import kill_before_first_save, tiny_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_run_dir(workdir, steps=(0, 32, 64)):
  os.makedirs(os.path.join(workdir, "recency_sums"), exist_ok=True)
  os.makedirs(os.path.join(workdir, "analysis", "step_64"), exist_ok=True)
  os.makedirs(os.path.join(workdir, "checkpoints", "64"), exist_ok=True)
  for name in ("config.json", "metrics.jsonl", "recency.jsonl", "recency_probe.json",
               "analysis/step_64/analysis_T1024.json", "checkpoints/64/state.bin"):
    with open(os.path.join(workdir, name), "w") as f:
      f.write(json.dumps({"name": name}) + "\n")
  for s in steps:
    with open(os.path.join(workdir, "recency_sums", f"step_{s:08d}.npz"), "wb") as f:
      f.write(b"x" * 10)


def test_plan_is_seed_major_and_refuses_repeated_seeds(tmp_path):
  runs = sweep.plan("configs/small.py", ["swa16", "nope"], [0, 1], str(tmp_path))
  assert [r.name for r in runs] == ["swa16/seed0", "nope/seed0", "swa16/seed1", "nope/seed1"]
  assert runs[0].workdir == os.path.join(str(tmp_path), "swa16", "seed0")
  with pytest.raises(ValueError, match="repeat"):
    sweep.plan("configs/small.py", ["swa16"], [0, 0], str(tmp_path))


def test_commands_pass_the_seed_and_the_init_null_only_when_asked(tmp_path):
  run = sweep.Run("configs/small.py", "swa16", 3, str(tmp_path))
  train, analyze = sweep.commands(run, python="py", analyze_args=["--lengths=1,2"],
                                  init_seeds=10)
  assert "--config=configs/small.py:swa16" in train and "--config.train.seed=3" in train
  assert analyze[-2:] == ["--lengths=1,2", "--init_seeds=10"]
  assert not any(a.startswith("--init_seeds") for a in sweep.commands(run, python="py")[1])


def test_commands_run_the_causal_test_only_when_asked(tmp_path):
  run = sweep.Run("configs/small.py", "swa16", 3, str(tmp_path))
  assert sweep.commands(run, python="py", ablate=True)[1][-1] == "--ablate=local"
  assert "--ablate=local" not in sweep.commands(run, python="py")[1]


def test_the_causal_test_runs_where_the_trained_run_has_a_local_mixer(tmp_path, monkeypatch):
  """--ablate=local refuses a global-only run, so the sweep asks for it only where config.json
  (there once trained) holds a local mixer; its JSON is among the packed records."""
  monkeypatch.setattr(sweep, "commands", lambda run, ablate=False, **kw: [
      [sys.executable, "-c", "pass"], [sys.executable, "-c", f"print('ablate', {ablate})"]])
  monkeypatch.setattr(sweep, "trained_steps", lambda workdir: (1, 1))
  for experiment, pattern, ablated in (("swa16", "SG", True), ("nope", "G", False),
                                       ("gdn", "DG", True)):
    run = sweep.Run("configs/small.py", experiment, 0, str(tmp_path))
    os.makedirs(run.workdir)
    with open(os.path.join(run.workdir, "config.json"), "w") as f:
      json.dump({"model": {"pattern": pattern}}, f)
    sweep.execute(run, threads=1, log=lambda m: None, lock_dir=str(tmp_path / "locks"),
                  ablate=True)
    assert open(os.path.join(run.workdir, "sweep.log")).read().split() == ["ablate",
                                                                           str(ablated)]
  assert sweep.has_local_mixer(run.reader)
  run = sweep.Run("configs/small.py", "swa16", 1, str(tmp_path))  # Not among those named.
  os.makedirs(run.workdir)
  with open(os.path.join(run.workdir, "config.json"), "w") as f:
    json.dump({"model": {"pattern": "SG"}}, f)
  sweep.execute(run, threads=1, log=lambda m: None, lock_dir=str(tmp_path / "locks"),
                ablate=True, ablate_experiments=("swa64",))
  assert open(os.path.join(run.workdir, "sweep.log")).read().split() == ["ablate", "False"]
  fake_run_dir(str(tmp_path / "packed"))
  with open(tmp_path / "packed" / "analysis" / "step_64" / "ablation_T1024.json", "w") as f:
    f.write("{}")
  packed = open_readonly(str(tmp_path / "packed"))
  assert "analysis/step_64/ablation_T1024.json" in sweep.record_files(packed)


def test_pack_keeps_records_and_first_and_last_sums_but_no_checkpoint(tmp_path):
  workdir = str(tmp_path / "run")
  fake_run_dir(workdir)
  path = sweep.pack_records(open_readonly(workdir), str(tmp_path / "out" / "seed0.tar.gz"))
  with tarfile.open(path) as tar:
    names = sorted(tar.getnames())
  assert "recency_sums/step_00000000.npz" in names and "recency_sums/step_00000064.npz" in names
  assert "recency_sums/step_00000032.npz" not in names
  assert not any(n.startswith("checkpoints") for n in names)
  assert "analysis/step_64/analysis_T1024.json" in names
  # Reproducible bytes: packing again gives the same file.
  with open(path, "rb") as f:
    first = f.read()
  with open(sweep.pack_records(open_readonly(workdir), path), "rb") as f:
    assert f.read() == first
  assert first[4:8] == bytes(4)  # The gzip header's mtime too: not the second it was packed.
  out = sweep.unpack_records(path, str(tmp_path / "unpacked"))
  assert open(os.path.join(out, "recency.jsonl")).read() == open(
      os.path.join(workdir, "recency.jsonl")).read()


def test_replace_record_swaps_one_record_and_keeps_every_other_byte_for_byte(tmp_path):
  workdir = str(tmp_path / "run")
  fake_run_dir(workdir)
  path = sweep.pack_records(open_readonly(workdir), str(tmp_path / "seed0.tar.gz"))
  before = sweep.read_pack(path)
  rel = "analysis/step_64/analysis_T1024.json"
  sweep.replace_record(path, rel, b'{"rerun": true}')
  after = sweep.read_pack(path)
  assert after[rel] == b'{"rerun": true}' and before[rel] != after[rel]
  assert {k: v for k, v in after.items() if k != rel} == {
      k: v for k, v in before.items() if k != rel}
  with tarfile.open(path) as tar:
    assert tar.getnames() == sorted(before)
  with pytest.raises(KeyError, match="holds no analysis/step_64/new.json"):
    sweep.replace_record(path, "analysis/step_64/new.json", b"{}")
  assert sweep.read_pack(path) == after


def test_pack_refuses_a_directory_that_is_not_a_run(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a run"):
    sweep.pack_records(open_readonly(str(tmp_path)), str(tmp_path / "x.tar.gz"))


def test_sweep_skips_done_runs_resumes_partial_ones_and_survives_a_failure(tmp_path,
                                                                           monkeypatch):
  """A stand-in for train.py that fails once for one run, as a kill would: the next sweep
  reruns only what is not done, and resumes it (the fake train counts its calls)."""
  calls = []
  fail_once = {"nope/seed0"}

  def fake_execute(run, *, threads, log, **kwargs):
    calls.append(run.name)
    if run.name in fail_once:
      fail_once.discard(run.name)
      raise RuntimeError("killed")
    fake_run_dir(run.workdir)
    return 1.0

  monkeypatch.setattr(sweep, "execute", fake_execute)
  runs = sweep.plan("configs/small.py", ["swa16", "nope"], [0, 1], str(tmp_path / "runs"))
  status = sweep.sweep(runs, parallel=2, threads=1, records_dir=str(tmp_path / "records"),
                       log=lambda m: None)
  assert status["nope/seed0"].startswith("failed") and status["swa16/seed1"] == "done"
  assert sorted(calls) == sorted(r.name for r in runs)
  calls.clear()
  status = sweep.sweep(runs, parallel=1, threads=1, records_dir=str(tmp_path / "records"),
                       log=lambda m: None)
  assert calls == ["nope/seed0"]
  assert status == {"swa16/seed0": "skipped", "nope/seed0": "done", "swa16/seed1": "skipped",
                    "nope/seed1": "skipped"}
  assert os.path.exists(tmp_path / "records" / "nope" / "seed0.tar.gz")


def print_affinity(run, **kw):
  return [[sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]]


@pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
                    reason="needs CPU affinity and two cores")
def test_a_run_is_pinned_to_a_core_no_other_sweep_holds(tmp_path, monkeypatch):
  """Another sweep (here, a lock this test holds) has the first core: the run takes the next
  one, and a run that needs more cores than the process has fails naming them."""
  monkeypatch.setattr(sweep, "commands", print_affinity)
  monkeypatch.setattr(sweep, "trained_steps", lambda workdir: (1, 1))
  first, second = sorted(os.sched_getaffinity(0))[:2]
  run = sweep.Run("configs/small.py", "swa16", 0, str(tmp_path / "run"))
  locks = str(tmp_path / "locks")
  with sweep.claimed_cores(1, lock_dir=locks) as other:
    assert other == {first}
    sweep.execute(run, threads=1, log=lambda m: None, lock_dir=locks)
  assert open(os.path.join(run.workdir, "sweep.log")).read().strip() == str([second])
  with sweep.claimed_cores(1, lock_dir=locks) as again:  # Released when the run ended.
    assert again == {first}
  with pytest.raises(ValueError, match="cores"):
    sweep.execute(run, threads=len(os.sched_getaffinity(0)) + 1, log=lambda m: None,
                  lock_dir=locks)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_a_run_waits_while_every_core_is_held_and_holds_none_meanwhile(tmp_path):
  locks, said = str(tmp_path / "locks"), []
  cores = len(os.sched_getaffinity(0))
  got = []
  with sweep.claimed_cores(cores, lock_dir=locks) as everything:
    def claim_one():
      with sweep.claimed_cores(1, lock_dir=locks, log=said.append, poll_seconds=0.01) as core:
        got.append(core)
    waiter = threading.Thread(target=claim_one)
    waiter.start()
    time.sleep(0.2)
    assert not got and len(said) == 1 and "waiting for 1 free core" in said[0]
  waiter.join(timeout=10)
  assert got and got[0] <= everything


def test_a_preempted_training_is_not_analysed(tmp_path, monkeypatch):
  """train.py saves and exits 0 when preempted: the runner must see the run is short of
  train.steps and stop before analysing or marking it done."""
  run = sweep.Run("configs/small.py", "swa16", 0, str(tmp_path))
  os.makedirs(run.workdir)
  with open(os.path.join(run.workdir, "config.json"), "w") as f:
    json.dump({"train": {"steps": 640}}, f)
  with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 101, "loss": 1.9}) + "\n" + '{"step": 10')  # torn last line
  ran = []
  monkeypatch.setattr(sweep, "commands", lambda run, **kw: [
      [sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(7)"]])
  with pytest.raises(RuntimeError, match="stopped at step 101 of 640"):
    sweep.execute(run, threads=1, log=ran.append, lock_dir=str(tmp_path / "locks"))
  assert sweep.trained_steps(run.reader) == (101, 640)


def test_a_fresh_clone_skips_runs_whose_records_are_committed(tmp_path, monkeypatch):
  """No workdirs (a new machine), but the packs of finished runs are in the repository."""
  records = tmp_path / "records"
  (records / "swa16").mkdir(parents=True)
  (records / "swa16" / "seed0.tar.gz").write_bytes(b"")
  calls = []
  monkeypatch.setattr(sweep, "execute", lambda run, **kw: calls.append(run.name) or
                      fake_run_dir(run.workdir) or 1.0)
  runs = sweep.plan("configs/small.py", ["swa16"], [0, 1], str(tmp_path / "runs"))
  status = sweep.sweep(runs, parallel=1, threads=1, records_dir=str(records),
                       log=lambda m: None)
  assert calls == ["swa16/seed1"] and status["swa16/seed0"] == "skipped"


def test_the_sweeps_pass_through_flags_keep_a_comma_inside_one_argument():
  """--analyze_args=--lengths=1,2,4 is one argument of analyze.py (a list flag split it into
  --lengths=1 plus stray 2 and 4, and analyze ran at length 1 alone)."""
  code = ("import sys; sys.path.insert(0, 'launch'); import sweep; from absl import flags; "
          "flags.FLAGS(['sweep.py', '--experiments=swa16', '--analyze_args=--lengths=1,2,4', "
          "'--analyze_args=--init_seeds=0', '--train_args=--config.a=1,2']); "
          "print(flags.FLAGS.analyze_args, flags.FLAGS.train_args)")
  out = subprocess.run([sys.executable, "-c", code], cwd=sweep.REPO, capture_output=True,
                       text=True, check=True).stdout
  assert out.strip() == "['--lengths=1,2,4', '--init_seeds=0'] ['--config.a=1,2']"


@pytest.mark.integration
def test_a_run_killed_before_its_first_checkpoint_starts_again_when_the_sweep_reruns(
    tmp_path, monkeypatch):
  """The sweep's own train.py command, killed with SIGKILL after step 0's records: the next
  sweep reruns the same command, which keeps those records aside and trains the run."""
  flags = tiny_flags(train__steps=40, checkpoint__every_steps=40, eval__every_steps=40,
                     metrics__every_steps=40)
  run = sweep.Run("configs/small.py", "swa16", 0, str(tmp_path / "runs"))
  real = sweep.commands
  train = real(run, train_args=flags)[0]
  os.makedirs(run.workdir)
  kill_before_first_save(train, run.workdir)
  monkeypatch.setattr(sweep, "commands", lambda run, **kw: [  # Training is what is tested.
      real(run, **kw)[0], [sys.executable, "-c", "pass"]])
  status = sweep.sweep([run], parallel=1, threads=1, records_dir=None, log=lambda m: None,
                       lock_dir=str(tmp_path / "locks"), train_args=flags)  # Not the machine's.
  assert status == {"swa16/seed0": "done"}
  (aside,) = os.listdir(os.path.join(run.workdir, "overwritten"))
  assert "recency.jsonl" in os.listdir(os.path.join(run.workdir, "overwritten", aside))
  assert sweep.trained_steps(run.reader) == (40, 40)
  with open(os.path.join(run.workdir, "sweep.log")) as f:
    assert "stopped before its first checkpoint" in f.read()  # The sweep's log stays put.


def test_a_pack_is_committed_by_itself_naming_its_records_dir(tmp_path, monkeypatch):
  for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
    monkeypatch.setenv(key, "t@t")
  subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
  (tmp_path / "other.txt").write_text("staged elsewhere, not committed with the pack")
  subprocess.run(["git", "add", "other.txt"], cwd=tmp_path, check=True)
  pack = tmp_path / "docs" / "primary" / "prose" / "swa64" / "seed0.tar.gz"
  pack.parent.mkdir(parents=True)
  pack.write_bytes(b"pack")
  sweep.git_commit(str(pack), sweep.Run("configs/small.py", "swa64", 0, str(tmp_path)))
  log = subprocess.run(["git", "log", "--format=%s", "--name-only"], cwd=tmp_path,
                       capture_output=True, text=True, check=True).stdout.split()
  assert " ".join(log) == "docs/primary/prose: records of swa64/seed0 " \
      "docs/primary/prose/swa64/seed0.tar.gz"


def _launch_sweep(*flags_, root):
  """launch/sweep.py's command line with the sweep itself replaced: prints its records_dir."""
  code = ("import runpy, sys\n"
          "from hybrid_nope import sweep\n"
          "sweep.sweep = lambda runs, **kw: print('records_dir', kw['records_dir']) or {}\n"
          "sys.argv = ['launch/sweep.py', *sys.argv[1:]]\n"
          "runpy.run_path('launch/sweep.py', run_name='__main__')\n")
  return subprocess.run([sys.executable, "-c", code, "--experiments=swa16", "--seeds=0",
                         f"--root={root}", *flags_], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO))


def test_the_sweeps_records_go_under_its_root_unless_given(tmp_path):
  """The default was docs/results/runs: a sweep wrote into the repository's tracked files."""
  root = str(tmp_path / "sweep")
  for flags_, expected in [((), os.path.join(root, "records")),
                           (("--records_dir=docs/results/runs",), "docs/results/runs"),
                           (("--records_dir=",), "None")]:
    done = _launch_sweep(*flags_, root=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"records_dir {expected}", done.stdout
  refused = _launch_sweep("--commit", root=root)
  assert refused.returncode != 0 and "records_dir" not in refused.stdout
  assert "--commit commits each pack to the repository: give --records_dir" in refused.stderr
