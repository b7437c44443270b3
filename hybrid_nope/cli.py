"""How launch scripts start: absl's app.run, with user errors as one line and exit code 2.

A traceback is for bugs. A bad --config.* key or value, a bad path, corrupt data or a corrupt
checkpoint (`UserError`) prints `PROG: message` on stderr and exits USAGE_EXIT_CODE; Ctrl-C
prints one line and exits INTERRUPTED_EXIT_CODE.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable

from absl import app, flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from hybrid_nope import logs
from hybrid_nope.errors import (INTERRUPTED_EXIT_CODE, RUN_STOPPED_EXIT_CODE, USAGE_EXIT_CODE,
                                RunStopped, UserError)


def fail(message: str, code: int = USAGE_EXIT_CODE) -> None:
  print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def exit_now(code: int) -> None:
  """Exits without interpreter teardown, where orbax's and tensorstore's threads, cut short by
  the error, would print tracebacks into a closed event loop below the one line."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _config_file_flags(flag_values) -> list[str]:
  """The names of the DEFINE_config_file flags."""
  return [name for name in flag_values
          if isinstance(flag_values[name].parser, ConfigFileFlagParser)]


def _config_args(argv: list[str], flag_values) -> list[tuple[str, str]]:
  """(key, argument) of each config file flag (key NAME) and each --NAME.a.b override (key
  NAME.a.b; --noNAME.a.b too) in argv, in order, up to absl's `--`."""
  files, out = _config_file_flags(flag_values), []
  for arg in argv[1:]:
    if arg == "--":
      break
    match = re.match(r"-{1,2}([A-Za-z_][^=]*)", arg)
    key = match.group(1) if match else ""
    if "." in key and key.startswith("no") and key[2:].split(".")[0] in flag_values:
      key = key[2:]  # --noNAME.a.b: a boolean set to False.
    if "." in key or key in files:
      out.append((key, arg))
  return out


def _overrides(argv: list[str], flag_values) -> list[tuple[str, str]]:
  return [(key, arg) for key, arg in _config_args(argv, flag_values) if "." in key]


def repeated_override(argv: list[str], flag_values=flags.FLAGS) -> str | None:
  """The first config file flag (--NAME=FILE) or --NAME.a.b override that argv gives twice,
  described; None if each comes once. ml_collections would apply the last one, or join a
  tuple's values into a longer tuple."""
  seen = {}
  for key, arg in _config_args(argv, flag_values):
    if key in seen:
      hint = (f" (a tuple takes all its items in one value: --{key}='(\"a\", \"b\")')"
              if "." in key else "")
      return f"--{key} is given twice ({seen[key]} and {arg}): give it once{hint}"
    seen[key] = arg
  return None


def flag_value(argv: list[str], name: str) -> str | None:
  """The value argv gives --NAME (=VALUE or a separate VALUE), the last one; None if absent."""
  value = None
  for i, arg in enumerate(argv[1:], 1):
    if arg == "--":
      break
    if re.fullmatch(rf"-{{1,2}}{re.escape(name)}", arg) and i + 1 < len(argv):
      value = argv[i + 1]
    elif match := re.fullmatch(rf"-{{1,2}}{re.escape(name)}=(.*)", arg, re.S):
      value = match.group(1)
  return value


def config_files(argv: list[str], flag_values=flags.FLAGS) -> dict[str, str]:
  """{flag name: its value in argv, FILE or FILE:ARG} for each DEFINE_config_file flag given."""
  out = {}
  for name in _config_file_flags(flag_values):
    value = flag_value(argv, name)
    if value is not None:
      out[name] = value
  return out


def missing_config_file(argv: list[str], flag_values=flags.FLAGS) -> str | None:
  for name, value in config_files(argv, flag_values).items():
    path = value.split(":", 1)[0]  # FILE:ARG passes ARG to get_config.
    if not os.path.isfile(path):
      what = "is a directory" if os.path.isdir(path) else "does not exist"
      return (f"--{name}={path}: the config file {what} (relative paths start at "
              f"{os.getcwd()}; expected a file such as configs/demo.py)")
  return None


