"""The run's config for TensorBoard (`MetricsWriter.write_config`, at every start and resume).

Text dashboard, tag CONFIG_TAG: every key of the config in force as a markdown table, the
run-defining ones (`run_identity.is_defining`) marked. HParams dashboard: the run-defining keys
as the run's hparams (one session per workdir) with HPARAMS_METRICS as its metrics; TensorBoard
shows the last value each metric's scalar tag holds in the run, so the table always carries the
final eval loss without anything written at the end. Values that are no bool, number or string
(tuples, None) go in as their JSON text, so every defining key is a column.
"""
from __future__ import annotations

import json

from hybrid_nope.run import run_identity

CONFIG_TAG = "config"
# evaluation.evaluate's key at the training length, written as a scalar at every eval.
HPARAMS_METRICS = ("eval_loss",)


def _cell(value) -> str:
  """A value as markdown table text: JSON, with the pipes that would split the cell escaped."""
  return json.dumps(value).replace("|", "\\|")


def markdown_table(config) -> str:
  """| key | value | defines the run | for every flattened key, in the config's order."""
  lines = ["| key | value | defines the run |", "|---|---|---|"]
  lines += [f"| {key} | {_cell(value)} | {'yes' if run_identity.is_defining(key) else ''} |"
            for key, value in run_identity.flat(config).items()]
  return "\n".join(lines)


def hparam_values(config) -> dict[str, bool | int | float | str]:
  """The run-defining keys as HParams values (bool, number or string)."""
  return {key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
          for key, value in run_identity.defining(config).items()}


def hparams_summaries(config, metrics=HPARAMS_METRICS) -> tuple:
  """(experiment, session start) summaries of the HParams plugin (its protos, as tensorboardX
  builds them): the experiment lists the hparams and the metric tags, the session holds this
  run's values. tensorboardX's session-end summary is left out: it would mark a run still
  training as finished."""
  from tensorboardX.summary import hparams  # Lazily, as metrics_writer: process 0 only.
  experiment, session_start, _ = hparams(hparam_values(config), {tag: None for tag in metrics})
  return experiment, session_start
