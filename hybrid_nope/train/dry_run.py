"""`launch/train.py --dry_run`: validate a config, build its train state abstractly and report
what training it would cost, without allocating or compiling anything.

Parameters, optimizer state and gradients per device are exact (shapes, dtypes and shardings of
the abstract state). Activations are an estimate from the formula in `activation_bytes`; XLA's
own figure for a compiled step is `benchmarks/step_memory.py`'s (docs/scaling.md). The total is
compared with the device's memory, and where it does not fit the keys that would make it are
named (memory_fit.py). Where the config's data paths exist, launch/check_data.py's checks run
first (hybrid_nope/data/check.py), a problem failing as one line.
"""
from __future__ import annotations

import jax
import numpy as np

from hybrid_nope.data import check
from hybrid_nope.errors import UserError
from hybrid_nope.kernels.delta_xla import CHUNK as DELTA_CHUNK
from hybrid_nope.model.definition import abstract_model
from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.pattern import layer_kinds
from hybrid_nope.model.transformer import compute_dtype, parameter_counts
from hybrid_nope.train import memory_fit, sharding
from hybrid_nope.train.flops import flops_per_token, si
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import abstract_train_state
from hybrid_nope.validate import validate

GIB = 2**30
# Per token and layer, the activations autodiff keeps for the backward pass, in units of d_model:
# the block's input, both norms' outputs, the mixer's projection out, the residual sum and the
# MLP's down projection (the head-sized and MLP-sized ones are counted apart, being split over
# mesh.tensor).
RESIDUAL_SIZED_PER_LAYER = 6
HEAD_SIZED_PER_QUERY_HEAD = 2   # Queries and the attention output, per query head.
HEAD_SIZED_PER_KV_HEAD = 2      # Keys and values, per key/value head.
MLP_SIZED_PER_LAYER = 3         # SwiGLU's gate, up and their product.
LOSS_FLOAT32_COPIES = 2         # The float32 logits the loss reads, and their gradient.
# With model.loss_block (model/head.py) only one block's logits exist at a time: float32 logits,
# probabilities and their gradient, and that gradient in the head dtype; beside them the head
# input's gradient for every token, which the blocked loss keeps for the backward pass.
BLOCK_FLOAT32_COPIES = 3
# L and D layers also keep their float32 chunk-boundary states (heads × d_k × d_v per chunk) and
# their gates and short-convolution inputs (about this many head-sized tensors per query head).
RECURRENT_EXTRA_HEAD_SIZED = 3


def per_device_bytes(tree, mesh_shape: dict | None = None, itemsize: int | None = None) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs carrying shardings: on their mesh,
  or on `mesh_shape` (the same axes, other sizes); `itemsize` in place of the leaves' own."""
  total = 0
  for x in jax.tree.leaves(tree):
    sizes = mesh_shape or dict(x.sharding.mesh.shape)
    shard = list(x.shape)
    for i, axes in enumerate(x.sharding.spec):
      axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
      shard[i] = -(-shard[i] // int(np.prod([sizes[a] for a in axes])))
    total += int(np.prod(shard)) * (itemsize or np.dtype(x.dtype).itemsize)
  return total


def activation_bytes(config, mesh_shape: dict[str, int]) -> dict[str, float]:
  """Estimated peak bytes per device of what the backward pass keeps: {"layers", "logits",
  "tokens"} for one microbatch ("logits": the whole microbatch's, or one block's under
  model.loss_block). Attention is assumed to run as a kernel (no T × T scores kept);
  with model.remat only each pattern repeat's input is kept, plus one repeat recomputed. Under
  mesh.sequence a device holds seq_len / sequence tokens of each row, and each global layer
  also keeps the whole row's keys and values it gathered (kernels/context_parallel.py)."""
  m, d = config.model, config.data
  rows = d.batch_size / (mesh_shape["data"] * mesh_shape["fsdp"]) / config.train.grad_accum_steps
  sequence = mesh_shape.get("sequence", 1)
  tokens = rows * d.seq_len / sequence
  itemsize = np.dtype(compute_dtype(m.dtype)).itemsize
  tensor = mesh_shape["tensor"]
  per_layer = (RESIDUAL_SIZED_PER_LAYER * m.d_model
               + (HEAD_SIZED_PER_QUERY_HEAD * m.num_heads
                  + HEAD_SIZED_PER_KV_HEAD * m.num_kv_heads) * m.head_dim / tensor
               + MLP_SIZED_PER_LAYER * m.mlp_dim / tensor)
  recurrent = (RECURRENT_EXTRA_HEAD_SIZED * m.num_heads * m.head_dim
               + m.num_heads * m.head_dim**2 * 4 / itemsize / DELTA_CHUNK) / tensor
  gathered = (HEAD_SIZED_PER_KV_HEAD * m.num_kv_heads * m.head_dim / tensor * sequence
              if sequence > 1 else 0)  # per local token: the row's keys and values, gathered
  specs = [KINDS[kind] for kind in layer_kinds(m.pattern, m.num_layers)]
  kept_by_layer = [per_layer + (recurrent if spec.recurrent else 0)
                   + (gathered if spec.global_attention else 0) for spec in specs]
  if m.remat:
    repeat = len(m.pattern)
    kept = len(kept_by_layer) // repeat * m.d_model + max(
        sum(kept_by_layer[i:i + repeat]) for i in range(0, len(kept_by_layer), repeat))
  else:
    kept = sum(kept_by_layer)
  logits_itemsize = 4 if m.logits_dtype == "float32" else itemsize
  if m.loss_block:
    block_tokens = tokens * min(m.loss_block, d.seq_len) / d.seq_len
    logits = (block_tokens * m.vocab_size / tensor * (4 * BLOCK_FLOAT32_COPIES + logits_itemsize)
              + tokens * m.d_model * logits_itemsize)
  else:
    logits = tokens * m.vocab_size / tensor * (logits_itemsize + 4 * LOSS_FLOAT32_COPIES)
  return {"layers": tokens * kept * itemsize, "logits": logits, "tokens": tokens}


