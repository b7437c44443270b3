"""Launch scripts' error handling: user errors and stopped runs are one line with their code."""
import pytest

from hybrid_nope import cli
from hybrid_nope.errors import RUN_STOPPED_EXIT_CODE, USAGE_EXIT_CODE, RunStopped, UserError


@pytest.mark.parametrize("error, expected", [
    (AttributeError("\"'nonexistent'\""), "--config.model.nonexistent: config.model has no key"),
    (KeyError("'nosection'"), "--config.nosection.b: config has no key 'nosection'"),
    (AttributeError("Attribute <class 'int'>.x does not exist and the type does not support "
                    "indexing. Attempting to lookup: model.window.x"),
     "--config.model.window.x: config.model.window is a value, not a section"),
])
def test_an_unknown_override_is_named_by_its_full_path(error, expected):
  argv = ["train.py", "--config=configs/demo.py", "--config.train.steps=3",
          "--config.model.nonexistent=1", "--config.nosection.b=2", "--config.model.window.x=1"]
  assert cli.unknown_override(argv, error).startswith(expected)


def test_an_error_that_matches_no_override_keeps_its_own_text():
  assert "ghost" in cli.unknown_override(["x.py", "--config.a=1"], KeyError("'ghost'"))


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
