"""The config as TensorBoard shows it: a markdown table and HParams values."""
import json

import ml_collections

from hybrid_nope.run import config_summary


def _config():
  return ml_collections.ConfigDict({
      "model": {"pattern": "S|G", "window": None, "attention_impl": "auto", "d_model": 32},
      "data": {"batch_size": 4, "domains": ("a@1", "b@2")},
      "eval": {"length_multiples": (1, 2)}})


def test_every_key_is_one_row_and_a_pipe_does_not_split_it():
  lines = config_summary.markdown_table(_config()).splitlines()
  assert lines[:2] == ["| key | value | defines the run |", "|---|---|---|"]
  assert len(lines) == 2 + 7
  # Markdown splits cells at unescaped pipes only: each row has exactly four.
  assert all(line.replace("\\|", "").count("|") == 4 for line in lines)
  assert '| model.pattern | "S\\|G" | yes |' in lines
  assert "| model.attention_impl | \"auto\" |  |" in lines  # An implementation choice.
  assert '| eval.length_multiples | [1, 2] |  |' in lines


def test_hparams_are_the_defining_keys_as_bool_number_or_string():
  values = config_summary.hparam_values(_config())
  assert values == {"model.pattern": "S|G", "model.window": "null", "model.d_model": 32,
                    "data.batch_size": 4}
  experiment, session = config_summary.hparams_summaries(_config())
  assert [v.tag for v in experiment.value] == ["_hparams_/experiment"]
  assert [v.tag for v in session.value] == ["_hparams_/session_start_info"]
  assert json.loads(values["model.window"]) is None
