"""The console commands `pip install -e .` puts beside launch/'s scripts: hybrid-nope-train is
`python launch/train.py`, hybrid-nope-check-data is `python launch/check_data.py`, and so on for
every launch/*.py (setup.py's entry points are `console_scripts()`: the folder is the list).

Each command runs its script as `python launch/SCRIPT.py` would, with the same flags; the
scripts stay where users and docs type them, and hold the logic of no command here.
"""
from __future__ import annotations

import glob
import os
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")
PREFIX = "hybrid-nope-"


def command_name(script: str) -> str:
  """launch/check_data.py -> hybrid-nope-check-data."""
  return PREFIX + os.path.splitext(os.path.basename(script))[0].replace("_", "-")


def console_scripts() -> list[str]:
  """setup.py's entry points: 'hybrid-nope-train = hybrid_nope.commands:main', ..."""
  return [f"{command_name(p)} = hybrid_nope.commands:main"
          for p in sorted(glob.glob(os.path.join(LAUNCH, "*.py")))]


def script_path(command: str) -> str:
  """hybrid-nope-check-data (or its path, as pip's wrapper leaves sys.argv[0]) ->
  REPO/launch/check_data.py."""
  name = os.path.basename(command)[len(PREFIX):]
  return os.path.join(LAUNCH, name.replace("-", "_") + ".py")


def main() -> None:
  """The entry point of every hybrid-nope-* command: the launch/ script its name names, run as
  __main__ with this command line (sys.argv[0] stays the command's name, for its messages)."""
  path = script_path(sys.argv[0])
  if not os.path.basename(sys.argv[0]).startswith(PREFIX) or not os.path.isfile(path):
    sys.exit(f"{os.path.basename(sys.argv[0])}: no launch script {path}: the hybrid-nope-* "
             f"commands run launch/*.py of a source checkout installed with `pip install -e .`")
  # As `python SCRIPT` runs it (runpy.run_path would set sys.argv[0] to the script's path):
  # __main__ is the script, whose docstring absl's --help prints.
  script = types.ModuleType("__main__", None)
  script.__file__ = path
  sys.modules["__main__"] = script
  with open(path, encoding="utf-8") as f:
    exec(compile(f.read(), path, "exec"), script.__dict__)  # pylint: disable=exec-used
