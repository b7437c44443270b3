"""Incremental decoding, one layer kind at a time: what each token mixer keeps between tokens.

Every kind has a decoder with two functions (model/decode.py calls them; a new kind adds one
class here and names it in its spec, model/kind_specs.py):

  prefill(mixer, x_BTD, positions_BT, start_B, capacity) -> cache
      the cache after the prompt, from the mixer's input x over the whole (left-padded) prompt
      row, columns 0..T−1; row b's prompt starts at column start_B[b] (earlier ones are padding)
  step(mixer, cache, x_B1D, positions_B1, column, start_B) -> (y_B1D, cache)
      the mixer's output for one new token per row at `column` (the same for every row), and
      the cache that includes it

Caches hold what the training forward pass would read at that column, so a decoded token sees
exactly its full forward pass's context:
  S  a ring buffer of min(w, capacity) keys and values: column c lives in slot c mod R, and
     the slots then hold the window (c − w, c]. Keys are RoPE'd at their absolute positions (or
     not, NoPE-in-SWA), as in training.
  G  the same buffer with R = capacity columns (prompt + new tokens): it never wraps.
  L  GLA's state S [B, K, H, H] (kernels/linear_attention.py's recurrence), float32.
  D  the gated delta rule's state [B, K, H, H] (kernels.delta_step), float32, and the last
     CONV_WIDTH − 1 projections of q, k and v that the short convolutions read (model/delta.py),
     zero before the prompt's first token as the forward pass's conv_windows makes them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_nope import kernels
from hybrid_nope.errors import UserError
from hybrid_nope.model.delta import conv_windows


class DecodeError(UserError):
  pass


def _grouped(q_BNH: jax.Array, num_kv_heads: int) -> jax.Array:
  """[B, N, H] -> [B, K, N/K, H]: query head n reads kv head n // (N / K) (the kernels' GQA)."""
  B, N, H = q_BNH.shape
  return q_BNH.reshape(B, num_kv_heads, N // num_kv_heads, H)


class AttentionDecoder:
  """S and G layers (model/attention.py): softmax attention over the cached keys."""

  @staticmethod
  def slots(mixer, capacity: int) -> int:
    return capacity if mixer.window is None else min(mixer.window, capacity)

  @staticmethod
  def slot_columns(column, slots: int) -> jax.Array:
    """[R]: the column each slot holds once `column` is written (negative: not yet written)."""
    slot_R = jnp.arange(slots)
    return column - (column - slot_R) % slots

  def prefill(self, mixer, x_BTD, positions_BT, start_B, capacity):
    del start_B  # Padding columns stay in the buffer; step() masks them.
    _, k_BTKH, v_BTKH = mixer.qkv(x_BTD, positions_BT)
    T = x_BTD.shape[1]
    held_R = self.slot_columns(T - 1, self.slots(mixer, capacity))
    written_R1 = (held_R >= 0)[:, None, None]

    def buffer(x_BTKH):
      return jnp.where(written_R1, jnp.take(x_BTKH, jnp.maximum(held_R, 0), axis=1), 0)

    return {"k": buffer(k_BTKH), "v": buffer(v_BTKH)}

  def step(self, mixer, cache, x_B1D, positions_B1, column, start_B):
    q_B1NH, k_B1KH, v_B1KH = mixer.qkv(x_B1D, positions_B1)
    slots = cache["k"].shape[1]
    k_BRKH = jax.lax.dynamic_update_slice_in_dim(cache["k"], k_B1KH, column % slots, axis=1)
    v_BRKH = jax.lax.dynamic_update_slice_in_dim(cache["v"], v_B1KH, column % slots, axis=1)
    held_R = self.slot_columns(column, slots)
    visible_BR = held_R[None, :] >= start_B[:, None]  # Written, and not padding.
    if mixer.window is not None:  # Implied by slots <= window; kept as the rule it is.
      visible_BR &= (column - held_R < mixer.window)[None, :]
    K, H = k_BRKH.shape[2], k_BRKH.shape[3]
    q_BKGH = _grouped(q_B1NH[:, 0].astype(jnp.float32), K)
    logits_BKGR = jnp.einsum("bkgh,brkh->bkgr", q_BKGH, k_BRKH.astype(jnp.float32)) * H ** -0.5
    logits_BKGR = jnp.where(visible_BR[:, None, None, :], logits_BKGR, -jnp.inf)
    probs_BKGR = jax.nn.softmax(logits_BKGR, axis=-1)
    out_BKGH = jnp.einsum("bkgr,brkh->bkgh", probs_BKGR, v_BRKH.astype(jnp.float32))
    out_B1NH = out_BKGH.reshape(q_B1NH.shape).astype(q_B1NH.dtype)
    return mixer.out(out_B1NH), {"k": k_BRKH, "v": v_BRKH}


class LinearDecoder:
  """L layers (model/gla.py): S_t = diag(α_t) S_{t−1} + k_t v_tᵀ, out_t = H^(−1/2) q_tᵀ S_t."""

  def prefill(self, mixer, x_BTD, positions_BT, start_B, capacity):
    del positions_BT, capacity
    _, k_BTKH, v_BTKH, log_decay_BTKH = mixer.inputs(x_BTD)
    T = x_BTD.shape[1]
    # S_T = Σ_t exp(Σ_{s>t} log α_s) k_t v_tᵀ over the prompt's own columns (the state starts
    # at zero there, the kernels' segment start); padding comes first, so no decay after a
    # prompt token is padding's. The exclusive suffix sum is a cumsum, never a difference.
    later_BTKH = jnp.pad(log_decay_BTKH[:, 1:], ((0, 0), (0, 1), (0, 0), (0, 0)))
    suffix_BTKH = jnp.flip(jnp.cumsum(jnp.flip(later_BTKH, 1), axis=1), 1)
    prompt_BT = jnp.arange(T)[None, :] >= start_B[:, None]
    weight_BTKH = jnp.where(prompt_BT[:, :, None, None], jnp.exp(suffix_BTKH), 0.0)
    state_BKHJ = jnp.einsum("btkh,btkj->bkhj", weight_BTKH * k_BTKH.astype(jnp.float32),
                            v_BTKH.astype(jnp.float32))
    return {"state": state_BKHJ}

  def step(self, mixer, cache, x_B1D, positions_B1, column, start_B):
    del positions_B1, column, start_B
    q_B1NH, k_B1KH, v_B1KH, log_decay_B1KH = mixer.inputs(x_B1D)
    k_BKH, v_BKH = k_B1KH[:, 0].astype(jnp.float32), v_B1KH[:, 0].astype(jnp.float32)
    state_BKHJ = (jnp.exp(log_decay_B1KH[:, 0])[..., None] * cache["state"]
                  + k_BKH[..., :, None] * v_BKH[..., None, :])
    H = k_BKH.shape[-1]
    q_BKGH = _grouped(q_B1NH[:, 0].astype(jnp.float32), k_BKH.shape[1])
    out_BKGJ = jnp.einsum("bkgh,bkhj->bkgj", q_BKGH, state_BKHJ) * H ** -0.5
    out_B1NH = out_BKGJ.reshape(q_B1NH.shape).astype(q_B1NH.dtype)
    return mixer.output(out_B1NH, x_B1D), {"state": state_BKHJ}


class DeltaDecoder:
  """D layers (model/delta.py): S_t = α_t S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ after
  short causal convolutions of q, k, v."""

  STREAMS = ("q", "k", "v")

  def prefill(self, mixer, x_BTD, positions_BT, start_B, capacity):
    del positions_BT, capacity
    T = x_BTD.shape[1]
    prompt_BT = jnp.arange(T)[None, :] >= start_B[:, None]
    windows = [conv_windows(p, prompt_BT.astype(jnp.int32)) for p in mixer.projections(x_BTD)]
    q_BTNH, k_BTKH, v_BTKH = mixer.convolved(*windows)
    # The prompt in the chunked form; its padding (segment 0, which comes first) leaves the
    # state alone, and its first token starts from the zero state.
    state_BKHH = kernels.delta_prefill(q_BTNH, k_BTKH, v_BTKH, mixer.log_decay(x_BTD),
                                       mixer.beta(x_BTD),
                                       segment_ids=prompt_BT.astype(jnp.int32))
    # The newest CONV_WIDTH − 1 inputs of the last column's window: the next token's context.
    return {"state": state_BKHH,
            **{name: w[:, -1, 1:] for name, w in zip(self.STREAMS, windows)}}

  def step(self, mixer, cache, x_B1D, positions_B1, column, start_B):
    del positions_B1, column, start_B
    windows = [jnp.concatenate([cache[name], p_B1C], axis=1)  # [B, CONV_WIDTH, ...]
               for name, p_B1C in zip(self.STREAMS, mixer.projections(x_B1D))]
    q_B1NH, k_B1KH, v_B1KH = mixer.convolved(*(w[:, None] for w in windows))
    state_BKHH, out_BNH = kernels.delta_step(
        cache["state"], q_B1NH[:, 0], k_B1KH[:, 0], v_B1KH[:, 0], mixer.log_decay(x_B1D)[:, 0],
        mixer.beta(x_B1D)[:, 0])
    return mixer.output(out_BNH[:, None], x_B1D), {
        "state": state_BKHH, **{name: w[:, 1:] for name, w in zip(self.STREAMS, windows)}}
