"""A run's model from its checkpoint: the definition the run's config builds and the params
`run.checkpoints` reads into that config's shapes (run/ builds no model, so the shapes come from
here). What analysis, export and decoding load."""
from __future__ import annotations

from hybrid_nope.model.definition import ModelDef, abstract_params, model_definition
from hybrid_nope.run.reader import RunReader


def restore_params(run: RunReader, step: int | None = None) -> tuple[int, ModelDef, dict]:
  """(step, model_def, params) of checkpoint `step` (None = the newest finished one) of `run`,
  in the shapes of its config in force, verified as `run.checkpoints.restore_params` says."""
  config = run.config
  wanted = abstract_params(config.model, config.train.seed)
  step, params = run.restore_params(wanted, step)
  return step, model_definition(config.model), params
