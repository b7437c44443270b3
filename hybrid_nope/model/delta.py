"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with
Delta Rule"): the third local mixer, pattern letter D; with a per-channel gate, Kimi Delta
Attention (Kimi Linear, 2025).

  q, k, v = silu(conv(x W_Q)), silu(conv(x W_K)), silu(conv(x W_V))   causal depthwise conv,
                                                         width 4, within a document only
  β_t = sigmoid(x_t W_β)                                 per value head, float32; 2·sigmoid
                                                         with model.delta_allow_neg_eigval
  log α_t                                                model.delta_gate_form (delta_gates.py):
                                                         gla, mamba2 (Gated DeltaNet, Qwen3-Next)
                                                         or kda (Kimi Linear), per value head
                                                         (model.delta_gate "head") or per key
                                                         channel ("channel")
  S_t = S_{t−1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  o_t = s · S_t q_t
                                                         kernels.delta_attention (q, k unit per
                                                         head inside it); s = model.delta_qk_scale
  y_t = W_O (RMSNorm_head(o_t) ⊙ gate(x_t))              per-head output norm; swish(x W_G), or
                                                         sigmoid of a low-rank map for kda

Heads (model.delta_v_heads, model.delta_expand_v): value heads of d_v = expand_v · d_k, as many
as the key heads (GQA over the query heads) or a multiple of them (GVA, query heads = key heads).

The published layers: Gated DeltaNet (fla's GatedDeltaNet, transformers' Qwen3NextGatedDeltaNet)
is gate_form mamba2, gate head, qk_scale 1/sqrt(d_k), expand_v 2 (fla) or GVA (Qwen3-Next); KDA
(Kimi Linear) is gate_form kda, gate channel, qk_scale 1/sqrt(d_k). tests/hf/check_delta_hf.py maps
transformers' layers onto this one. The form "gla" (D's first, the default; configs/small.py's
gdn and gdn3 runs) takes GLA's gate, so that D differs from L only by the delta rule (the erase
term and β): at init α ≈ 0.95 (logsigmoid of unit-variance logits over τ = 16) and β ≈ 0.5, and
the scale is 1. No position encoding inside: the decay and the erase term order the past.

A one-token decode step reuses the pieces: `projections`, then `convolved` on a window of the
last CONV_WIDTH projections ([B, 1, width, ...], zeros before a document's start, as
`conv_windows` builds for a sequence), `log_decay`, `beta`, kernels.delta_step and `output`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope import kernels
from hybrid_nope.model import delta_gates
from hybrid_nope.model.attention import BTKH, BTNH
from hybrid_nope.model.delta_gates import FORMS, GATES  # noqa: F401  (validate.py's choices)
from hybrid_nope.model.gla import gated_norm_output, init_output
from hybrid_nope.model.layers import constrain, default_init, mesh_axes, param, project