def _path_problem(config) -> str:
  """What stops the config training here beyond its shapes (a data path), or ""."""
  try:
    validate(config)
  except UserError as e:
    return str(e)
  return ""


def memory_bytes(config, mesh_shape: dict, state) -> dict[str, float]:
  """Bytes per device of the abstract train `state` (laid out on `mesh_shape`) and of the
  config's activations and logits."""
  acts = activation_bytes(config, mesh_shape)
  return {"params": per_device_bytes(state.params, mesh_shape),
          "opt_state": per_device_bytes(state.opt_state, mesh_shape),
          # Gradients are float32 whatever the parameters' dtype (train/step.py).
          "grads": per_device_bytes(state.params, mesh_shape, itemsize=4),
          "activations": acts["layers"], "logits": acts["logits"]}


def report(config) -> dict:
  """Everything `--dry_run` prints, as numbers."""
  validate(config, check_paths=False)
  mesh = sharding.make_mesh(config)
  tx = make_optimizer(config.train)
  _, state, _ = abstract_train_state(config.model, tx, config.train.seed, mesh)
  counts = parameter_counts(abstract_model(config.model, config.train.seed))
  mesh_shape = dict(mesh.shape)
  acts = activation_bytes(config, mesh_shape)
  per_token = flops_per_token(config.model, config.data.seq_len)
  tokens_per_step = config.data.batch_size * config.data.seq_len
  memory = memory_bytes(config, mesh_shape, state)
  fits, fit_line = memory_fit.verdict(
      config, mesh_shape, lambda c, shape: sum(memory_bytes(c, shape, state).values()))
  return {"parameters": counts, "flops_per_token": per_token,
          "flops_per_step": per_token * tokens_per_step, "tokens_per_step": tokens_per_step,
          "mesh": mesh_shape, "devices": mesh.size, "platform": jax.devices()[0].platform,
          "compute_dtype": np.dtype(compute_dtype(config.model.dtype)).name,
          "param_dtype": config.model.param_dtype, "microbatch_tokens": acts["tokens"],
          "memory_bytes": memory, "memory_total_bytes": sum(memory.values()),
          "layers": layer_kinds(config.model.pattern, config.model.num_layers),
          "fits": fits, "fit_line": fit_line, "to_train": _path_problem(config)}


def check_data(config) -> None:
  """launch/check_data.py's checks (hybrid_nope/data/check.py: the tokenizer against
  model.vocab_size, the text column, the eval set and the probe), a problem failing as one
  line."""
  try:
    check.check(config)
  except check.DataCheckError as e:
    raise check.DataCheckError(e.one_line()) from None


def report_text(config) -> str:
  """The dry run's lines; where the config's paths exist their data is checked first
  (`check_data`). A memory estimate over the device's is said, not refused: it is an
  estimate."""
  r = report(config)
  if not r["to_train"]:
    check_data(config)
  m, mem = config.model, r["memory_bytes"]
  p = r["parameters"]
  gib = lambda key: f"{mem[key] / GIB:.2f} GiB"
  lines = [
      f"model: {len(r['layers'])} layers {r['layers']}, d_model {m.d_model}, heads "
      f"{m.num_heads}/{m.num_kv_heads} kv × {m.head_dim}, mlp {m.mlp_dim}, vocab {m.vocab_size}",
      f"parameters: {p['non_embedding'] / 1e6:.1f}M non-embedding, {p['total'] / 1e6:.1f}M "
      f"total, stored in {r['param_dtype']}",
      f"FLOPs per token: {si(r['flops_per_token'], 'FLOP')} (training: 6 × matmul parameters + "
      f"3 × the mixers' forward); per step: {si(r['flops_per_step'], 'FLOP', 'kMGTPE')} over "
      f"{r['tokens_per_step']:,} tokens",
      f"mesh: {r['mesh']} over {r['devices']} {r['platform']} device(s)",
      f"memory per device: parameters {gib('params')}, optimizer state {gib('opt_state')}, "
      f"gradients {gib('grads')} (exact); activations {gib('activations')} + logits "
      f"{gib('logits')} (estimate: {r['microbatch_tokens']:,.0f} tokens per microbatch, "
      f"{r['compute_dtype']}, remat {m.remat}, loss_block {m.loss_block}); total {r['memory_total_bytes'] / GIB:.2f} GiB",
  ]
  if r["platform"] == "cpu" and m.dtype == "auto":
    lines.append("(model.dtype auto is float32 on CPU; --config.model.dtype=bfloat16 estimates "
                 "an accelerator's activations)")
  lines.append(r["fit_line"])
  problems = [r["to_train"]] * bool(r["to_train"]) + [
      "the memory estimate does not fit the device's memory (above)"] * (r["fits"] is False)
  lines.append(f"to train: {'; '.join(problems)}" if problems else "config valid: ready to train")
  return "\n".join(lines)

