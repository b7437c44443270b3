# Tiers (pytest.ini): the tests marked integration here run launch/tpu.py end to end in a
# subprocess against a fake gcloud, so they are `make test-all` only; the relaunch logic stays in
# `make test`.
# test-all only: each command runs exactly what --dry-run prints
# (test_commands_run_exactly_what_dry_run_prints); create with a config copies, installs and
# starts on every worker (test_create_with_config_copies_installs_and_starts_on_every_worker);
# docs/scaling.md shows the current dry-run output (test_docs_show_the_current_dry_run_output);
# bad arguments fail with a message (test_bad_arguments_fail_with_a_message); fetch copies
# records, not checkpoints (test_fetch_copies_records_not_checkpoints); a single-host slice may
# keep a local workdir (test_a_single_host_slice_may_keep_a_local_workdir).
"""launch/tpu.py against a fake gcloud that records its arguments."""
import json
import os
import shlex
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--name=sweep-1", "--zone=us-east5-a"]


@pytest.fixture
def fake_gcloud(tmp_path):
  log = tmp_path / "calls.jsonl"
  gcloud = tmp_path / "bin" / "gcloud"
  gcloud.parent.mkdir()
  gcloud.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
  gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
  env = dict(os.environ, PATH=f"{gcloud.parent}{os.pathsep}{os.environ['PATH']}")

  def run(*args):
    proc = subprocess.run([sys.executable, "launch/tpu.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    calls = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return proc, calls
  return run


@pytest.mark.parametrize("args", [
    ["create", "--tpu-type=v5p-64", "--spot"],
    ["create", "--tpu-type=v4-32", "--queued"],
    ["run", "--config=configs/swa256_350m.py", "--", "--config.data.path=/mnt/prolong"],
    ["status"], ["status", "--queued"], ["logs"], ["delete"], ["delete", "--queued"],
])
@pytest.mark.integration
def test_commands_run_exactly_what_dry_run_prints(fake_gcloud, args):
  dry, calls = fake_gcloud(*args[:1], *COMMON, "--dry-run", *args[1:])
  assert dry.returncode == 0, dry.stderr
  assert calls == []  # A dry run calls nothing.
  printed = [shlex.split(line) for line in dry.stdout.splitlines()]
  real, calls = fake_gcloud(*args[:1], *COMMON, *args[1:])
  assert real.returncode == 0, real.stderr
  assert calls == [cmd[1:] for cmd in printed if cmd[0] == "gcloud"]
  assert calls and all(c[:2] == ["compute", "tpus"] and "--zone=us-east5-a" in c for c in calls)


@pytest.mark.integration
def test_create_with_config_copies_installs_and_starts_on_every_worker(fake_gcloud):
  dry, _ = fake_gcloud("create", *COMMON, "--dry-run", "--tpu-type=v5p-64",
                       "--config=configs/swa256_350m.py", "--workdir=gs://b/run")
  lines = dry.stdout.splitlines()
  assert "tpu-vm create sweep-1" in lines[0] and "--accelerator-type=v5p-64" in lines[0]
  assert lines[1].startswith("git -C") and "archive" in lines[1]
  assert "scp" in lines[2] and "--worker=all" in lines[2]
  assert all("--worker=all" in l for l in lines[3:])
  assert "bash launch/install.sh tpu" in lines[4]  # What make install-tpu runs.
  assert "launch/train.py --config=configs/swa256_350m.py" in lines[5]


@pytest.mark.integration
def test_docs_show_the_current_dry_run_output(fake_gcloud):
  dry, _ = fake_gcloud("create", "--dry-run", "--config=configs/swa256_350m.py",
                       "--tpu-type=v5p-64", "--zone=us-east5-a",
                       "--workdir=gs://BUCKET/swa256_350m", "--",
                       "--config.data.path=/mnt/prolong", "--config.eval.path=/mnt/textbooks")
  docs = open(os.path.join(REPO, "docs", "scaling.md")).read()
  for line in dry.stdout.splitlines():
    if line.startswith("gcloud"):
      assert line in docs, line


@pytest.mark.parametrize("args, message", [
    (["create", "--zone=z", "--tpu-type=v5x"], "--tpu-type='v5x'"),
    (["create", "--zone=z", "--tpu-type=tpu-64"], "--tpu-type"),
    (["create", "--tpu-type=v5p-64"], "--zone is required"),
    (["create", "--zone=z"], "--tpu-type is required"),
    (["run", "--zone=z"], "run needs --config"),
    (["run", "--zone=z", "--config=configs/nope.py"], "no such file"),
    (["status", "--zone=z", "--name=Bad_Name"], "--name"),
    (["create", "--zone=z", "--tpu-type=v5p-64", "--config=configs/swa256_350m.py"],
     "a v5p-64 slice has 8 workers"),
    (["relaunch", "--zone=z", "--tpu-type=v4-32"], "relaunch needs --config"),
    (["fetch", "--zone=z"], "fetch needs --dest"),
])
@pytest.mark.integration
def test_bad_arguments_fail_with_a_message(fake_gcloud, args, message):
  proc, calls = fake_gcloud(*args, "--dry-run")
  assert proc.returncode == 2 and message in proc.stderr and calls == []


@pytest.mark.integration
def test_fetch_copies_records_not_checkpoints(fake_gcloud):
  dry, _ = fake_gcloud("fetch", *COMMON, "--dry-run", "--workdir=gs://b/run", "--dest=/tmp/r")
  assert dry.stdout.strip() == ("gcloud storage rsync --recursive '--exclude=^checkpoints/' "
                                "gs://b/run /tmp/r")


@pytest.mark.integration
def test_a_single_host_slice_may_keep_a_local_workdir(fake_gcloud):
  dry, _ = fake_gcloud("create", *COMMON, "--dry-run", "--tpu-type=v5p-8",
                       "--config=configs/swa256_350m.py")
  assert dry.returncode == 0, dry.stderr


def test_relaunch_recreates_a_preempted_tpu_until_the_run_finishes():
  from hybrid_nope.cloud.tpu import Tpu, relaunch
  tpu = Tpu("sweep-1", "us-east5-a", "v5p-64", spot=True)
  # The node is preempted, then READY but still training, then gone, then READY and finished.
  states = iter([(0, "PREEMPTED\n"), (0, "READY\n"), (1, ""), (0, "READY\n")])
  finished = iter([(0, "0\n"), (0, "1\n")])
  calls, sleeps = [], []

  def runner(cmd):
    calls.append(cmd)
    if cmd == tpu.state():
      return next(states)
    if cmd == tpu.finished():
      return next(finished)
    return 0, ""
  start = [["copy"], ["install"], ["train"]]
  assert relaunch(tpu, start, runner, sleep=sleeps.append, poll_seconds=300,
                  max_relaunches=5) == 2
  assert sleeps == [300]
  relaunches = [calls[i:i + 4] for i, c in enumerate(calls) if c == tpu.create()]
  assert relaunches == [[tpu.create(), *start]] * 2
  assert calls.count(tpu.delete()) == 1  # Only the preempted node existed to delete.


def test_relaunch_gives_up_after_max_relaunches():
  from hybrid_nope.cloud.tpu import Tpu, TpuArgError, relaunch
  tpu = Tpu("sweep-1", "us-east5-a", "v5p-64", spot=True)
  with pytest.raises(TpuArgError, match="relaunched 1 times"):
    relaunch(tpu, [], lambda cmd: (0, "PREEMPTED") if cmd == tpu.state() else (0, ""),
             sleep=lambda s: None, poll_seconds=1, max_relaunches=1)


def test_relaunch_restarts_a_trainer_that_exited_on_a_ready_node():
  """A READY node whose trainer was killed before the end (kill -9, an OOM): relaunch stops
  the other workers' trainers and starts training again, instead of waiting for ever."""
  from hybrid_nope.cloud.tpu import Tpu, TpuArgError, relaunch
  tpu = Tpu("sweep-1", "us-east5-a", "v5p-64", spot=True)
  exited = iter([(0, "exited\n"), (0, "")])
  finished = iter([(0, "0\n"), (0, "1\n")])
  calls = []

  def runner(cmd):
    calls.append(cmd)
    return {str(tpu.state()): lambda: (0, "READY\n"), str(tpu.trainer_exited()): exited.__next__,
            str(tpu.finished()): finished.__next__}.get(str(cmd), lambda: (0, ""))()
  start = [["copy"], ["install"], ["train"]]
  assert relaunch(tpu, start, runner, sleep=lambda s: None, poll_seconds=1,
                  max_relaunches=5) == 1
  assert [c for c in calls if c in (tpu.stop_trainers(), ["train"], tpu.create())] == [
      tpu.stop_trainers(), ["train"]]  # The node is kept: only the trainer starts again.
  with pytest.raises(TpuArgError, match="trainer exited before the run finished"):
    relaunch(tpu, start, lambda cmd: (0, "READY") if cmd == tpu.state() else
             (0, "exited") if cmd == tpu.trainer_exited() else (0, "0"),
             sleep=lambda s: None, poll_seconds=1, max_relaunches=2)


def git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def temp_repo(tmp_path):
  """A git repo with one commit holding an MDS config whose data paths are empty."""
  repo = tmp_path / "repo"
  repo.mkdir()
  git(repo, "init", "-q")
  git(repo, "config", "user.email", "t@example.com")
  git(repo, "config", "user.name", "t")
  (repo / "mds.py").write_text(
      "from configs import base\n\ndef get_config():\n  c = base.experiment('120m', 256)\n"
      "  c.data.path, c.eval.path = '', ''\n  return c\n")
  (repo / "prose.py").write_text(
      "from configs import demo\n\ndef get_config(path=''):\n  c = demo.get_config()\n"
      "  c.data.source, c.data.path = 'documents', path\n  return c\n")
  git(repo, "add", ".")
  git(repo, "commit", "-q", "-m", "configs")
  return repo


def test_uncommitted_edits_and_new_files_are_warned_about_and_a_clean_tree_is_not(temp_repo,
                                                                                  tmp_path):
  from hybrid_nope.cloud import launch_checks
  assert launch_checks.uncommitted_warning(str(temp_repo)) is None
  (temp_repo / "mds.py").write_text("changed\n")
  (temp_repo / "new.py").write_text("")
  warning = launch_checks.uncommitted_warning(str(temp_repo))
  assert warning.startswith(f"warning: 2 uncommitted change(s) in {temp_repo} (mds.py, new.py)")
  assert "`git archive HEAD`" in warning
  git(temp_repo, "add", "new.py")  # Staged is not committed either.
  assert "new.py" in launch_checks.uncommitted_warning(str(temp_repo))
  git(temp_repo, "commit", "-q", "-am", "more")
  assert launch_checks.uncommitted_warning(str(temp_repo)) is None
  assert launch_checks.uncommitted(str(tmp_path / "not_a_repo")) == []


@pytest.mark.parametrize("config, overrides, missing", [
    ("mds.py", (), ["data.path", "eval.path"]),
    ("mds.py", ("--config.data.path=/mnt/prolong",), ["eval.path"]),
    ("mds.py", ("--config.data.path=gs://b/p", "--config.eval.path", "/mnt/t"), []),
    ("mds.py", ("--config.data.source=stdlib",), []),  # The embedded corpus reads no path.
    ("prose.py", (), ["data.path"]),
    ("prose.py:/mnt/prose", (), []),  # FILE:ARG, as train.py's --config takes it.
])
def test_the_data_flags_a_config_needs_are_those_neither_it_nor_the_line_sets(
    temp_repo, config, overrides, missing):
  from hybrid_nope.cloud import launch_checks
  assert launch_checks.missing_data_flags(str(temp_repo / config), overrides) == missing


def test_the_data_keys_are_those_validate_refuses_empty(tmp_path):
  from configs import base, demo
  from hybrid_nope.cloud.launch_checks import data_keys
  from hybrid_nope.errors import ConfigError
  from hybrid_nope.validate import validate
  c = base.experiment("120m", 256)
  c.data.path, c.eval.path = "", ""
  for key in data_keys("mds"):
    with pytest.raises(ConfigError, match=f"config.{key}=''"):
      validate(c)
    c.data.path = str(tmp_path)  # Then the next key is the one refused.
  c = demo.get_config()
  c.data.source, c.data.path = "documents", ""
  (key,) = data_keys("documents")
  with pytest.raises(ConfigError, match=f"config.{key}=''"):
    validate(c)
  assert data_keys("stdlib") == ()
  validate(demo.get_config())


def test_create_warns_on_stderr_and_still_prints_its_commands(temp_repo, monkeypatch, capsys):
  from hybrid_nope.cloud import tpu_cli
  monkeypatch.setattr(tpu_cli, "REPO", str(temp_repo))
  (temp_repo / "mds.py").write_text((temp_repo / "mds.py").read_text() + "# edited\n")
  tpu_cli.main(["create", *COMMON, "--dry-run", "--tpu-type=v5p-8", "--config=mds.py"])
  out, err = capsys.readouterr()
  data, edits = err.splitlines()
  assert data.startswith("warning: mds.py reads data.path and eval.path, which the launch line "
                         "does not set") and "docs/reproduce.md" in data
  assert edits.startswith("warning: 1 uncommitted change(s)") and "mds.py" in edits
  assert "archive" in out and "launch/train.py --config=mds.py" in out
  tpu_cli.main(["run", *COMMON, "--dry-run", "--config=mds.py", "--",
                "--config.data.path=/d", "--config.eval.path=/e"])
  assert capsys.readouterr().err == ""  # Nothing is shipped by `run`; its flags are all there.
  tpu_cli.main(["status", *COMMON, "--dry-run"])
  assert capsys.readouterr().err == ""
