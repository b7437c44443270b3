"""Config checks that run before anything is built or compiled.

Each failure names the config key, the value, and what is allowed.
"""
from __future__ import annotations

import importlib.util
import math


from hybrid_nope.run import run_config
from hybrid_nope.config_values import (SCHEDULES, boolean, data_seed, decay_steps, int_in,
                                       is_int, number_in, one_of, positive_int, require,
                                       string, value, verify_hashes)
from hybrid_nope.data.sources import registry
from hybrid_nope.errors import ConfigError
from hybrid_nope.kernels import DELTA_IMPLS, IMPLS, LINEAR_IMPLS
from hybrid_nope.model.attention import POSITION_ENCODINGS
from hybrid_nope.model.delta import GATES as DELTA_GATES
from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.pattern import layer_kinds, window_of
from hybrid_nope.model.transformer import DTYPES, LOGITS_DTYPES




def validate(config, *, check_paths: bool = True) -> None:
  """Raises ConfigError naming the first bad key. `check_paths=False` skips the checks that
  data directories exist (launch/lower.py lowers a step without reading any data)."""
  m, d = config.model, config.data
  for key in ("model.num_layers", "model.d_model", "model.num_heads", "model.num_kv_heads",
              "model.head_dim", "model.mlp_dim", "model.vocab_size", "data.seq_len",
              "data.batch_size", "train.steps", "train.log_every_steps",
              "checkpoint.every_steps", "checkpoint.keep", "eval.every_steps",
              "eval.batch_size", "eval.num_batches", "eval.bucket_size",
              "metrics.probe_batch_size", "metrics.every_steps", "train.grad_accum_steps"):
    positive_int(config, key)
  accum = config.train.grad_accum_steps
  require(config.data.batch_size % accum == 0, "train.grad_accum_steps", accum,
          f"a divisor of data.batch_size={config.data.batch_size} (each microbatch holds "
          "data.batch_size / train.grad_accum_steps rows)")
  try:
    layer_kinds(m.pattern, m.num_layers)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if window_of(m) is not None:
    require(isinstance(m.window, int) and m.window >= 1, "model.window", m.window,
            "an integer >= 1 (the sliding window, in tokens)")
  require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads", m.num_kv_heads,
          f"a divisor of model.num_heads={m.num_heads} (grouped-query attention)")
  require(m.head_dim % 2 == 0 or "rope" not in (m.swa_pos, m.global_pos), "model.head_dim",
          m.head_dim, "an even number (RoPE rotates pairs of channels)")
  require(m.swa_pos in POSITION_ENCODINGS, "model.swa_pos", m.swa_pos, f"one of {POSITION_ENCODINGS}")
  require(m.global_pos in POSITION_ENCODINGS, "model.global_pos", m.global_pos,
          f"one of {POSITION_ENCODINGS}")
  require(m.attention_impl in IMPLS, "model.attention_impl", m.attention_impl,
          f"one of {IMPLS}")
  require(m.linear_impl in LINEAR_IMPLS, "model.linear_impl", m.linear_impl,
          f"one of {LINEAR_IMPLS}")
  one_of(config, "model.delta_impl", DELTA_IMPLS)
  one_of(config, "model.delta_gate", DELTA_GATES)
  for kind in sorted(set(layer_kinds(m.pattern, m.num_layers))):
    KINDS[kind].check_config(config)  # The kind's own keys (its spec's checks).
  require(m.dtype == "auto" or m.dtype in DTYPES, "model.dtype", m.dtype,
          f"'auto' or one of {sorted(DTYPES)}")
  require(isinstance(config.metrics.far_lag, int) and 1 <= config.metrics.far_lag < d.seq_len,
          "metrics.far_lag", config.metrics.far_lag,
          f"an integer in [1, data.seq_len={d.seq_len}) (the far lag L must fit in a sequence)")
  pool = int_in(config, "metrics.probe_pool_rows", 1, None,
                "a positive int (eval rows the recency probe is chosen from)")
  require(config.metrics.probe_batch_size <= pool,
          "metrics.probe_batch_size", config.metrics.probe_batch_size,
          f"at most metrics.probe_pool_rows = {pool} (the probe is chosen from those eval rows)")
  int_in(config, "metrics.query_positions", 0, None, "an integer >= 0 (0 = every position)")
  source = registry.named(config)
  data_seed(config)
  string(config, "data.cache_dir", "a path or '' (the default cache)")
  boolean(config, "data.document_masking")
  registry.exclude_samples(config)
  source.check_keys(config, check_paths)  # The source's own keys (and paths, when asked).
  multiples = value(config, "eval.length_multiples")
  require(isinstance(multiples, (tuple, list)) and all(is_int(k) and k >= 1 for k in multiples)
          and len(set(multiples)) == len(multiples) and 1 in multiples,
          "eval.length_multiples", multiples, "distinct integers >= 1 including 1, e.g. (1, 2, 4) "
          "(eval rows of k × data.seq_len)")
  verify_hashes(config)
  for key in ("data.allow_changed_data", "metrics.figures"):
    boolean(config, key)
  samples_every = int_in(config, "eval.sample_every_steps", 0, None,
                         "an integer >= 0 (0 = no samples during training)")
  prompts = value(config, "eval.sample_prompts")
  require(isinstance(prompts, (tuple, list)) and all(isinstance(p, str) and p for p in prompts)
          and (bool(prompts) or not samples_every), "eval.sample_prompts", prompts,
          "a tuple of non-empty strings, at least one when eval.sample_every_steps > 0")
  positive_int(config, "eval.sample_max_new_tokens")
  run_config.allowed_changes(config)  # At every start: a typo fails at the first launch.
  int_in(config, "checkpoint.restore_step", 0, None, "an integer >= 0 (0 = the newest checkpoint)")
  int_in(config, "train.profile_steps", 0, None, "an integer >= 0 (0 = no profile)")
  int_in(config, "train.profile_start_step", 0 if config.train.profile_steps == 0 else 1,
         None, "an integer >= 1 (the first profiled step) when train.profile_steps > 0")
  t = config.train
  require(0 <= t.warmup_steps < t.steps, "train.warmup_steps", t.warmup_steps,
          f"an integer in [0, train.steps={t.steps})")
  for key, low, high, allowed in (
      ("train.learning_rate", 0, None, "a finite float > 0"),
      ("train.b1", 0, 1, "a float in [0, 1) (Adam's first-moment decay)"),
      ("train.b2", 0, 1, "a float in [0, 1) (Adam's second-moment decay)"),
      ("train.eps", 0, None, "a finite float > 0 (Adam's denominator floor)"),
      ("train.grad_clip", 0, None, "a finite float > 0 (global gradient-norm clip)"),
      ("model.norm_eps", 0, None, "a finite float > 0 (RMSNorm's variance floor)"),
      ("model.rope_theta", 0, None, "a finite float > 0 (RoPE base)")):
    number_in(config, key, low, high, allowed, low_open=key not in ("train.b1", "train.b2"))
  number_in(config, "train.weight_decay", 0, None, "a finite float >= 0", low_open=False)
  number_in(config, "train.min_learning_rate_ratio", 0, 1, "a float in [0, 1]",
             low_open=False, high_open=False)
  check_recipe(config)
  number_in(config, "train.peak_flops", 0, None, "a finite float >= 0 (0 = look up or measure)",
             low_open=False)
  number_in(config, "checkpoint.every_minutes", 0, None, "a finite float >= 0 (0 = off)",
             low_open=False)
  project = string(config, "logging.wandb_project", 'a W&B project name, or "" (off)')
  string(config, "logging.wandb_entity", 'a W&B team or user name, or "" (the default)')
  require(not project or importlib.util.find_spec("wandb") is not None,
          "logging.wandb_project", project, '"" (off) unless wandb is installed: '
          "pip install '.[wandb]'")


