"""What launch/tpu.py warns about before it ships a run: data flags the config needs but the
launch line lacks, and edits that `git archive HEAD` would leave behind."""
from __future__ import annotations

import importlib.util
import os
import subprocess

from hybrid_nope.cli import flag_value


def load_config(path: str):
  """The ConfigDict of a config file, FILE or FILE:ARG (ARG goes to get_config), as train.py's
  --config reads it."""
  file, _, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("launch_checked_config", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def data_keys(source: str) -> tuple[str, ...]:
  """The path keys a data.source reads at start (validate.validate refuses them empty): every
  source but the embedded corpus reads data.path, and ProLong's MDS its eval set at eval.path
  (`Source.path_keys`); an unknown name reads none here (validate names it)."""
  from hybrid_nope.data.sources import registry  # pylint: disable=g-import-not-at-top
  known = registry.lookup(source)
  return known.path_keys if known else ()


def missing_data_flags(config_path: str, overrides: tuple[str, ...]) -> list[str]:
  """The data path keys the config needs that neither it nor an override sets."""
  config = load_config(config_path)
  argv = ["train.py", *overrides]

  def value(key):
    given = flag_value(argv, f"config.{key}")
    if given is not None:
      return given
    section, name = key.split(".")
    return config[section][name]
  return [key for key in data_keys(value("data.source")) if not value(key)]


def data_flags_warning(config_path: str, overrides: tuple[str, ...],
                       repo: str = "") -> str | None:
  """`config_path` as given (relative to `repo`, the directory it is read from)."""
  missing = missing_data_flags(os.path.join(repo, config_path), overrides)
  if not missing:
    return None
  flags = " ".join(f"--config.{key}=..." for key in missing)
  return (f"warning: {config_path} reads {' and '.join(missing)}, which the launch line does not "
          f"set: the trainer on every worker would stop at start. Pass them after `--` ({flags}; "
          "a path every worker can read: a gs:// URL or a disk per worker, docs/scaling.md); "
          "the data and its dataset ids: docs/reproduce.md")


def uncommitted(repo: str) -> list[str]:
  """`git status --porcelain` of the repo: modified, staged, deleted and untracked files (not
  ignored ones); [] for a clean tree or where git cannot say."""
  try:
    out = subprocess.run(["git", "-C", repo, "status", "--porcelain"], check=True,
                         capture_output=True, text=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return []
  return [line[3:] for line in out.splitlines() if line.strip()]


def uncommitted_warning(repo: str) -> str | None:
  changed = uncommitted(repo)
  if not changed:
    return None
  shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
  return (f"warning: {len(changed)} uncommitted change(s) in {repo} ({shown}): the workers get "
          "`git archive HEAD`, so they will run without them; commit them first to ship them")