CONV_WIDTH = 4
BTK = ("act_batch", "act_length", "act_kv_heads")
# model.delta_qk_scale: the query's scale as a function of d_k (published forms: 1/sqrt(d_k)).
QK_SCALES = {"1": lambda d_k: 1.0, "1/sqrt(d_k)": lambda d_k: d_k ** -0.5}


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
  """The gated delta rule layer. Heads: N query and K key heads of d_k = head_dim, V value heads
  of d_v = expand_v · d_k; V = K with N a multiple of K (GQA, N output heads), or N = K with V a
  multiple of K (GVA: value head j reads q/k head j // (V/K), as Qwen3-Next; V output heads).
  The value-side parameters keep D's first names (wv_DKH, w_conv_v_WKH, w_beta_DK, the gates'
  K, and the output's N, H): there K reads V, N the output heads and H the channels d_v."""

  def __init__(self, *, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
               norm_eps: float, gate: str, impl: str, dtype, rngs: nnx.Rngs,
               gate_form: str = "gla", expand_v: int = 1, v_heads: int = 0,
               qk_scale: str = "1", allow_neg_eigval: bool = False):
    check_shape(gate_form=gate_form, gate=gate, num_heads=num_heads, num_kv_heads=num_kv_heads,
                v_heads=v_heads, expand_v=expand_v, qk_scale=qk_scale)
    D, N, K, H, W = d_model, num_heads, num_kv_heads, head_dim, CONV_WIDTH
    V, J = v_heads or K, expand_v * head_dim
    O = V if V != K else N  # output heads
    self.gate, self.gate_form, self.impl, self.dtype = gate, gate_form, impl, dtype
    self.norm_eps, self.allow_neg_eigval = norm_eps, allow_neg_eigval
    # Folded into the read-out before the output norm (the recurrence output is linear in q);
    # the norm's eps makes it matter there.
    self.qk_scale = QK_SCALES[qk_scale](H)
    self.wq_DNH = param(rngs, default_init, (D, N, H), ("embed", "heads", "kv"))
    self.wk_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.wv_DKH = param(rngs, default_init, (D, V, J), ("embed", "kv_heads", "kv"))
    # Depthwise taps, fan-in = width: a unit-variance input gives a unit-variance conv output.
    self.w_conv_q_WNH = param(rngs, default_init, (W, N, H), (None, "heads", "kv"))
    self.w_conv_k_WKH = param(rngs, default_init, (W, K, H), (None, "kv_heads", "kv"))
    self.w_conv_v_WKH = param(rngs, default_init, (W, V, J), (None, "kv_heads", "kv"))
    self.w_beta_DK = param(rngs, default_init, (D, V), ("embed", "kv_heads"))
    delta_gates.init_forget(self, rngs, gate_form, gate, D, V, H)
    delta_gates.init_output_gate(self, rngs, gate_form, D, O, J)
    init_output(self, rngs, D, O, J, gate=False)

  def log_decay(self, x_BTD: jax.Array) -> jax.Array:
    """log α, float32, in (−∞, 0): [B, T, V] (gate "head") or [B, T, V, H] ("channel"); also
    read by the recency hook."""
    out = delta_gates.forget_log_decay(self, self.gate_form, self.gate, x_BTD, self.dtype)
    return constrain(out, BTK if self.gate == "head" else BTKH)

  def beta(self, x_BTD: jax.Array) -> jax.Array:
    """β [B, T, V], float32, in (0, 1), or (0, 2) with allow_neg_eigval (the transition
    I − β k kᵀ may then have a negative eigenvalue); also read by the recency hook."""
    logits_BTK = project(x_BTD.astype(jnp.float32), self.w_beta_DK[...])
    beta_BTK = jax.nn.sigmoid(logits_BTK)
    return constrain(2.0 * beta_BTK if self.allow_neg_eigval else beta_BTK, BTK)

  def projections(self, x_BTD: jax.Array):
    """x W_Q [B,T,N,H], x W_K [B,T,K,H], x W_V [B,T,V,J]: the short convolutions' inputs (what
    a decode step keeps the last CONV_WIDTH of)."""
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

  def output(self, out_BTNJ: jax.Array, x_BTD: jax.Array) -> jax.Array:
    """W_O (RMSNorm_head(scale · o) ⊙ gate(x)) of the recurrence's output o [B, T, O, J] (a
    sequence's or one decode step's) and the layer input x."""
    if self.qk_scale != 1.0:
      out_BTNJ = out_BTNJ.astype(jnp.float32) * self.qk_scale
    gate_BTNJ = delta_gates.output_gate(self, self.gate_form, x_BTD, self.dtype)
    return gated_norm_output(self, out_BTNJ, gate_BTNJ)

  def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
               segment_ids_BT: jax.Array | None) -> jax.Array:
    del positions_BT  # No position encoding: the decay and the erase term order the past.
    q_BTNH, k_BTKH, v_BTKJ = self.convolved(*(conv_windows(p, segment_ids_BT)
                                              for p in self.projections(x_BTD)))
    batch_axes, sequence_axes, head_axes, _ = mesh_axes(BTNH)
    out_BTNJ = kernels.delta_attention(
        q_BTNH, k_BTKH, v_BTKJ, self.log_decay(x_BTD), self.beta(x_BTD),
        segment_ids=segment_ids_BT, impl=self.impl, batch_axes=batch_axes, head_axes=head_axes,
        sequence_axes=sequence_axes)
    return self.output(out_BTNJ, x_BTD)


def check_shape(*, gate_form: str, gate: str, num_heads: int, num_kv_heads: int, v_heads: int,
                expand_v: int, qk_scale: str) -> None:
  """The D layer's options and head layout, each refusal naming its config key (validate.py
  calls this for every config with a D layer; the layer again for direct use)."""
  def refuse(key, value, expected):
    raise ValueError(f"model.{key}={value!r}: expected {expected}")
  if gate_form not in delta_gates.FORMS:
    refuse("delta_gate_form", gate_form, f"one of {delta_gates.FORMS}")
  if gate not in delta_gates.FORM_GATES[gate_form]:
    refuse("delta_gate", gate, f"one of {delta_gates.FORM_GATES[gate_form]} with "
           f"model.delta_gate_form={gate_form!r} (the published form's gate shape)")
  if qk_scale not in QK_SCALES:
    refuse("delta_qk_scale", qk_scale, f"one of {sorted(QK_SCALES)}")
  if not isinstance(expand_v, int) or expand_v < 1:
    refuse("delta_expand_v", expand_v, "an integer >= 1 (value head dim = expand_v x head_dim)")
  if not isinstance(v_heads, int) or v_heads < 0 or (v_heads and v_heads % num_kv_heads):
    refuse("delta_v_heads", v_heads, f"0 (= model.num_kv_heads) or a multiple of "
           f"model.num_kv_heads={num_kv_heads} (value heads sharing q/k heads, GVA)")
  if v_heads and v_heads != num_kv_heads and num_heads != num_kv_heads:
    refuse("delta_v_heads", v_heads, f"0 or {num_kv_heads} while model.num_heads={num_heads} != "
           f"model.num_kv_heads={num_kv_heads}: more value than key heads (GVA) needs as many "
           "query as key heads, as Qwen3-Next and fla")
