"""The hybrid-nope-* console commands (hybrid_nope/commands.py): setup.py installs one per
launch/*.py, each resolves to a callable, and runs its script as `python launch/X.py` does;
README says how its commands find the environment."""
import glob
import importlib.metadata
import os
import re
import runpy
import subprocess
import sys
import types

from hybrid_nope import commands
from tests.helpers import REPO


def setup_kwargs(monkeypatch) -> dict:
  """What setup.py hands setuptools.setup (read without installing, and without setuptools:
  pip builds in an isolated environment, so a venv need not hold it, as Python 3.12's do not)."""
  got = {}
  stand_in = types.SimpleNamespace(setup=lambda **kw: got.update(kw), find_packages=lambda **_: [])
  monkeypatch.setitem(sys.modules, "setuptools", stand_in)
  runpy.run_path(os.path.join(REPO, "setup.py"))
  return got


def test_setup_installs_a_command_per_launch_script_each_resolving_to_a_callable(monkeypatch):
  scripts = setup_kwargs(monkeypatch).get("entry_points", {}).get("console_scripts", [])
  stems = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "launch",
                                                                           "*.py")))
  assert {"train", "analyze", "score", "generate", "report", "check_data"} <= set(stems)
  names = [s.split("=")[0].strip() for s in scripts]
  assert names == [f"hybrid-nope-{s.replace('_', '-')}" for s in stems], scripts
  for line in scripts:
    name, value = (part.strip() for part in line.split("="))
    target = importlib.metadata.EntryPoint(name, value, "console_scripts").load()
    assert callable(target)
    assert commands.script_path(name) == os.path.join(REPO, "launch",
                                                      name[len("hybrid-nope-"):].replace(
                                                          "-", "_") + ".py")


def test_the_installed_package_lists_the_commands(monkeypatch):
  """`pip install -e .` (make install) wrote them into the package's metadata."""
  wanted = {s.split("=")[0].strip() for s in setup_kwargs(monkeypatch)["entry_points"][
      "console_scripts"]}
  installed = {e.name for e in importlib.metadata.distribution("hybrid_nope").entry_points
               if e.group == "console_scripts"}
  assert installed == wanted, ("reinstall: .venv/bin/python -m pip install --no-deps -e .",
                               installed ^ wanted)


def _command(name: str, *args: str) -> subprocess.CompletedProcess:
  """`name ARGS...` as its console script runs it: sys.argv[0] is the command's path."""
  code = ("import sys; from hybrid_nope import commands; "
          f"sys.argv[0] = {os.path.join(sys.prefix, 'bin', name)!r}; commands.main()")
  return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=300)


def test_a_command_runs_its_script_with_its_flags_and_its_name_in_messages():
  done = _command("hybrid-nope-train", "--config=configs/nothing.py")
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.startswith("hybrid-nope-train: --config=configs/nothing.py: the config "
                                "file does not exist"), done.stderr[-2000:]
  helped = _command("hybrid-nope-check-data", "--help")
  assert "python launch/check_data.py" in helped.stdout  # Its docstring: absl's usage.
  unknown = _command("hybrid-nope-nothing")
  assert unknown.returncode == 1 and "no launch script" in unknown.stderr


def test_the_readme_says_how_its_commands_find_the_environment():
  """Its `python launch/...` commands failed in a fresh shell (ModuleNotFoundError: absl)."""
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  assert "python launch/" in readme and "source .venv/bin/activate" in readme
  assert "make install" in readme
  named = set(re.findall(r"\bhybrid-nope-[a-z-]*[a-z]", readme))
  assert "hybrid-nope-train" in named
  assert named <= {c.split("=")[0].strip() for c in commands.console_scripts()}, named