def override_problem(argv: list[str], name: str, config, flag_values=flags.FLAGS) -> str | None:
  """The first --NAME.a.b override of argv that does not resolve in `config` (a key the
  section lacks, or a key below a value), described with its full path; None if all do."""
  for key, _ in _overrides(argv, flag_values):
    flag, *path = key.split(".")
    if flag != name:
      continue
    node = config
    for i, part in enumerate(path):
      here = ".".join([name, *path[:i]])
      if not hasattr(node, "keys"):
        shown = repr(node) if len(repr(node)) <= 40 else repr(node)[:37] + "..."
        return (f"--{key}: {here} is a value, not a section, so it has no key {part!r} "
                f"({here}={shown})")
      if part not in node.keys():
        return (f"--{key}: {here} has no key {part!r} (see the config file for the keys "
                f"there are)")
      node = node[part]
  return None


def bad_override(argv: list[str], error: Exception, flag_values=flags.FLAGS,
                 configs: dict | None = None) -> str | None:
  """What ml_collections' `error` (it names at most the last key) means in terms of argv's
  overrides: each config flag's config (`configs`, else its file loaded again) is walked along
  each override path. None if no override is to blame."""
  if configs is None:
    configs = {}
    for name, value in config_files(argv, flag_values).items():
      try:
        configs[name] = flag_values[name].parser.parse(value)
      except Exception:  # pylint: disable=broad-except
        continue  # Its own error is the one to show.
  for name, config in configs.items():
    problem = override_problem(argv, name, config, flag_values)
    if problem:
      return problem
  return None


def _one_line(error: Exception) -> str:
  return " ".join(str(error).split())


def define_config_dict(name: str, default, help_string: str) -> None:
  """config_flags.DEFINE_config_dict, which applies the command line's --NAME.* overrides as it
  is defined: an unknown or repeated key fails as one line here too."""
  problem = repeated_override(sys.argv)
  if problem:
    fail(problem)
  try:
    config_flags.DEFINE_config_dict(name, default, help_string)
  except (AttributeError, KeyError, TypeError) as e:
    problem = bad_override(sys.argv, e, configs={name: default})
    if problem is None and isinstance(e, TypeError):
      raise
    fail(problem or f"a --{name}.* override names no config key: {_one_line(e)}")


def _parse(argv: list[str], flag_values=flags.FLAGS) -> list[str]:
  """flag_values(argv), with a missing config file, a repeated override, an override that names
  no key and a syntax error in a config file each failing as one line."""
  problem = missing_config_file(argv, flag_values) or repeated_override(argv, flag_values)
  if problem:
    fail(problem)
  try:
    return flag_values(argv)
  except flags.Error as e:
    fail(str(e))
  except SyntaxError as e:  # In a config file (or a module it imports) while it loads.
    given = ", ".join(f"--{n}={v}" for n, v in config_files(argv, flag_values).items())
    fail(f"{given}: syntax error in {e.filename} line {e.lineno}: {e.msg}")
  except (AttributeError, KeyError, TypeError) as e:  # ml_collections: a bad override path.
    problem = bad_override(argv, e, flag_values)
    if problem is None and isinstance(e, TypeError):
      raise
    fail(problem or f"a --FLAG.* override names no config key: {_one_line(e)}")
  raise AssertionError("unreachable")


def run(main: Callable[[list[str]], None], *, positional: str | None = None) -> None:
  """app.run(main), printing a UserError (at flag parsing or in main) or a RunStopped as one line.
  `positional` names what the command's positional arguments are (e.g. "workdirs"); without
  it a positional argument is refused, since absl would hand it to main unread (a list flag's
  value split at its commas, say)."""
  def guarded(argv):
    logs.quiet_library_logs()  # Before main: jax's backend probe comes at its first call.
    try:
      if positional is None and len(argv) > 1:
        raise UserError(f"unexpected argument(s) {' '.join(argv[1:])!r}: this command takes "
                        f"flags only (--name=value; a list flag's value is one word, e.g. "
                        f"--lengths=1,2,4)")
      main(argv)
    except (UserError, RunStopped) as e:
      code = USAGE_EXIT_CODE if isinstance(e, UserError) else RUN_STOPPED_EXIT_CODE
      print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr, flush=True)
      exit_now(code)
    except KeyboardInterrupt as e:  # Ctrl-C (train: the second one, train/preemption.py).
      print(f"{os.path.basename(sys.argv[0])}: {e or 'interrupted (Ctrl-C)'}", file=sys.stderr,
            flush=True)
      exit_now(INTERRUPTED_EXIT_CODE)
  app.run(guarded, flags_parser=_parse)