def check_recipe(config) -> None:
  """The schedule, z-loss, storage dtypes and the loss's blocks (train/lr_schedule.py,
  model/loss.py, model/head.py)."""
  t = config.train
  kind = one_of(config, "train.schedule", SCHEDULES)
  int_in(config, "train.schedule_offset", 0, 2,
         "0 or 1 (1: the first update trains at lr(1); 0: at lr(0) = 0, as runs before the key)")
  number_in(config, "train.decay_fraction", 0, 1, "a float in (0, 1] (wsd's share of "
            "train.steps that decays)", high_open=False)
  if kind == "wsd":
    cooldown = decay_steps(t)
    require(1 <= cooldown <= t.steps - t.warmup_steps, "train.decay_fraction", t.decay_fraction,
            f"a fraction of train.steps={t.steps} giving 1 to train.steps - train.warmup_steps"
            f" = {t.steps - t.warmup_steps} decay steps (it gives {cooldown})")
  number_in(config, "train.z_loss", 0, None, "a finite float >= 0 (0 = off; PaLM: 1e-4)",
            low_open=False)
  one_of(config, "train.opt_state_dtype", DTYPES)
  one_of(config, "model.param_dtype", DTYPES)
  one_of(config, "model.logits_dtype", LOGITS_DTYPES)
  int_in(config, "model.loss_block", 0, None,
         "an integer >= 0: positions per row of each block of the head and loss (0 = whole "
         "rows, the full [B, T, V] logits)")


