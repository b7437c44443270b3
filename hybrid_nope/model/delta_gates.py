"""The D layer's published gate forms (model.delta_gate_form): its forget gate α and its output
gate, each a pair of functions (parameters on the layer, then the value from the layer input).

  gla     log α = logsigmoid(x W_1 W_2 + b) / 16            GLA's low-rank gate (gla.py), per
                                                            value head or per key channel; the
                                                            form D had first, kept so that D
                                                            differs from L by the delta rule only
  mamba2  log α = −exp(A_log) · softplus(x W_a + dt_bias)   Gated DeltaNet (Yang et al. 2024,
                                                            fla's GatedDeltaNet) and Qwen3-Next
                                                            (transformers' Qwen3NextGatedDeltaNet):
                                                            one α per value head
  kda     log α = −exp(A_log_h) · softplus(x W_1 W_2 + dt_bias)   Kimi Delta Attention (Kimi
                                                            Linear 2025; transformers'
                                                            KimiLinearForgetGate): per key
                                                            channel, rank d_k, A per head

Output gate: gla and mamba2 take swish(x W_G) (full rank, as Qwen3-Next's z); kda takes
sigmoid(x W_1 W_2 + b) of rank d_v (fla's KDA g_proj; transformers' Kimi has no bias, which is
this with b = 0). Initialisation follows the papers' code: A ~ U(1, 16) (Mamba2's A_init_range),
dt_bias the inverse softplus of dt = exp(U(log 1e-3, log 1e-1)) floored at 1e-4, so the initial
α spans ~0.01–0.999 across heads.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope.model.gla import GATE_RANK, gate_log_decay
from hybrid_nope.model.layers import constant_param, default_init, param, project

FORMS = ("gla", "mamba2", "kda")
GATES = ("head", "channel")  # model.delta_gate: log α per value head [B,T,V] or per key channel
# The one gate shape each published form has (gla takes either).
FORM_GATES = {"gla": GATES, "mamba2": ("head",), "kda": ("channel",)}
DT_RANGE, DT_FLOOR, A_RANGE = (1e-3, 1e-1), 1e-4, (1.0, 16.0)


def _a_log(rngs: nnx.Rngs, shape) -> nnx.Param:
  a = jax.random.uniform(rngs.params(), shape, jnp.float32, *A_RANGE)
  return nnx.Param(jnp.log(a), out_sharding=("kv_heads",) + (None,) * (len(shape) - 1),
                   eager_sharding=False)


def _dt_bias(rngs: nnx.Rngs, shape, axes) -> nnx.Param:
  lo, hi = (math.log(x) for x in DT_RANGE)
  dt = jnp.maximum(jnp.exp(jax.random.uniform(rngs.params(), shape, jnp.float32, lo, hi)),
                   DT_FLOOR)
  return nnx.Param(dt + jnp.log(-jnp.expm1(-dt)), out_sharding=axes, eager_sharding=False)


def init_forget(layer: nnx.Module, rngs: nnx.Rngs, form: str, gate: str, D: int, V: int,
                H: int) -> None:
  """The forget gate's parameters on `layer` (V value heads, H = d_k)."""
  if form == "gla":
    layer.w_gate_down_DR = param(rngs, default_init, (D, GATE_RANK), ("embed", None))
    if gate == "head":
      layer.w_gate_up_RK = param(rngs, default_init, (GATE_RANK, V), (None, "kv_heads"))
      layer.gate_bias_K = constant_param(0.0, (V,), ("kv_heads",))
    else:
      layer.w_gate_up_RKH = param(rngs, default_init, (GATE_RANK, V, H), (None, "kv_heads", "kv"))
      layer.gate_bias_KH = constant_param(0.0, (V, H), ("kv_heads", "kv"))
  elif form == "mamba2":
    layer.w_decay_DK = param(rngs, default_init, (D, V), ("embed", "kv_heads"))
    layer.dt_bias_K = _dt_bias(rngs, (V,), ("kv_heads",))
    layer.a_log_K = _a_log(rngs, (V,))
  else:  # kda: rank d_k, as Kimi's f_a_proj / f_b_proj.
    layer.w_decay_down_DR = param(rngs, default_init, (D, H), ("embed", None))
    layer.w_decay_up_RKH = param(rngs, default_init, (H, V, H), (None, "kv_heads", "kv"))
    layer.dt_bias_KH = _dt_bias(rngs, (V, H), ("kv_heads", "kv"))
    layer.a_log_K = _a_log(rngs, (V,))


def forget_log_decay(layer: nnx.Module, form: str, gate: str, x_BTD: jax.Array,
                     dtype) -> jax.Array:
  """log α, float32 (α near 1 would round in the compute dtype): [B, T, V] (gate "head") or
  [B, T, V, H] ("channel")."""
  if form == "gla":
    if gate == "head":
      return gate_log_decay(x_BTD, layer.w_gate_down_DR[...], layer.w_gate_up_RK[...],
                            layer.gate_bias_K[...], dtype)
    return gate_log_decay(x_BTD, layer.w_gate_down_DR[...], layer.w_gate_up_RKH[...],
                          layer.gate_bias_KH[...], dtype)
  x_BTD = x_BTD.astype(dtype)
  if form == "mamba2":
    logits = project(x_BTD, layer.w_decay_DK[...].astype(dtype)).astype(jnp.float32)
    return -jnp.exp(layer.a_log_K[...]) * jax.nn.softplus(logits + layer.dt_bias_K[...])
  low_BTR = project(x_BTD, layer.w_decay_down_DR[...].astype(dtype))
  logits = project(low_BTR, layer.w_decay_up_RKH[...].astype(dtype)).astype(jnp.float32)
  return (-jnp.exp(layer.a_log_K[...])[:, None]
          * jax.nn.softplus(logits + layer.dt_bias_KH[...]))


def init_output_gate(layer: nnx.Module, rngs: nnx.Rngs, form: str, D: int, O: int,
                     J: int) -> None:
  """The output gate's parameters on `layer` (O output heads of J = d_v channels)."""
  if form == "kda":
    layer.w_out_gate_down_DR = param(rngs, default_init, (D, J), ("embed", None))
    layer.w_out_gate_up_RNH = param(rngs, default_init, (J, O, J), (None, "heads", "kv"))
    layer.out_gate_bias_NH = constant_param(0.0, (O, J), ("heads", "kv"))
  else:
    layer.w_out_gate_DNH = param(rngs, default_init, (D, O, J), ("embed", "heads", "kv"))


def output_gate(layer: nnx.Module, form: str, x_BTD: jax.Array, dtype) -> jax.Array:
  """[B, T, O, J] in the compute dtype: what multiplies the normalised recurrence output."""
  x_BTD = x_BTD.astype(dtype)
  if form == "kda":
    low_BTR = project(x_BTD, layer.w_out_gate_down_DR[...].astype(dtype))
    logits = project(low_BTR, layer.w_out_gate_up_RNH[...].astype(dtype))
    return jax.nn.sigmoid(logits + layer.out_gate_bias_NH[...].astype(dtype))
  return jax.nn.silu(project(x_BTD, layer.w_out_gate_DNH[...].astype(dtype)))
