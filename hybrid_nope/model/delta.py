"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with
Delta Rule"): the third local mixer, pattern letter D; with a per-channel gate, Kimi Delta
Attention (Kimi Linear, 2025).

  q, k, v = silu(conv(x W_Q)), silu(conv(x W_K)), silu(conv(x W_V))   causal depthwise conv,
                                                         width 4, within a document only
  β_t = sigmoid(x_t W_β)                                 per kv head, float32
  log α_t = logsigmoid(x_t W_1 W_2 + b) / τ              GLA's low-rank gate (gla.py: rank 16,
                                                         τ = 16), per kv head (model.delta_gate
                                                         "head") or per key channel ("channel")
  S_t = S_{t−1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  o_t = S_t q_t
                                                         kernels.delta_attention (q, k unit per
                                                         head inside it; a per-head α scales S)
  y_t = W_O (RMSNorm_head(o_t) ⊙ swish(x_t W_G))         per-head output norm, swish output gate

The published layers differ in the gate: Gated DeltaNet takes Mamba2's α = exp(−A softplus(·)),
KDA a low-rank per-channel version of it. Here both take GLA's gate, so that D differs from L only
by the delta rule (the erase term and β), which is the comparison the recency study makes. At
init α ≈ 0.95 (logsigmoid of unit-variance logits over τ = 16; logsigmoid(0) / 16 → 0.958) and
β ≈ 0.5. No position encoding inside: the decay and the erase term order the past.

A one-token decode step reuses the pieces: `projections`, then `convolved` on a window of the
last CONV_WIDTH projections ([B, 1, width, ...], zeros before a document's start, as
`conv_windows` builds for a sequence), `log_decay`, `beta`, kernels.delta_step and `output`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope import kernels
from hybrid_nope.model.attention import BTKH, BTNH
from hybrid_nope.model.gla import GATE_RANK, GatedLinearAttention, gate_log_decay, init_output
from hybrid_nope.model.layers import constrain, default_init, mesh_axes, param, project

CONV_WIDTH = 4
GATES = ("head", "channel")  # model.delta_gate: log α per kv head [B,T,K] or per key channel
BTK = ("act_batch", "act_length", "act_kv_heads")


def conv_windows(x_BTC: jax.Array, segment_ids_BT: jax.Array | None,
                 width: int = CONV_WIDTH) -> jax.Array:
  """[B, T, width, *C]: at each position the `width` latest inputs, oldest first, the current
  one last; an input from before the row or before the position's run of equal segment ids
  (kernels' rule: a run is one document; padding is its own) is 0, so the convolution never
  reads across a document boundary."""
  T = x_BTC.shape[1]
  channels = (1,) * (x_BTC.ndim - 2)
  shift = lambda a, lag, fill: jnp.pad(a, [(0, 0), (lag, 0)] + [(0, 0)] * (a.ndim - 2),
                                       constant_values=fill)[:, :T]
  if segment_ids_BT is not None:
    continues_BT = segment_ids_BT == shift(segment_ids_BT, 1, -1)  # same run as t − 1
  taps, same_BT = [x_BTC], None
  for lag in range(1, width):
    tap = shift(x_BTC, lag, 0)
    if segment_ids_BT is not None:
      step_BT = shift(continues_BT, lag - 1, False)  # t − lag + 1 continues t − lag's run
      same_BT = step_BT if same_BT is None else same_BT & step_BT
      tap = jnp.where(same_BT.reshape(*same_BT.shape, *channels), tap, 0)
    taps.append(tap)
  return jnp.stack(taps[::-1], axis=2)


def conv_output(windows_BTWC: jax.Array, w_WC: jax.Array) -> jax.Array:
  """silu(Σ_j w_j · window_j): the causal depthwise convolution and its activation, for a
  sequence's windows (conv_windows) or one decode step's window ([B, 1, width, *C])."""
  return jax.nn.silu(jnp.einsum("btw...,w...->bt...", windows_BTWC, w_WC))


class DeltaAttention(nnx.Module):

  def __init__(self, *, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
               norm_eps: float, gate: str, impl: str, dtype, rngs: nnx.Rngs):
    if gate not in GATES:
      raise ValueError(f"model.delta_gate={gate!r}: expected one of {GATES}")
    D, N, K, H, R, W = d_model, num_heads, num_kv_heads, head_dim, GATE_RANK, CONV_WIDTH
    self.gate, self.impl, self.dtype, self.norm_eps = gate, impl, dtype, norm_eps
    self.wq_DNH = param(rngs, default_init, (D, N, H), ("embed", "heads", "kv"))
    self.wk_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.wv_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    # Depthwise taps, fan-in = width: a unit-variance input gives a unit-variance conv output.
    self.w_conv_q_WNH = param(rngs, default_init, (W, N, H), (None, "heads", "kv"))
    self.w_conv_k_WKH = param(rngs, default_init, (W, K, H), (None, "kv_heads", "kv"))
    self.w_conv_v_WKH = param(rngs, default_init, (W, K, H), (None, "kv_heads", "kv"))
    self.w_beta_DK = param(rngs, default_init, (D, K), ("embed", "kv_heads"))
    self.w_gate_down_DR = param(rngs, default_init, (D, R), ("embed", None))
    if gate == "head":
      self.w_gate_up_RK = param(rngs, default_init, (R, K), (None, "kv_heads"))
      self.gate_bias_K = nnx.Param(jnp.zeros((K,), jnp.float32), out_sharding=("kv_heads",),
                                   eager_sharding=False)
    else:
      self.w_gate_up_RKH = param(rngs, default_init, (R, K, H), (None, "kv_heads", "kv"))
      self.gate_bias_KH = nnx.Param(jnp.zeros((K, H), jnp.float32),
                                    out_sharding=("kv_heads", "kv"), eager_sharding=False)
    init_output(self, rngs, D, N, H)

  def log_decay(self, x_BTD: jax.Array) -> jax.Array:
    """log α, float32, in (−∞, 0): [B, T, K] (gate "head") or [B, T, K, H] ("channel"); also
    read by the recency hook."""
    if self.gate == "head":
      out = gate_log_decay(x_BTD, self.w_gate_down_DR[...], self.w_gate_up_RK[...],
                           self.gate_bias_K[...], self.dtype)
      return constrain(out, BTK)
    out = gate_log_decay(x_BTD, self.w_gate_down_DR[...], self.w_gate_up_RKH[...],
                         self.gate_bias_KH[...], self.dtype)
    return constrain(out, BTKH)

  def beta(self, x_BTD: jax.Array) -> jax.Array:
    """β [B, T, K] in (0, 1), float32 (the write strength); also read by the recency hook."""
    logits_BTK = project(x_BTD.astype(jnp.float32), self.w_beta_DK[...])
    return constrain(jax.nn.sigmoid(logits_BTK), BTK)

  def projections(self, x_BTD: jax.Array):
    """x W_Q [B,T,N,H], x W_K, x W_V [B,T,K,H]: the short convolutions' inputs (what a decode
    step keeps the last CONV_WIDTH of)."""
    x_BTD = x_BTD.astype(self.dtype)
    return (constrain(project(x_BTD, self.wq_DNH[...].astype(self.dtype)), BTNH),
            constrain(project(x_BTD, self.wk_DKH[...].astype(self.dtype)), BTKH),
            constrain(project(x_BTD, self.wv_DKH[...].astype(self.dtype)), BTKH))

  def convolved(self, windows_q, windows_k, windows_v):
    """q, k, v of the delta rule from their projections' windows (conv_windows)."""
    taps = (self.w_conv_q_WNH, self.w_conv_k_WKH, self.w_conv_v_WKH)
    return tuple(constrain(conv_output(w, tap[...].astype(self.dtype)), axes)
                 for w, tap, axes in zip((windows_q, windows_k, windows_v), taps,
                                         (BTNH, BTKH, BTKH)))

  # GLA's output, W_O (RMSNorm_head(o) ⊙ swish(x W_G)), on the same-named parameters.
  output = GatedLinearAttention.output

  def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
               segment_ids_BT: jax.Array | None) -> jax.Array:
    del positions_BT  # No position encoding: the decay and the erase term order the past.
    q_BTNH, k_BTKH, v_BTKH = self.convolved(*(conv_windows(p, segment_ids_BT)
                                              for p in self.projections(x_BTD)))
    batch_axes, _, head_axes, _ = mesh_axes(BTNH)
    out_BTNH = kernels.delta_attention(
        q_BTNH, k_BTKH, v_BTKH, self.log_decay(x_BTD), self.beta(x_BTD),
        segment_ids=segment_ids_BT, impl=self.impl, batch_axes=batch_axes, head_axes=head_axes)
    return self.output(out_BTNH, x_BTD)
