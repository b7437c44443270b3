# Tiers (pytest.ini): test_train_refuses_a_repeated_tuple_override_before_anything_runs runs
# launch/train.py in a subprocess, so it is integration, `make test-all` only.
# test-all only: launch/train.py itself refuses a repeated override in one line (exit 2) before
# creating the workdir (test_train_refuses_a_repeated_tuple_override_before_anything_runs;
# cli._parse's refusals are checked here in `make test`).
"""Launch scripts' error handling: user errors and stopped runs are one line with their code."""
import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from hybrid_nope import cli
from hybrid_nope.errors import RUN_STOPPED_EXIT_CODE, USAGE_EXIT_CODE, RunStopped, UserError
from tests.helpers import REPO


CONFIG = """
import ml_collections


def get_config():
  return ml_collections.ConfigDict(dict(
      model=dict(pattern="SG", window=64), data=dict(domains=("a@1",)), train=dict(steps=3)))
"""


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "config.py"
  path.write_text(CONFIG)
  return str(path)


def parse(argv):
  """cli._parse of argv with a --config flag of its own (not the process's flags)."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=flag_values, sys_argv=argv)
  cli._parse(argv, flag_values)
  return flag_values.config


def parse_error(argv, capsys) -> str:
  """The message of the one line `PROG: message` cli._parse prints for argv, checking it exits
  USAGE_EXIT_CODE."""
  with pytest.raises(SystemExit) as exit_info:
    parse(argv)
  assert exit_info.value.code == USAGE_EXIT_CODE
  err = capsys.readouterr().err
  prog = f"{os.path.basename(sys.argv[0])}: "
  assert err.startswith(prog) and err.count("\n") == 1, err
  return err[len(prog):]


@pytest.mark.parametrize("override, expected", [
    ("--config.model.pattern.x=1",  # A string: indexing it raised a TypeError traceback.
     "--config.model.pattern.x: config.model.pattern is a value, not a section, so it has no "
     "key 'x' (config.model.pattern='SG')"),
    ("--config.model.window.x=1",
     "--config.model.window.x: config.model.window is a value, not a section, so it has no "
     "key 'x' (config.model.window=64)"),
    ("--config.data.domains.x=1",
     "--config.data.domains.x: config.data.domains is a value, not a section, so it has no "
     "key 'x' (config.data.domains=('a@1',))"),
    ("--config.model.nonexistent=1", "--config.model.nonexistent: config.model has no key "
     "'nonexistent'"),
    ("--config.nosection.b=2", "--config.nosection.b: config has no key 'nosection'"),
])
def test_an_override_that_names_no_key_is_one_line_with_its_full_path(config_file, capsys,
                                                                     override, expected):
  argv = ["prog.py", f"--config={config_file}", "--config.train.steps=5", override]
  assert parse_error(argv, capsys).startswith(expected)


def test_valid_overrides_still_apply(config_file):
  config = parse(["prog.py", f"--config={config_file}", "--config.train.steps=5",
                  '--config.data.domains=("a@1", "b@2")'])
  assert config.train.steps == 5 and config.data.domains == ("a@1", "b@2")


@pytest.mark.parametrize("args, expected", [
    # ml_collections joined the two into a 2-domain mix.
    (["--config.data.domains=a@1", "--config.data.domains=b@1"],
     "--config.data.domains is given twice (--config.data.domains=a@1 and "
     "--config.data.domains=b@1): give it once (a tuple takes all its items in one value"),
    (["--config.train.steps=4", "--config.train.steps", "5"],
     "--config.train.steps is given twice (--config.train.steps=4 and --config.train.steps)"),
    (["--config=CONFIG"], "--config is given twice"),
])
def test_an_override_given_twice_is_refused_naming_it(config_file, capsys, args, expected):
  argv = ["prog.py", f"--config={config_file}",
          *[a.replace("CONFIG", config_file) for a in args]]
  assert parse_error(argv, capsys).startswith(expected)


def test_a_missing_config_file_is_one_line_naming_it(tmp_path, capsys):
  missing = str(tmp_path / "nothere.py")
  assert parse_error(["prog.py", f"--config={missing}", "--config.train.steps=5"],
                     capsys).startswith(f"--config={missing}: the config file does not exist")
  assert parse_error(["prog.py", "--config", str(tmp_path)],
                     capsys).startswith(f"--config={tmp_path}: the config file is a directory")


def test_a_syntax_error_in_the_config_file_names_the_file_line_and_message(tmp_path, capsys):
  path = tmp_path / "broken.py"
  path.write_text("import ml_collections\n\ndef get_config(:\n  return None\n")
  err = parse_error(["prog.py", f"--config={path}"], capsys)
  assert err.startswith(f"--config={path}: syntax error in {path} line 3: ")
  assert "invalid syntax" in err


@pytest.fixture
def dict_flag():
  """A config dict flag of cli.define_config_dict, defined on the process's flags and removed
  after the test."""
  name = "cli_test_config"
  yield name
  if name in flags.FLAGS:
    delattr(flags.FLAGS, name)


@pytest.mark.parametrize("args, expected", [
    (["--cli_test_config.model.pattern.x=1"],
     "--cli_test_config.model.pattern.x: cli_test_config.model.pattern is a value, not a "
     "section"),
    (["--cli_test_config.train.steps=1", "--cli_test_config.train.steps=2"],
     "--cli_test_config.train.steps is given twice"),
])
def test_define_config_dict_fails_in_one_line_too(dict_flag, monkeypatch, capsys, args, expected):
  import ml_collections
  monkeypatch.setattr("sys.argv", ["prog.py", *args])
  default = ml_collections.ConfigDict(dict(model=dict(pattern="SG"), train=dict(steps=3)))
  with pytest.raises(SystemExit) as exit_info:
    cli.define_config_dict(dict_flag, default, "test")
  assert exit_info.value.code == USAGE_EXIT_CODE
  assert capsys.readouterr().err.startswith(f"prog.py: {expected}")


@pytest.mark.integration
def test_train_refuses_a_repeated_tuple_override_before_anything_runs(tmp_path):
  """The wiring, end to end: launch/train.py with the real config (one subprocess, ~3 s)."""
  proc = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/demo.py",
       f"--workdir={tmp_path / 'run'}", "--config.data.domains=a@1",
       "--config.data.domains=b@1"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == USAGE_EXIT_CODE
  assert proc.stderr.startswith("train.py: --config.data.domains is given twice"), proc.stderr
  assert proc.stderr.count("\n") == 1 and not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("raised, code", [(UserError("config.x=1 is invalid"), USAGE_EXIT_CODE),
                                          (RunStopped("loss is nan at step 3"),
                                           RUN_STOPPED_EXIT_CODE)])
def test_run_prints_one_line_and_exits_with_the_errors_code(monkeypatch, capsys, raised, code):
  def main(argv):
    raise raised
  monkeypatch.setattr("sys.argv", ["prog.py"])
  monkeypatch.setattr(cli, "exit_now", lambda code: (_ for _ in ()).throw(SystemExit(code)))
  with pytest.raises(SystemExit) as exit_info:
    cli.run(main)
  assert exit_info.value.code == code
  assert capsys.readouterr().err == f"prog.py: {raised}\n"


def test_a_bug_is_not_swallowed(monkeypatch):
  def main(argv):
    raise ZeroDivisionError("a bug")
  monkeypatch.setattr("sys.argv", ["prog.py"])
  with pytest.raises(ZeroDivisionError):
    cli.run(main)


def test_a_stray_positional_argument_is_refused_unless_the_command_takes_some(monkeypatch,
                                                                              capsys):
  """`--lengths=1 2 4` (a list flag's value split by a caller) must not run with lengths=[1]."""
  seen = []
  monkeypatch.setattr(cli, "exit_now", lambda code: (_ for _ in ()).throw(SystemExit(code)))
  monkeypatch.setattr("sys.argv", ["prog.py", "2", "4"])
  with pytest.raises(SystemExit) as exit_info:
    cli.run(seen.append)
  assert exit_info.value.code == USAGE_EXIT_CODE and not seen
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "unexpected argument(s) '2 4'" in err
  with pytest.raises(SystemExit):  # app.run exits with main's return value.
    cli.run(seen.append, positional="workdirs")
  assert seen == [["prog.py", "2", "4"]]
