"""The hybrid language model: embedding, pre-norm blocks following `model.pattern`, final norm, head."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_nope.model.head import head_logits
from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.pattern import layer_kinds
from hybrid_nope.model.layers import (BTD, BTV, Embed, RMSNorm, SwiGLU, constrain, default_init,
                                      logical_axes, param)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# model.logits_dtype: the output head's matmul in "float32" (its inputs cast up), or in the
# compute dtype ("compute"; rounded to it before the float32 cast). The loss is float32 either
# way; the two differ only where model.dtype is bfloat16.
LOGITS_DTYPES = ("float32", "compute")


def compute_dtype(name: str):
  """'auto' is float32 on CPU and bfloat16 on accelerators."""
  if name == "auto":
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  if name not in DTYPES:
    raise ValueError(f"model.dtype={name!r}: expected 'auto' or one of {sorted(DTYPES)}")
  return DTYPES[name]


# Module boundaries of a block, in order ("input": the residual stream entering it, the embedding
# at layer 0); the recency hook records each of them, and the final norm after the last block.
BOUNDARIES = ("input", "pre_mixer_norm", "mixer", "residual_1", "pre_mlp_norm", "mlp",
              "residual_2")
FINAL_BOUNDARY = "final_norm"


def _ignore(name, x):
  del name
  return x


class Block(nnx.Module):
  """x + Attn(Norm(x)), then + MLP(Norm(.)): the BOUNDARIES the recency hook reads."""

  def __init__(self, kind: str, cfg, *, dtype, rngs: nnx.Rngs):
    self.kind = kind
    self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
    shape = dict(d_model=cfg.d_model, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                 head_dim=cfg.head_dim, dtype=dtype, rngs=rngs)
    # `attn` is the block's token mixer, whatever its kind (one parameter tree layout).
    self.attn = KINDS[kind].build_mixer(cfg, shape)
    self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
    self.mlp = SwiGLU(cfg.d_model, cfg.mlp_dim, dtype=dtype, rngs=rngs)

  def __call__(self, x_BTD, positions_BT, segment_ids_BT, observe=None):
    observe = observe or _ignore
    x_BTD = observe("input", x_BTD)
    h_BTD = observe("pre_mixer_norm", self.attn_norm(x_BTD))
    h_BTD = observe("mixer", self.attn(h_BTD, positions_BT=positions_BT,
                                       segment_ids_BT=segment_ids_BT))
    x_BTD = observe("residual_1", x_BTD + h_BTD)
    h_BTD = observe("pre_mlp_norm", self.mlp_norm(x_BTD))
    h_BTD = observe("mlp", self.mlp(h_BTD))
    return observe("residual_2", x_BTD + h_BTD)


class LanguageModel(nnx.Module):
  """tokens [B, T] -> float32 logits [B, T, V]. Parameters are stored in model.param_dtype and
  cast to the compute dtype where they are used."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    dtype = compute_dtype(cfg.dtype)
    # A run's config saved before these keys lacks them: it had float32 parameters and the
    # head in the compute dtype (their values in run_config.ADDED_KEYS).
    param_dtype = DTYPES[cfg.get("param_dtype", "float32")]
    self.head_dtype = jnp.float32 if cfg.get("logits_dtype") == "float32" else dtype
    self.kinds = layer_kinds(cfg.pattern, cfg.num_layers)
    self.period = len(cfg.pattern)
    self.remat = cfg.remat
    # Positions per row of each block of the head and loss (model/head.py); 0 = whole rows.
    # Configs saved before the key ran whole rows (run_config.ADDED_KEYS).
    self.loss_block = cfg.get("loss_block", 0)
    self.tie_embeddings = cfg.tie_embeddings
    self.embed = Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, rngs=rngs)
    self.blocks = nnx.List([Block(kind, cfg, dtype=dtype, rngs=rngs) for kind in self.kinds])
    self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
    if not cfg.tie_embeddings:
      self.head_DV = param(rngs, default_init, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))
    # Drawn in float32 (one initialisation for every storage dtype), then stored rounded.
    if param_dtype != jnp.float32:
      nnx.update(self, jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(self, nnx.Param)))

  def __call__(self, tokens_BT: jax.Array, *, positions_BT: jax.Array | None = None,
               segment_ids_BT: jax.Array | None = None, observe=None) -> jax.Array:
    """Float32 logits [B, T, V]. `observe(layer, boundary, x_BTD) -> x_BTD`, if given, sees
    every block's BOUNDARIES and the last layer's FINAL_BOUNDARY."""
    w_DV, scale = self.unembedding()
    x_BTD = self.features(tokens_BT, positions_BT=positions_BT, segment_ids_BT=segment_ids_BT,
                          observe=observe)
    return constrain(head_logits(x_BTD, w_DV, scale, self.head_dtype), BTV)

  def unembedding(self) -> tuple[jax.Array, float]:
    """The output head as (w [D, V] in the storage dtype, scale): logits = (x · w) × scale,
    in head_dtype (model/head.py). The tied head is the embedding table's."""
    if self.tie_embeddings:
      return self.embed.unembedding()
    return self.head_DV[...], 1.0

  def features(self, tokens_BT: jax.Array, *, positions_BT: jax.Array | None = None,
               segment_ids_BT: jax.Array | None = None, observe=None) -> jax.Array:
    """The final norm's output [B, T, D] in head_dtype: what the head reads. The blocked loss
    (model.loss_block) takes it with `unembedding`, never forming the logits whole."""
    if positions_BT is None:
      positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    x_BTD = self.embed(tokens_BT)
    if self.remat and observe is None:
      x_BTD = self._rematerialised_blocks(x_BTD, positions_BT, segment_ids_BT)
    else:
      for layer, block in enumerate(self.blocks):
        if observe is not None:
          x_BTD = block(x_BTD, positions_BT, segment_ids_BT,
                        lambda name, x, layer=layer: observe(layer, name, x))
        else:
          x_BTD = block(x_BTD, positions_BT, segment_ids_BT)
        x_BTD = constrain(x_BTD, BTD)
    x_BTD = self.final_norm(x_BTD)
    if observe is not None:
      x_BTD = observe(len(self.blocks) - 1, FINAL_BOUNDARY, x_BTD)
    return x_BTD.astype(self.head_dtype)

  def _rematerialised_blocks(self, x_BTD, positions_BT, segment_ids_BT):
    """The blocks as a scan over repeats of the pattern, each repeat recomputed in the backward
    pass: only the residual stream entering each repeat is stored.

    A scan, not a Python loop of `jax.checkpoint`s: XLA:CPU schedules the unrolled recomputation
    early and keeps every block's activations (docs/performance.md), whereas a loop body cannot
    outlive its iteration on any backend. The parameters stay one module per block (checkpoints,
    the recency hook and the sharding rules see the same tree); they are stacked per pattern
    position here, and their gradients flow back through the stack.
    """
    graphdefs, stacked_states = [], []
    for offset in range(self.period):
      splits = [nnx.split(block) for block in self.blocks[offset::self.period]]
      graphdefs.append(splits[0][0])
      stacked_states.append(jax.tree.map(_stack_variables, *(state for _, state in splits),
                                         is_leaf=lambda x: isinstance(x, nnx.Variable)))

    def one_repeat(x_BTD, states):
      for graphdef, state in zip(graphdefs, states):
        x_BTD = constrain(nnx.merge(graphdef, state)(x_BTD, positions_BT, segment_ids_BT), BTD)
      return x_BTD, None

    # prevent_cse guards unrolled remat against CSE with the forward; a scan body needs no guard.
    x_BTD, _ = jax.lax.scan(jax.checkpoint(one_repeat, prevent_cse=False), x_BTD,
                            stacked_states)
    return x_BTD


def _stack_variables(*variables: nnx.Variable) -> nnx.Variable:
  """One parameter from each repeat, stacked on a new leading axis that stays unsharded."""
  stacked = jnp.stack([v[...] for v in variables])
  axes = logical_axes(variables[0])
  return variables[0].replace(constrain(stacked, (None, *axes)) if axes else stacked)


def parameter_counts(model: LanguageModel) -> dict[str, int]:
  """Total, embedding (token table and untied head) and non-embedding parameter counts.

  Works on abstract models too (nnx.eval_shape), so the big configs are counted without memory.
  """
  def count(tree):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))

  params = nnx.state(model, nnx.Param)
  total = count(params)
  embedding = count(params["embed"]) + (0 if model.tie_embeddings else count(params["head_DV"]))
  return {"total": total, "embedding": embedding, "non_embedding": total - embedding}
