# Tiers (pytest.ini): the requeue tests train the tiny config twice through launch/slurm.sbatch,
# so they are integration, `make test-all` only; the script's signal handling, venv, container
# and NCCL settings run against a fake python in `make test`.
"""launch/slurm.sbatch as SLURM runs it: a job killed before its first checkpoint (kill -9, an
OOM, a lost node) and requeued, i.e. the same script with the same arguments again, starts; the
time-limit notice (SIGUSR1 to the batch shell) checkpoints and requeues, a SIGTERM (preemption,
scancel) checkpoints and leaves the requeue to SLURM; the interpreter, container and NCCL/XLA
settings the environment chooses."""
import os
import signal
import subprocess
import time

import pytest

from tests.helpers import REPO, kill_before_first_save, tiny_flags

SCRIPT = os.path.join(REPO, "launch", "slurm.sbatch")
# srun on one node: its options dropped, the task run once. With SKIP_GPU_PROBE the script's GPU
# probe passes (the real trainer's .venv is the CPU build; this is about the requeue).
FAKE_SRUN = """#!/bin/bash
[[ -n "${SRUN_LOG:-}" ]] && echo "$*" >> "${SRUN_LOG}"
while [[ "$1" == --* ]]; do shift; done
if [[ "$*" == *"jax.default_backend()"* && -n "${SKIP_GPU_PROBE:-}" ]]; then exit 0; fi
exec "$@"
"""


# scontrol records its arguments; apptainer records its own and runs the command after the
# image (exec --nv --bind R --pwd R IMAGE ...).
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "${SCONTROL_LOG}"
"""
FAKE_APPTAINER = """#!/bin/bash
echo "$*" >> "${APPTAINER_LOG}"
shift 7
exec "$@"
"""
# The interpreter the script runs: records each call (arguments, directory, NCCL/XLA settings);
# as the trainer with FAKE_TRAINER_WAITS=1 it trains until a SIGTERM, then exits 0 as the real
# one does after its checkpoint.
FAKE_PYTHON = """#!/bin/bash
echo "$*|$PWD|NCCL_DEBUG=${NCCL_DEBUG:-}|XLA_FLAGS=${XLA_FLAGS:-}" >> "${PYTHON_LOG}"
if [[ "$1" == launch/train.py && "${FAKE_TRAINER_WAITS:-}" == 1 ]]; then
  trap 'echo "trainer: SIGTERM" >> "${PYTHON_LOG}"; exit 0' TERM
  touch "${PYTHON_LOG}.training"
  while true; do sleep 0.05; done
