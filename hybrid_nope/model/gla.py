"""Gated linear attention (GLA, Yang et al. 2023, "Gated Linear Attention Transformers with
Hardware-Efficient Training"): the second local mixer, pattern letter L.

  q, k, v = x W_Q, x W_K, x W_V                         per head, GQA as in attention
  log α_t = logsigmoid(x_t W_1 W_2 + b) / τ              a low-rank data-dependent gate per kv
                                                         head and key channel (rank 16, τ = 16)
  S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,  o_t = H^(−1/2) q_tᵀ S_t   kernels.linear_attention
  y_t = W_O (RMSNorm_head(o_t) ⊙ swish(x_t W_G))         per-head output norm, swish output gate

No position encoding inside: the decay alone orders the past, which is what makes it a local
mixer whose recency scale is 1 / (1 − α) (analysis.theory.linear_cosine). The temperature keeps
α near 1 at init (logsigmoid(0) / 16 → α ≈ 0.958, a scale of ~24 tokens), as published.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope import kernels
from hybrid_nope.model.attention import BTKH, BTNH
from hybrid_nope.model.layers import (constant_param, constrain, default_init, mesh_axes, param,
                                      project)

GATE_RANK = 16
GATE_TEMPERATURE = 16.0


def gate_log_decay(x_BTD: jax.Array, w_down_DR: jax.Array, w_up_RG: jax.Array,
                   bias_G: jax.Array, dtype) -> jax.Array:
  """log α = logsigmoid(x W_1 W_2 + b) / τ in float32 (α is near 1: the compute dtype would
  round it), shaped [B, T, *G] by w_up's trailing axes; the L and D layers' gate."""
  low_BTR = project(x_BTD.astype(dtype), w_down_DR.astype(dtype))
  logits = project(low_BTR, w_up_RG.astype(dtype)).astype(jnp.float32) + bias_G
  return jax.nn.log_sigmoid(logits) / GATE_TEMPERATURE


def init_output(layer: nnx.Module, rngs: nnx.Rngs, D: int, N: int, H: int,
                gate: bool = True) -> None:
  """The parameters of gated_norm_output (per-head norm, W_O) and, with `gate`, GLA's swish
  gate's W_G, on `layer`: the D layer shares that output by its parameter names."""
  if gate:
    layer.w_out_gate_DNH = param(rngs, default_init, (D, N, H), ("embed", "heads", "kv"))
  layer.out_norm_scale_H = constant_param(1.0, (H,), ("kv",))
  layer.wo_NHD = param(rngs, default_init, (N, H, D), ("heads", "kv", "embed"), in_axes=(0, 1))


class GatedLinearAttention(nnx.Module):

  def __init__(self, *, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
               norm_eps: float, impl: str, dtype, rngs: nnx.Rngs):
    D, N, K, H, R = d_model, num_heads, num_kv_heads, head_dim, GATE_RANK
    self.impl, self.dtype, self.norm_eps = impl, dtype, norm_eps
    self.wq_DNH = param(rngs, default_init, (D, N, H), ("embed", "heads", "kv"))
    self.wk_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.wv_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.w_gate_down_DR = param(rngs, default_init, (D, R), ("embed", None))
    self.w_gate_up_RKH = param(rngs, default_init, (R, K, H), (None, "kv_heads", "kv"))
    self.gate_bias_KH = constant_param(0.0, (K, H), ("kv_heads", "kv"))
    init_output(self, rngs, D, N, H)

  def log_decay(self, x_BTD: jax.Array) -> jax.Array:
    """log α [B, T, K, H], float32, in (−∞, 0): the gate, also read by the recency hook."""
    return constrain(gate_log_decay(x_BTD, self.w_gate_down_DR[...], self.w_gate_up_RKH[...],
                                    self.gate_bias_KH[...], self.dtype), BTKH)

  def inputs(self, x_BTD: jax.Array):
    """The recurrence's inputs q [B,T,N,H], k, v, log α [B,T,K,H] (also a decode step's)."""
    x_BTD = x_BTD.astype(self.dtype)
    q_BTNH = constrain(project(x_BTD, self.wq_DNH[...].astype(self.dtype)), BTNH)
    k_BTKH = constrain(project(x_BTD, self.wk_DKH[...].astype(self.dtype)), BTKH)
    v_BTKH = constrain(project(x_BTD, self.wv_DKH[...].astype(self.dtype)), BTKH)
    log_decay_BTKH = self.log_decay(x_BTD)  # float32 whatever the compute dtype: α is near 1.
    return q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH

  def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
               segment_ids_BT: jax.Array | None) -> jax.Array:
    del positions_BT  # No position encoding: the decay orders the past.
    q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH = self.inputs(x_BTD)
    batch_axes, sequence_axes, head_axes, _ = mesh_axes(BTNH)
    out_BTNH = kernels.linear_attention(
        q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids=segment_ids_BT,
        impl=self.impl, batch_axes=batch_axes, head_axes=head_axes,
        sequence_axes=sequence_axes)
    return self.output(out_BTNH, x_BTD)

  def output(self, out_BTNH: jax.Array, x_BTD: jax.Array) -> jax.Array:
    """W_O (RMSNorm_head(o) ⊙ swish(x W_G)) of the recurrence's output o and the layer input x."""
    gate_BTNH = jax.nn.silu(project(x_BTD.astype(self.dtype),
                                    self.w_out_gate_DNH[...].astype(self.dtype)))
    return gated_norm_output(self, out_BTNH, gate_BTNH)


def gated_norm_output(layer: nnx.Module, out_BTNH: jax.Array, gate_BTNH: jax.Array) -> jax.Array:
  """W_O (RMSNorm_head(o) ⊙ gate), the norm in float32, on `layer`'s out_norm_scale_H and wo_NHD:
  the output of the L and D layers, whatever their gate."""
  o32 = out_BTNH.astype(jnp.float32)
  normed = o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, -1, keepdims=True) + layer.norm_eps)
  y_BTNH = (normed * layer.out_norm_scale_H[...]).astype(layer.dtype) * gate_BTNH
  return project(constrain(y_BTNH, BTNH), layer.wo_NHD[...].astype(layer.dtype), contract=2)
