"""Pure-XLA attention, correct on every backend.

Sliding-window layers run blocked: queries in blocks of c >= window tokens meet only their own
key block and the one before it, so compute and memory are O(T · 2c), not O(T²). Global layers
run by query blocks that skip the upper triangle; their memory is still O(T²) under autodiff,
which a chunked online-softmax kernel with its own VJP is to remove.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

MIN_BLOCK = 64  # Smaller sliding-window query blocks make matmuls too thin to run well.
GLOBAL_BLOCK = 128  # Query block of causal_blocked: measured fastest on CPU at T=1024.
MAX_GLOBAL_BLOCKS = 32


def _masked_softmax(logits, mask):
  logits = jnp.where(mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def _attend(q_BCNH, k_BSKH, v_BSKH, seg_BC, seg_BS, *, q_start, window):
  """Queries at positions q_start + r against keys at positions 0 .. S-1 (causal, windowed)."""
  B, C, N, H = q_BCNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  q_BCKGH = q_BCNH.reshape(B, C, K, N // K, H)  # Query head n reads kv head n // (N/K).
  logits_BKGCS = jnp.einsum("bckgh,bskh->bkgcs", q_BCKGH, k_BSKH) * H**-0.5
  i, j = q_start + jnp.arange(C)[:, None], jnp.arange(S)[None, :]
  mask_CS = j <= i
  if window is not None:
    mask_CS &= j > i - window
  mask = mask_CS[None, None, None]
  if seg_BC is not None:
    mask = mask & (seg_BC[:, :, None] == seg_BS[:, None, :])[:, None, None]
  p_BKGCS = _masked_softmax(logits_BKGCS, mask).astype(v_BSKH.dtype)
  return jnp.einsum("bkgcs,bskh->bckgh", p_BKGCS, v_BSKH).reshape(B, C, N, H)


def dense(q_BTNH, k_BTKH, v_BTKH, *, window, segment_ids):
  """The whole T x T score matrix at once: the reference layout, O(T²) memory."""
  return _attend(q_BTNH, k_BTKH, v_BTKH, segment_ids, segment_ids, q_start=0, window=window)


def causal_blocked(q_BTNH, k_BTKH, v_BTKH, *, segment_ids):
  """Global causal attention by query blocks, each against only the keys up to its end.

  Skips the upper triangle (half the work of dense) and keeps each block's scores small enough
  to stay in cache; the block loop is unrolled, so blocks grow with T to bound compile time.
  """
  T = q_BTNH.shape[1]
  c = max(GLOBAL_BLOCK, -(-T // MAX_GLOBAL_BLOCKS))
  outs = []
  for start in range(0, T, c):
    end = min(start + c, T)
    seg_q = None if segment_ids is None else segment_ids[:, start:end]
    seg_k = None if segment_ids is None else segment_ids[:, :end]
    outs.append(_attend(q_BTNH[:, start:end], k_BTKH[:, :end], v_BTKH[:, :end], seg_q, seg_k,
                        q_start=start, window=None))
  return jnp.concatenate(outs, axis=1)


def sliding_window(q_BTNH, k_BTKH, v_BTKH, *, window, segment_ids):
  B, T, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  c = max(window, MIN_BLOCK)
  nb = -(-T // c)
  pad = nb * c - T
  if segment_ids is None:
    segment_ids = jnp.zeros((B, T), jnp.int32)
  # Tail padding gets its own segment (so padded queries see only padded keys and stay finite);
  # one block of front padding gives block 0 a "previous" key block, masked out by segment -2.
  seg_q = jnp.pad(segment_ids, ((0, 0), (0, pad)), constant_values=-1)
  seg_k = jnp.pad(seg_q, ((0, 0), (c, 0)), constant_values=-2)
  q_BnCKGH = jnp.pad(q_BTNH, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, nb, c, K, N // K, H)

  def key_blocks(x):  # [B, (nb+1)c, ...] -> [B, nb, 2c, ...]: block b's keys and the previous.
    x = x.reshape(B, nb + 1, c, *x.shape[2:])
    return jnp.concatenate([x[:, :-1], x[:, 1:]], axis=2)

  k_Bn2KH, v_Bn2KH = (key_blocks(jnp.pad(x, ((0, 0), (c, pad), (0, 0), (0, 0))))
                      for x in (k_BTKH, v_BTKH))
  seg_Bn2 = key_blocks(seg_k)
  logits = jnp.einsum("bnqkgh,bnskh->bnkgqs", q_BnCKGH, k_Bn2KH) * H**-0.5
  # Query r of block b is at b·c + r; key s is at b·c − c + s; their distance is r − s + c.
  r, s = jnp.arange(c)[:, None], jnp.arange(2 * c)[None, :]
  distance = r - s + c
  mask_CS = (distance >= 0) & (distance < window)
  seg_BnC = seg_q.reshape(B, nb, c)
  mask = mask_CS & (seg_BnC[:, :, :, None] == seg_Bn2[:, :, None, :])
  p = _masked_softmax(logits, mask[:, :, None, None]).astype(v_BTKH.dtype)
  out = jnp.einsum("bnkgqs,bnskh->bnqkgh", p, v_Bn2KH)
  return out.reshape(B, nb * c, N, H)[:, :T]


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None):
  T = q_BTNH.shape[1]
  if window is None or window >= T:
    # A window covering the whole sequence is exactly causal global attention.
    return causal_blocked(q_BTNH, k_BTKH, v_BTKH, segment_ids=segment_ids)
  if 2 * max(window, MIN_BLOCK) >= T:
    return dense(q_BTNH, k_BTKH, v_BTKH, window=window, segment_ids=segment_ids)
  return sliding_window(q_BTNH, k_BTKH, v_BTKH, window=window, segment_ids=segment_ids)
