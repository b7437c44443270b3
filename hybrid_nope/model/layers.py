"""Building blocks: parameters with logical axis names, RMSNorm, SwiGLU MLP, RoPE, embedding."""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_nope.model.param_draw import Init, blockable, drawn_matrix, placed

# Logical axis names used on every parameter; the sharding rules map them to mesh axes.
#   vocab, embed (d_model), heads (query heads), kv_heads, kv (head_dim), mlp (hidden).
BTD = ("act_batch", "act_length", "act_embed")
BTF = ("act_batch", "act_length", "act_mlp")
BTV = ("act_batch", "act_length", "act_vocab")
default_init = Init("truncated_normal", fan_in_scaled=True)
EMBEDDING_INIT = Init("normal", fan_in_scaled=False)  # unit-variance rows (see unembedding)


def param(rngs: nnx.Rngs, init: Init, shape: tuple[int, ...], axes: tuple[str, ...],
          in_axes: tuple[int, ...] = (0,)) -> nnx.Param:
  """A float32 parameter annotated with logical axis names, drawn in its shards.

  `in_axes` are the dimensions that count as fan-in: the draw is a [fan_in, fan_out] matrix
  laid out as `shape`. Built eagerly (sharded_train_state), it is drawn in blocks by a program
  per distribution (model.param_draw); inside a trace, whole and inline, bit for bit the same.
  """
  assert len(shape) == len(axes), (shape, axes)
  key, shape, in_axes, spec = rngs.params(), tuple(shape), tuple(in_axes), mesh_axes(axes)
  fan_in = math.prod(shape[a] for a in in_axes)
  if blockable(key, math.prod(shape)):
    matrix = drawn_matrix(key, init, fan_in, math.prod(shape) // fan_in)
    value = placed(_laid_out(matrix, shape, in_axes), spec)
  else:
    value = _initial_value(key, init=init, shape=shape, in_axes=in_axes, spec=spec)
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def constant_param(value: float, shape: tuple[int, ...], axes: tuple[str | None, ...]) -> nnx.Param:
  """A float32 parameter filled with `value`, made on the host: built eagerly, jnp.full would
  compile a program per shape."""
  return nnx.Param(jnp.asarray(np.full(shape, value, np.float32)), out_sharding=axes,
                   eager_sharding=False)


@functools.partial(jax.jit, static_argnames=("init", "shape", "in_axes", "spec"))
def _initial_value(key: jax.Array, *, init: Init, shape: tuple[int, ...],
                   in_axes: tuple[int, ...], spec: tuple) -> jax.Array:
  """One parameter's draw whole, in its shards (`spec`: the mesh axes of its logical axes
  under the trainer's rules, all None outside them)."""
  fan_in = math.prod(shape[a] for a in in_axes)
  value = _laid_out(init(key, (fan_in, math.prod(shape) // fan_in)), shape, in_axes)
  if any(axis is not None for axis in spec):
    value = jax.lax.with_sharding_constraint(value, jax.sharding.PartitionSpec(*spec))
  return value


def _laid_out(matrix_IO, shape: tuple[int, ...], in_axes: tuple[int, ...]):
  """A [fan_in, fan_out] draw (numpy or jax) as a parameter of `shape`, fan-in on `in_axes`."""
  order = list(in_axes) + [a for a in range(len(shape)) if a not in in_axes]
  value = matrix_IO.reshape([shape[a] for a in order])
  return value.transpose([order.index(a) for a in range(len(shape))])


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """Sharding constraint by logical activation axis names; a no-op unless the trainer has set
  a mesh and rules (hybrid_nope.train.sharding.activation_rules)."""
  return nn.with_logical_constraint(x, axes)


def mesh_axes(axes: tuple[str | None, ...]) -> tuple:
  """The mesh axes each logical activation axis maps to under the trainer's rules (all None
  outside them): what a kernel run per shard needs to know."""
  return tuple(nn.logical_to_mesh_axes(axes))


def project(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
  """x [..., *in] · w [*in, *out] -> [..., *out], where `in` is x's last `contract` axes, as one
  2-D [tokens, in] @ [in, out] matmul.

  XLA:CPU gives the weight gradient of a 3-D or 4-D einsum a transposing copy of each operand
  (0.3 s per MLP matmul at the 120m shape, seq_len 8192); on 2-D views it needs none. The
  reshapes are free elsewhere.
  """
  in_shape, out_shape = w.shape[:contract], w.shape[contract:]
  assert x.shape[x.ndim - contract:] == in_shape, (x.shape, w.shape)
  fan_in = math.prod(in_shape)
  y = x.reshape(-1, fan_in) @ w.reshape(fan_in, -1)
  return y.reshape(*x.shape[:x.ndim - contract], *out_shape)


def logical_axes(variable: nnx.Variable) -> tuple[str, ...] | None:
  """The logical axis names of a parameter, whatever name this flax version stores them under."""
  meta = variable.get_metadata()
  for key in ("out_sharding", "sharding_names", "sharding"):
    if meta.get(key) is not None:
      return tuple(meta[key])
  return None


class RMSNorm(nnx.Module):
  """y = x / rms(x) * scale, computed in float32 for stability."""

  def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs):
    del rngs  # Deterministic init (ones); kept for a uniform constructor signature.
    self.eps = eps
    self.scale_D = constant_param(1.0, (dim,), ("embed",))

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    x32 = x_BTD.astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    # Scaled as [B*T, D]: the scale's gradient is then a reduction over the leading axis. At
    # batch 1, XLA:CPU folds the [B, T, D] form into a reduction over the middle axis of
    # [1, T, D], which its YNN fusions run ~50x slower (6 s of a 120m step at seq_len 8192).
    normalized_ND = (x32 * inv_rms).reshape(-1, x_BTD.shape[-1])
    return (normalized_ND * self.scale_D[...]).reshape(x_BTD.shape).astype(x_BTD.dtype)


class SwiGLU(nnx.Module):
  """MLP(x) = W_down (silu(W_gate x) * W_up x), no biases."""

  def __init__(self, d_model: int, mlp_dim: int, *, dtype, rngs: nnx.Rngs):
    self.dtype = dtype
    self.w_gate_DF = param(rngs, default_init, (d_model, mlp_dim), ("embed", "mlp"))
    self.w_up_DF = param(rngs, default_init, (d_model, mlp_dim), ("embed", "mlp"))
    self.w_down_FD = param(rngs, default_init, (mlp_dim, d_model), ("mlp", "embed"))

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    x_BTD = x_BTD.astype(self.dtype)
    gate_BTF = constrain(project(x_BTD, self.w_gate_DF[...].astype(self.dtype)), BTF)
    up_BTF = constrain(project(x_BTD, self.w_up_DF[...].astype(self.dtype)), BTF)
    return project(jax.nn.silu(gate_BTF) * up_BTF, self.w_down_FD[...].astype(self.dtype))


def apply_rope(x_BTNH: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding (rotate-half convention) at the given per-token positions."""
  H = x_BTNH.shape[-1]
  if H % 2:
    raise ValueError(f"RoPE needs an even head_dim; got {H}")
  inv_freq_F = 1.0 / (theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
  angle_BTF = positions_BT.astype(jnp.float32)[..., None] * inv_freq_F
  sin_BT1F = jnp.sin(angle_BTF)[:, :, None, :]
  cos_BT1F = jnp.cos(angle_BTF)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos_BT1F - x2 * sin_BT1F, x2 * cos_BT1F + x1 * sin_BT1F], axis=-1)
  return rotated.astype(x_BTNH.dtype)


class Embed(nnx.Module):
  """Token embedding; `unembedding` is the same table as a tied head."""

  def __init__(self, vocab_size: int, d_model: int, *, dtype, rngs: nnx.Rngs):
    self.dtype = dtype
    self.vocab_size = vocab_size
    # Through param(): one compiled draw, placed in its shards (not drawn whole, then moved).
    self.embedding_VD = param(rngs, EMBEDDING_INIT, (vocab_size, d_model), ("vocab", "embed"))

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    return constrain(jnp.take(self.embedding_VD[...], tokens_BT, axis=0).astype(self.dtype), BTD)

  def unembedding(self) -> tuple[jax.Array, float]:
    """The tied head as (w [D, V], scale): logits = (x · w) × scale."""
    # The table has unit-variance rows; 1/sqrt(D) keeps tied logits at unit scale, like an
    # untied fan-in-initialised head.
    table_VD = self.embedding_VD[...]
    return table_VD.T, table_VD.shape[-1] ** -0.5
