"""The install paths: make targets and launch/install.sh (one place, also run on TPU workers)."""
import os
import subprocess
import sys

import jax
import pytest

from hybrid_nope.cloud.tpu import Tpu
from tests.helpers import REPO


@pytest.mark.parametrize("args, target", [(["install-gpu"], "cuda13"),
                                          (["install-gpu", "CUDA=12"], "cuda12"),
                                          (["install-tpu"], "tpu")])
def test_make_targets_run_install_sh_for_their_hardware(args, target):
  # -W: as if the CPU venv were stale, so make prints every command it would run.
  # --no-print-directory: under `make test` this make is a sub-make, which would say so.
  proc = subprocess.run(["make", "--no-print-directory", "-n", "-W", "launch/install.sh", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert any(l.endswith("bash launch/install.sh cpu") for l in lines), lines
  assert lines[-1].endswith(f"bash launch/install.sh {target}"), lines


def test_tpu_workers_run_what_make_install_tpu_runs():
  [command] = Tpu("n", "z", "v5p-8").install()[-1:]
  assert command.endswith("--command=cd ~/hybrid_nope && bash launch/install.sh tpu")


def test_make_test_next_installs_the_next_lock_into_a_venv_of_its_own():
  proc = subprocess.run(["make", "--no-print-directory", "-n", "-W", "launch/install.sh",
                         "test-next"], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert any(l.endswith("VENV=.venv-next LOCK=requirements-next.lock bash launch/install.sh cpu")
             for l in lines), lines
  assert lines[-1].startswith(".venv-next/bin/python -m pytest"), lines


def read_lock(name):
  pins = [l.split("==") for l in open(os.path.join(REPO, name)).read().splitlines()
          if l and not l.startswith("#")]
  return {package.lower().replace("_", "-"): version for package, version in pins}


def test_the_two_locks_hold_one_package_set():
  # The next lock differs in the jax it runs on, not in what else a venv holds.
  old, new = read_lock("requirements.lock"), read_lock("requirements-next.lock")
  assert old.keys() == new.keys()
  assert {p for p in old if old[p] != new[p]} <= {"jax", "jaxlib", "flax"}


def test_install_sh_pins_the_jax_this_venv_runs_and_refuses_unknown_targets():
  # install.sh's rule: the next lock from Python 3.12 on.
  lock = "requirements-next.lock" if sys.version_info >= (3, 12) else "requirements.lock"
  assert read_lock(lock)["jax"] == jax.__version__
  proc = subprocess.run(["bash", "launch/install.sh", "cuda11"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 2 and "expected cpu, tpu, cuda12 or cuda13" in proc.stderr
