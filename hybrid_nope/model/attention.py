"""Multi-head (GQA) attention layer: sliding-window or global, with RoPE or no position encoding."""
from __future__ import annotations

import jax
from flax import nnx

from hybrid_nope import kernels
from hybrid_nope.model.layers import (apply_rope, constrain, default_init, mesh_axes, param,
                                      project)

POSITION_ENCODINGS = ("rope", "nope")
BTNH = ("act_batch", "act_length", "act_heads", None)
BTKH = ("act_batch", "act_length", "act_kv_heads", None)


class Attention(nnx.Module):
  """q = x W_Q, k = x W_K, v = x W_V per head; out = W_O · attention(q, k, v).

  `window` None makes it a global causal layer; an int makes it sliding-window.
  """

  def __init__(self, *, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
               window: int | None, position: str, rope_theta: float, impl: str, dtype,
               rngs: nnx.Rngs):
    if position not in POSITION_ENCODINGS:
      raise ValueError(f"position={position!r}: expected one of {POSITION_ENCODINGS}")
    self.window = window
    self.position = position
    self.rope_theta = rope_theta
    self.impl = impl
    self.dtype = dtype
    D, N, K, H = d_model, num_heads, num_kv_heads, head_dim
    self.wq_DNH = param(rngs, default_init, (D, N, H), ("embed", "heads", "kv"))
    self.wk_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.wv_DKH = param(rngs, default_init, (D, K, H), ("embed", "kv_heads", "kv"))
    self.wo_NHD = param(rngs, default_init, (N, H, D), ("heads", "kv", "embed"), in_axes=(0, 1))

  def qkv(self, x_BTD: jax.Array, positions_BT: jax.Array):
    """q [B,T,N,H], k, v [B,T,K,H], RoPE'd at `positions_BT` where the layer uses it (also what
    a decode step caches: model/decode_layers.py)."""
    x_BTD = x_BTD.astype(self.dtype)
    q_BTNH = constrain(project(x_BTD, self.wq_DNH[...].astype(self.dtype)), BTNH)
    k_BTKH = constrain(project(x_BTD, self.wk_DKH[...].astype(self.dtype)), BTKH)
    v_BTKH = constrain(project(x_BTD, self.wv_DKH[...].astype(self.dtype)), BTKH)
    if self.position == "rope":
      q_BTNH = apply_rope(q_BTNH, positions_BT, self.rope_theta)
      k_BTKH = apply_rope(k_BTKH, positions_BT, self.rope_theta)
    return q_BTNH, k_BTKH, v_BTKH

  def out(self, out_BTNH: jax.Array) -> jax.Array:
    """The output projection W_O of the heads' attention outputs."""
    return project(out_BTNH, self.wo_NHD[...].astype(self.dtype), contract=2)

  def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
               segment_ids_BT: jax.Array | None) -> jax.Array:
    q_BTNH, k_BTKH, v_BTKH = self.qkv(x_BTD, positions_BT)
    # The kernel applies 1/sqrt(H) to the logits (jax.nn.dot_product_attention's default),
    # and runs on each device's shard of batch and heads under the trainer's mesh.
    batch_axes, sequence_axes, head_axes, _ = mesh_axes(BTNH)
    kv_head_axes = mesh_axes(BTKH)[2]
    if kv_head_axes != head_axes:
      raise ValueError(f"sharding rules map act_heads to {head_axes} but act_kv_heads to "
                       f"{kv_head_axes}: a kv head must live with its query heads")
    out_BTNH = kernels.attention(q_BTNH, k_BTKH, v_BTKH, window=self.window,
                                 segment_ids=segment_ids_BT, impl=self.impl,
                                 batch_axes=batch_axes, head_axes=head_axes,
                                 sequence_axes=sequence_axes)
    return self.out(out_BTNH)