fi
"""


def slurm_env(tmp_path, **extra):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                     ("apptainer", FAKE_APPTAINER), ("python", FAKE_PYTHON)):
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  logs = {f"{name.upper()}_LOG": str(tmp_path / f"{name}.log")
          for name in ("srun", "scontrol", "apptainer", "python")}
  env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "HYBRID_NOPE_"))}
  return dict(env, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=REPO,
              SLURM_JOB_ID="4242", SKIP_GPU_PROBE="1", **logs, **extra)


def lines(path) -> list[str]:
  return open(path).read().splitlines() if os.path.exists(path) else []


def fake_python_env(tmp_path, **extra):
  env = slurm_env(tmp_path, HYBRID_NOPE_PYTHON=str(tmp_path / "bin" / "python"), **extra)
  del env["SKIP_GPU_PROBE"]  # The fake python passes the probe.
  return env


def test_the_venv_repo_and_nccl_settings_come_from_the_environment(tmp_path):
  repo = tmp_path / "checkout"
  repo.mkdir()
  env = fake_python_env(tmp_path, HYBRID_NOPE_REPO=str(repo), XLA_FLAGS="--xla_dump_to=/d",
                        HYBRID_NOPE_SRUN_ARGS="--container-image=img --container-mounts=/s:/s")
  job = subprocess.run(["bash", SCRIPT, "configs/demo.py", "/runs/a", "--config.x=1"],
                       env=env, capture_output=True, text=True, timeout=60)
  assert job.returncode == 0, job.stderr
  probe, train = lines(env["PYTHON_LOG"])
  assert probe.startswith("-c import jax")
  assert train == (f"launch/train.py --config=configs/demo.py --workdir=/runs/a --config.x=1|"
                   f"{repo}|NCCL_DEBUG=WARN|XLA_FLAGS=--xla_dump_to=/d "
                   "--xla_gpu_enable_latency_hiding_scheduler=true")
  assert all("--container-image=img --container-mounts=/s:/s" in l
             for l in lines(env["SRUN_LOG"]))
  assert lines(env["SCONTROL_LOG"]) == []  # A run that ends by itself is not requeued.
  # The site's own settings win, and the flag is never given twice.
  env.update(NCCL_DEBUG="INFO", XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=false")
  os.remove(env["PYTHON_LOG"])
  subprocess.run(["bash", SCRIPT, "configs/demo.py", "/runs/a"], env=env, check=True,
                 capture_output=True, timeout=60)
  assert lines(env["PYTHON_LOG"])[1].endswith(
      "|NCCL_DEBUG=INFO|XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=false")


def test_a_container_runs_every_task_with_the_gpus_and_the_repo_bound(tmp_path):
  env = fake_python_env(tmp_path, HYBRID_NOPE_CONTAINER="/images/jax.sif")
  subprocess.run(["bash", SCRIPT, "configs/demo.py", "/runs/a"], env=env, check=True,
                 capture_output=True, timeout=60)
  python = env["HYBRID_NOPE_PYTHON"]
  assert [l.split(" -c ")[0] if " -c " in l else l for l in lines(env["APPTAINER_LOG"])] == [
      f"exec --nv --bind {REPO} --pwd {REPO} /images/jax.sif {python}",
      f"exec --nv --bind {REPO} --pwd {REPO} /images/jax.sif {python} launch/train.py "
      "--config=configs/demo.py --workdir=/runs/a"]
  assert len(lines(env["PYTHON_LOG"])) == 2


def start_job(tmp_path, env):
  job = subprocess.Popen(["bash", SCRIPT, "configs/demo.py", "/runs/a"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
  deadline = time.time() + 60
  while not os.path.exists(env["PYTHON_LOG"] + ".training"):
    assert job.poll() is None and time.time() < deadline, job.stderr.read()
    time.sleep(0.02)
  return job


@pytest.mark.parametrize("signum, requeued", [(signal.SIGUSR1, ["requeue 4242"]),
                                              (signal.SIGTERM, [])])
def test_a_signal_to_the_batch_shell_stops_the_trainer_and_the_time_limit_requeues(
    tmp_path, signum, requeued):
  env = fake_python_env(tmp_path, FAKE_TRAINER_WAITS="1")
  job = start_job(tmp_path, env)
  try:
    job.send_signal(signum)  # --signal=B:USR1@180 signals the batch shell alone.
    _, stderr = job.communicate(timeout=60)
  finally:
    if job.poll() is None:
      os.killpg(job.pid, signal.SIGKILL)
  assert job.returncode == 0, stderr
  assert lines(env["PYTHON_LOG"])[-1] == "trainer: SIGTERM"  # It checkpoints and exits 0.
  assert lines(env["SCONTROL_LOG"]) == requeued
  assert "the trainer checkpoints and exits" in stderr


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".venv", "bin", "python")),
                    reason="slurm.sbatch runs the repo's .venv (make install)")
def test_a_job_killed_before_its_first_checkpoint_starts_when_requeued(tmp_path):
  workdir = str(tmp_path / "run")
  job = ["bash", SCRIPT, "configs/demo.py", workdir,
         *tiny_flags(train__steps=40, checkpoint__every_steps=40, eval__every_steps=40)]
  env = slurm_env(tmp_path)
  kill_before_first_save(job, workdir, env=env)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    first_records = f.read()
  requeued = subprocess.run(job, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert requeued.returncode == 0, requeued.stderr[-3000:]
  assert "stopped before its first checkpoint: moved its records to" in requeued.stderr
  (aside,) = os.listdir(os.path.join(workdir, "overwritten"))
  with open(os.path.join(workdir, "overwritten", aside, "metrics.jsonl")) as f:
    assert f.read() == first_records  # Kept aside as they were.
  assert "40" in os.listdir(os.path.join(workdir, "checkpoints"))


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".venv", "bin", "python")),
                    reason="slurm.sbatch runs the repo's .venv (make install)")
def test_the_time_limit_notice_checkpoints_requeues_and_the_requeued_job_finishes(tmp_path):
  workdir = str(tmp_path / "run")
  steps = 3000  # Long enough that the notice comes mid-run.
  job = ["bash", SCRIPT, "configs/demo.py", workdir,
         *tiny_flags(train__steps=steps, train__log_every_steps=10, checkpoint__every_steps=steps,
                     eval__every_steps=steps, metrics__every_steps=steps)]
  env = slurm_env(tmp_path)
  proc = subprocess.Popen(job, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  metrics, deadline = os.path.join(workdir, "metrics.jsonl"), time.time() + 600
  try:
    while not (os.path.exists(metrics) and '"loss"' in open(metrics).read()):
      assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
      time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 0, stderr[-3000:]
  assert "preempted: saved step" in stderr
  (saved,) = [int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
  assert 0 < saved < steps
  assert lines(env["SCONTROL_LOG"]) == ["requeue 4242"]
  # SLURM reruns the script with the same arguments: it resumes and finishes.
  requeued = subprocess.run(job, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert requeued.returncode == 0, requeued.stderr[-3000:]
  assert f"resumed from {os.path.join(workdir, 'checkpoints')} at step {saved}" in requeued.stderr
  assert str(steps) in os.listdir(os.path.join(workdir, "checkpoints"))
  assert lines(env["SCONTROL_LOG"]) == ["requeue 4242"]  # Finished: not requeued again.
