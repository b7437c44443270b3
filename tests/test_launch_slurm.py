# Tiers (pytest.ini): the requeue test trains the tiny config twice through launch/slurm.sbatch,
# so it is integration, `make test-all` only.
"""launch/slurm.sbatch as SLURM runs it: a job killed before its first checkpoint (kill -9, an
OOM, a lost node) and requeued, i.e. the same script with the same arguments again, starts."""
import os
import subprocess

import pytest

from tests.helpers import REPO, kill_before_first_save, tiny_flags

SCRIPT = os.path.join(REPO, "launch", "slurm.sbatch")
# srun on one node: its options dropped, the task run once. The script's GPU probe passes (this
# is about the requeue, not the backend).
FAKE_SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
if [[ "$*" == *"jax.default_backend()"* ]]; then exit 0; fi
exec "$@"
"""


def slurm_env(tmp_path):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  (bin_dir / "srun").write_text(FAKE_SRUN)
  (bin_dir / "srun").chmod(0o755)
  return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=REPO)


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
