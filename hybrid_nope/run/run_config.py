"""A run's config on disk: WORKDIR/config.json holds it as the run started and is never
rewritten; WORKDIR/config_history.jsonl holds the run's events (its start, each config change a
resume was allowed to make, rollbacks, skips), a change with the full config after it. Readers
(analysis, the sweep) take the config in force now from here. Which keys define a run (a
resume may not change them, run/run_identity.py) is written here once, for the trainer and
the report alike."""
from __future__ import annotations

import difflib
import json
from typing import Any

from hybrid_nope.run import storage
from hybrid_nope.errors import ConfigError, UserError
from hybrid_nope.run.run_dir import RunDir

# Keys added to the config after runs were saved without them, each with the value that gives
# those runs' behaviour (a layer kind or feature they lack reads it). A config without the key
# is read as holding that value: a resume (run/run_identity.py) and the seed grouping of
# compare alike; any other value is a change. These are not the defaults (configs/base.py):
# they are what old runs did, and stay when a default moves (train.schedule_offset's became 1,
# model.loss_block's 1024), else an old run's identity would change under it.
ADDED_KEYS = {"model.delta_gate": "head", "model.delta_impl": "auto",
              "model.delta_gate_form": "gla", "model.delta_expand_v": 1, "model.delta_v_heads": 0,
              "model.delta_qk_scale": "1", "model.delta_allow_neg_eigval": False,
              "eval.sample_every_steps": 0, "eval.sample_prompts": [],
              "eval.sample_max_new_tokens": 64, "data.skip_batches": 0,
              "data.exclude_samples": [], "train.grad_accum_steps": 1,
              "train.allow_changes": [], "train.overwrite": False,
              # The recipe keys of issue 40: before them, warmup + cosine with the first update
              # at lr 0, no z-loss, float32 parameters and moments, the head in compute dtype.
              "train.schedule": "cosine", "train.decay_fraction": 0.2,
              "train.schedule_offset": 0, "train.z_loss": 0.0,
              "train.opt_state_dtype": "float32", "model.param_dtype": "float32",
              "model.logits_dtype": "compute", "model.loss_block": 0}


def history(workdir: str) -> list[dict]:
  """config_history.jsonl's events; a line that is not a JSON object raises UserError naming
  the file and line (the file is rewritten whole, so no line is torn by a kill)."""
  path = RunDir(workdir).config_history
  if not storage.exists(path):
    return []
  events = []
  for number, line in enumerate(storage.read_text(path).splitlines(), 1):
    if not line.strip():
      continue
    try:
      event = json.loads(line)
    except json.JSONDecodeError as e:
      event = e
    if not isinstance(event, dict):
      raise UserError(f"{path} line {number} is not a JSON object ({line[:60]!r}"
                      f"{': ' + str(event) if isinstance(event, Exception) else ''}): fix or "
                      "remove that line")
    events.append(event)
  return events


def current(workdir: str, started_with: dict) -> dict:
  """The config in force now: the last one config_history.jsonl records, else `started_with`
  (config.json's)."""
  configs = [event["config"] for event in history(workdir) if "config" in event]
  return configs[-1] if configs else started_with


# The events config_history.jsonl holds whole configs for (run/run_identity.py names the rest).
EVENT_START, EVENT_CHANGE = "start", "config_change"
REBUILT_FROM = "rebuilt_from"  # On a config_history.jsonl line rebuilt from checkpoint meta.


def _changed(config: dict, changes: dict) -> dict:
  """`config` (nested) with each change's "to" value set at its "section.key"."""
  out = json.loads(json.dumps(config))
  for key, change in changes.items():
    node, *path, name = [out, *key.split(".")]
    for part in path:
      node = node.setdefault(part, {})
    node[name] = change["to"]
  return out


