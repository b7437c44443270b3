"""How launch scripts start: absl's app.run, with user errors as one line and exit code 2.

A traceback is for bugs. A bad --config.* key or value, a bad path, corrupt data or a corrupt
checkpoint (`UserError`) prints `PROG: message` on stderr and exits USAGE_EXIT_CODE.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable

from absl import app, flags
from ml_collections import config_flags

from hybrid_nope.errors import RUN_STOPPED_EXIT_CODE, USAGE_EXIT_CODE, RunStopped, UserError


def fail(message: str, code: int = USAGE_EXIT_CODE) -> None:
  print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def exit_now(code: int) -> None:
  """Exits without interpreter teardown, where orbax's and tensorstore's threads, cut short by
  the error, would print tracebacks into a closed event loop below the one line."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def unknown_override(argv: list[str], error: Exception) -> str:
  """Names the --FLAG.a.b override of argv that ml_collections could not resolve (its error
  holds only the last key), with its full path; falls back on the error's own text."""
  text = str(error).strip("\"'")
  missing = re.search(r"Attempting to lookup: ([\w.]+)", text)
  key = re.match(r"'?(\w+)'?", text)
  for arg in argv[1:]:
    if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
      continue
    name, *path = arg[2:].split("=", 1)[0].split(".")
    if missing and ".".join(path) == missing.group(1):
      return (f"--{name}.{missing.group(1)}: {name}.{'.'.join(path[:-1])} is a value, not a "
              f"section, so it has no key {path[-1]!r}")
    if key and key.group(1) in path:
      i = path.index(key.group(1))
      return (f"--{name}.{'.'.join(path)}: {'.'.join([name, *path[:i]])} has no key "
              f"{path[i]!r} (see the config file for the keys there are)")
  return f"a --FLAG.* override names no config key: {text}"


def define_config_dict(name: str, default, help_string: str) -> None:
  """config_flags.DEFINE_config_dict, which applies the command line's --NAME.* overrides as it
  is defined: an unknown key fails as one line here too."""
  try:
    config_flags.DEFINE_config_dict(name, default, help_string)
  except (AttributeError, KeyError) as e:
    fail(unknown_override(sys.argv, e))


def _parse(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e))
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no key.
    fail(unknown_override(argv, e))
  raise AssertionError("unreachable")


def run(main: Callable[[list[str]], None]) -> None:
  """app.run(main), printing a UserError (at flag parsing or in main) or a RunStopped as one line."""
  def guarded(argv):
    try:
      main(argv)
    except (UserError, RunStopped) as e:
      code = USAGE_EXIT_CODE if isinstance(e, UserError) else RUN_STOPPED_EXIT_CODE
      print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr, flush=True)
      exit_now(code)
  app.run(guarded, flags_parser=_parse)