# config.mesh.<axis>: the trainer's mesh axes, outermost first. The sequence axis sits beside
# tensor: its halos and gathers are the next most frequent traffic after tensor's.
MESH_AXES = ("data", "fsdp", "sequence", "tensor")


class MeshError(ConfigError):
  pass


def mesh_shape(mesh_cfg, device_count: int) -> tuple[int, ...]:
  """Sizes of MESH_AXES (data, fsdp, sequence, tensor); one -1 takes the devices the others
  leave."""
  sizes = [mesh_cfg[a] for a in MESH_AXES]
  fill = [a for a, s in zip(MESH_AXES, sizes) if s == -1]
  bad = [a for a, s in zip(MESH_AXES, sizes) if s != -1 and (not isinstance(s, int) or s < 1)]
  if bad or len(fill) > 1:
    raise MeshError(f"config.mesh {dict(zip(MESH_AXES, sizes))} is invalid: expected positive "
                    "integers, with at most one -1 (fill with the remaining devices)")
  known = math.prod(s for s in sizes if s != -1)
  if fill:
    if device_count % known:
      raise MeshError(f"config.mesh.{fill[0]}=-1 cannot fill {device_count} devices: the other "
                      f"axes multiply to {known}, which does not divide {device_count}")
    sizes[sizes.index(-1)] = device_count // known
  if math.prod(sizes) != device_count:
    raise MeshError(f"config.mesh {dict(zip(MESH_AXES, sizes))} has {math.prod(sizes)} devices; "
                    f"this run has {device_count}: make mesh.data × mesh.fsdp × mesh.sequence × "
                    "mesh.tensor equal it (or set one of them to -1)")
  return tuple(sizes)


def check_divisibility(config, shape: tuple[int, ...]) -> None:
  """Fails before compiling where a sharded dimension does not split evenly."""
  data, fsdp, sequence, tensor = shape
  m = config.model
  checks = [
      ("data.batch_size", config.data.batch_size, data * fsdp, "mesh.data × mesh.fsdp"),
      ("data.batch_size / train.grad_accum_steps",
       config.data.batch_size // config.train.grad_accum_steps, data * fsdp,
       "mesh.data × mesh.fsdp (each microbatch is sharded over them)"),
      ("eval.batch_size", config.eval.batch_size, data * fsdp, "mesh.data × mesh.fsdp"),
      ("model.num_heads", m.num_heads, tensor, "mesh.tensor"),
      ("model.num_kv_heads", m.num_kv_heads, tensor, "mesh.tensor"),
      ("model.mlp_dim", m.mlp_dim, tensor, "mesh.tensor"),
      ("model.vocab_size", m.vocab_size, tensor, "mesh.tensor"),
      ("model.d_model", m.d_model, fsdp, "mesh.fsdp"),
      # Evaluation rows are integer multiples of it (eval.length_multiples): they split too.
      ("data.seq_len", config.data.seq_len, sequence, "mesh.sequence"),
  ]
  for key, x, parts, axes in checks:
    if x % parts:
      raise MeshError(f"config.{key}={x} is not divisible by {axes}={parts}")
  if sequence > 1:  # One device holds whole rows: any window fits.
    _check_halo(config, sequence)


def _check_halo(config, sequence: int) -> None:
  """Context parallelism: a sliding window's halo comes from the previous shard alone."""
  shard = config.data.seq_len // sequence
  window = window_of(config.model) or 1
  if window - 1 > shard:
    raise MeshError(f"config.model.window={window} needs the {window - 1} keys before each "
                    f"shard, but mesh.sequence={sequence} leaves shards of {shard} tokens "
                    f"(data.seq_len={config.data.seq_len}): use fewer sequence shards")
