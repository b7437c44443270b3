"""config_help: every key of configs/base.py has a meaning beside it, and the parser reads a
key's comment (same line, continuation lines, lines above) without taking its neighbours'."""
import glob
import importlib
import os

from configs import base
from hybrid_nope import config_help

SOURCE = '''
def get_config():
  c = X()
  c.model = ConfigDict(dict(
      width=8,        # The width.
      depth=2,        # Layers, with a comment
                      # that continues here.
      # Above the key, at its indentation.
      bare=1,
      tail=(1,
            2),       # On the value's last line.
  ))
  c.mesh = ConfigDict(dict(data=-1))
  # One seed per run.
  c.model.seed = 3  # Derived.
  return c
'''


def test_the_parser_takes_each_comment_for_its_own_key():
  assert config_help.key_help(SOURCE) == {
      "model.width": "The width.",
      "model.depth": "Layers, with a comment that continues here.",
      "model.bare": "Above the key, at its indentation.",
      "model.tail": "On the value's last line.",
      "mesh.data": "",
      "model.seed": "One seed per run. Derived.",
  }


def test_every_key_of_the_defaults_has_a_meaning_and_no_meaning_is_stale():
  meanings = config_help.base_help()
  keys = set(config_help.leaves(base.get_config()))
  assert sorted(k for k in keys if not meanings.get(k)) == []
  assert sorted(set(meanings) - keys) == []


def test_every_config_file_sets_only_keys_the_defaults_explain():
  meanings = config_help.base_help()
  for path in sorted(glob.glob(os.path.join("configs", "*.py"))):
    module = importlib.import_module(f"configs.{os.path.basename(path)[:-3]}")
    if not hasattr(module, "get_config"):
      continue
    config = module.get_config()  # A file of several experiments: its default one.
    unexplained = sorted(set(config_help.leaves(config)) - set(meanings))
    assert unexplained == [], path


def test_help_text_shows_the_configs_values_beside_the_meanings():
  config = base.get_config()
  config.model.window = 77
  text = config_help.help_text(config)
  assert "  model.window = 77\n      S layers attend to this many tokens" in text
  key_lines = [l for l in text.splitlines() if l.startswith("  ") and not l.startswith("   ")]
  assert len(key_lines) == len(config_help.leaves(config))