def rebuild_missing(workdir: str, lineage: list[dict], step: int) -> list[str]:
  """Before a resume from checkpoint `step`, whose meta holds `lineage` (the run's events up
  to it): a missing config.json is rebuilt from config_history.jsonl's start event, a missing
  config_history.jsonl from `lineage` (each change's config is config.json with the changes
  up to it applied; lines say what they were rebuilt from). Never from the command line: a
  config.json with no start event to rebuild it from raises UserError. Returns what it did."""
  rd, done = RunDir(workdir), []
  if not storage.exists(rd.config):
    starts = [e for e in history(workdir) if e.get("event") == EVENT_START and "config" in e]
    if not starts:
      raise UserError(
          f"{rd.config} is missing and {rd.config_history} holds no start config to rebuild "
          f"it from (checkpoint step {step} keeps only the run-defining keys): put the run's "
          "config.json back, or start afresh in a new --workdir")
    storage.write_text(rd.config, json.dumps(starts[0]["config"], indent=2, sort_keys=True)
                       + "\n")
    done.append(f"{rd.config} was missing: rebuilt from {rd.config_history}'s start event")
  if not storage.exists(rd.config_history):
    config = json.loads(storage.read_text(rd.config))
    source, lines = f"checkpoint step {step}'s meta", []
    for event in lineage:
      line = {**event, REBUILT_FROM: source}
      if event.get("event") == EVENT_START:
        line["config"] = config
      elif event.get("event") == EVENT_CHANGE:
        config = _changed(config, event.get("changes", {}))
        line["config"] = config
      lines.append(line)
    storage.write_text(rd.config_history, "".join(json.dumps(e) + "\n" for e in lines))
    done.append(f"{rd.config_history} was missing: rebuilt from {source} ({len(lines)} events; "
                "each change's config is config.json with the run-defining changes applied)")
  return done


# Keys whose change makes another run: the architecture, what a step sees, the init and the
# data order, and the recipe (learning-rate schedule, z-loss, optimizer-state dtype).
# Implementation choices (kernels, remat) produce the same function and may change freely, as
# may eval, logging and checkpoint settings.
DEFINING_PREFIXES = ("model.",)
DEFINING_KEYS = ("data.batch_size", "data.seq_len", "train.seed", "train.learning_rate",
                 "train.warmup_steps", "train.min_learning_rate_ratio", "train.steps",
                 "train.schedule", "train.decay_fraction", "train.schedule_offset",
                 "train.z_loss", "train.opt_state_dtype")
FREE_MODEL_KEYS = ("model.attention_impl", "model.linear_impl", "model.delta_impl",
                   "model.remat", "model.loss_block")


def flat(config) -> dict[str, Any]:
  """{"section.key": value} of a ConfigDict or nested dict, values as JSON would hold them
  (tuples as lists), so a config and one read back from meta compare equal."""
  tree = config.to_dict() if hasattr(config, "to_dict") else config
  out = {}

  def walk(prefix, node):
    for key, value in node.items():
      name = f"{prefix}{key}"
      if isinstance(value, dict):
        walk(name + ".", value)
      else:
        out[name] = json.loads(json.dumps(value, default=str))
  walk("", tree)
  return out


def with_added_keys(flat_config: dict[str, Any]) -> dict[str, Any]:
  """A flat config (`flat`) with each ADDED_KEYS key it lacks at the value its run had."""
  return {**ADDED_KEYS, **flat_config}


def is_defining(key: str) -> bool:
  return key not in FREE_MODEL_KEYS and (key.startswith(DEFINING_PREFIXES)
                                         or key in DEFINING_KEYS)


def defining(config) -> dict[str, Any]:
  """The run-defining part of `config`, flat: what each checkpoint's meta keeps."""
  return {k: v for k, v in flat(config).items() if is_defining(k)}


def allowed_changes(config) -> tuple[str, ...]:
  """train.allow_changes as key names: a tuple of names or of comma-separated names (the
  command line's --config.train.allow_changes=data.batch_size,train.steps arrives as a tuple
  holding one string). validate.py reads it at every start, so a typo fails at the first
  launch, not at the relaunch after a preemption."""
  value = config.train.allow_changes
  items = (value,) if isinstance(value, str) else tuple(value)
  if not all(isinstance(item, str) for item in items):
    raise ConfigError(f"config.train.allow_changes={value!r} is invalid: expected config key "
                      "names, e.g. data.batch_size,train.steps")
  keys = tuple(k.strip() for item in items for k in item.split(",") if k.strip())
  known = flat(config)
  for key in keys:
    if key not in known:
      near = difflib.get_close_matches(key, [k for k in known if is_defining(k)], n=1)
      hint = f"did you mean {near[0]}? " if near else ""
      raise ConfigError(f"config.train.allow_changes names {key!r}, which is no config key: "
                        f"{hint}expected run-defining keys such as data.batch_size or "
                        "model.window")
    if not is_defining(key):
      raise ConfigError(f"config.train.allow_changes names {key!r}, which a resume may change "
                        "anyway: list only run-defining keys (model.*, data.batch_size, "
                        f"data.seq_len, train.seed and the recipe: {', '.join(DEFINING_KEYS[3:])})")
  return keys
