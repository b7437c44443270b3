"""Attention with the sequence split over a mesh axis (context parallelism), run under shard_map.

Each device holds T/n consecutive tokens of every row (its shard); queries stay on their device
and only keys and values move:
  * sliding window w: the w - 1 keys and values before the shard come from the previous device
    (one `ppermute`, a halo). The local queries, prefixed by as many dummy queries, run through
    any attention kernel over [halo, shard]; the dummies' outputs are dropped. The dummies carry
    the halo's segment ids so every row of the kernel sees at least its own key (no empty
    softmax), and on the first device the halo is zeros under a segment id no token has.
  * global: keys, values and segment ids are all-gathered over the axis, and the local queries
    run a flash-style online softmax over key chunks (a rematerialised scan), masked by global
    position and segment; memory per device is O(T/n · chunk) for scores plus the gathered
    keys and values, O(T).
Documents may cross shard edges: masking uses the segment ids and global positions, exactly as
one device would. Positions (RoPE) are the batch's own and are applied before these calls.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

# A segment id no token carries: the first device's halo (there is nothing before it).
NO_SEGMENT = jnp.iinfo(jnp.int32).min
GLOBAL_KEY_CHUNK = 512


def _previous_shard(x, axis: str, axis_size: int):
  """x of the device before this one on `axis` (zeros on the first)."""
  return lax.ppermute(x, axis, perm=[(i, i + 1) for i in range(axis_size - 1)])


def sliding_window(kernel: Callable, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, *, window: int,
                   axis: str, axis_size: int):
  """Sliding-window attention of this device's shard; `kernel(q, k, v, segment_ids=)` is any
  single-device attention kernel for that window. Call inside shard_map over `axis`."""
  halo = window - 1
  T_local = q_BTNH.shape[1]
  if halo > T_local:
    raise ValueError(f"window {window} needs {halo} keys from the previous shard, which holds "
                     f"only {T_local}: use fewer sequence shards or a longer sequence")
  if halo == 0:
    return kernel(q_BTNH, k_BTKH, v_BTKH, segment_ids=segment_ids_BT)
  first = lax.axis_index(axis) == 0
  k_halo, v_halo = (_previous_shard(x[:, -halo:], axis, axis_size) for x in (k_BTKH, v_BTKH))
  seg_halo = _previous_shard(segment_ids_BT[:, -halo:], axis, axis_size)
  seg_halo = jnp.where(first, NO_SEGMENT, seg_halo)
  dummies = jnp.zeros((q_BTNH.shape[0], halo, *q_BTNH.shape[2:]), q_BTNH.dtype)
  out = kernel(jnp.concatenate([dummies, q_BTNH], axis=1),
               jnp.concatenate([k_halo, k_BTKH], axis=1),
               jnp.concatenate([v_halo, v_BTKH], axis=1),
               segment_ids=jnp.concatenate([seg_halo, segment_ids_BT], axis=1))
  return out[:, halo:]


def global_causal(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, *, axis: str,
                  chunk: int = GLOBAL_KEY_CHUNK):
  """Causal attention of this device's queries over every key before them (all-gathered over
  `axis`). Call inside shard_map over `axis`."""
  B, T_local, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  G = N // K
  gather = lambda x: lax.all_gather(x, axis, axis=1, tiled=True)
  k_all, v_all, seg_all = gather(k_BTKH), gather(v_BTKH), gather(segment_ids_BT)
  T = k_all.shape[1]
  chunk = min(chunk, T)
  pad = -T % chunk
  if pad:
    k_all, v_all = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k_all, v_all))
    seg_all = jnp.pad(seg_all, ((0, 0), (0, pad)), constant_values=NO_SEGMENT)
  chunks = (T + pad) // chunk
  q_start = lax.axis_index(axis) * T_local
  q_pos = q_start + jnp.arange(T_local)
  scale = 1.0 / jnp.sqrt(jnp.float32(H))
  q_BTKGH = (q_BTNH.astype(jnp.float32) * scale).reshape(B, T_local, K, G, H)

  @jax.checkpoint
  def step(carry, c):
    m_BKGT, l_BKGT, acc_BTKGH = carry
    k_c = lax.dynamic_slice_in_dim(k_all, c * chunk, chunk, axis=1).astype(jnp.float32)
    v_c = lax.dynamic_slice_in_dim(v_all, c * chunk, chunk, axis=1).astype(jnp.float32)
    seg_c = lax.dynamic_slice_in_dim(seg_all, c * chunk, chunk, axis=1)
    k_pos = c * chunk + jnp.arange(chunk)
    s_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_c)
    allowed_BTS = ((k_pos[None, None, :] <= q_pos[None, :, None])
                   & (seg_c[:, None, :] == segment_ids_BT[:, :, None]))
    s_BKGTS = jnp.where(allowed_BTS[:, None, None], s_BKGTS, -jnp.inf)
    m_new = jnp.maximum(m_BKGT, jnp.max(s_BKGTS, axis=-1))
    # Rows with nothing allowed yet keep m = -inf; exp of (-inf) - 0 is 0, never NaN.
    # The running max only shifts the exponent (it cancels): no gradient flows through it.
    m_safe = lax.stop_gradient(jnp.where(jnp.isfinite(m_new), m_new, 0.0))
    p_BKGTS = jnp.exp(s_BKGTS - m_safe[..., None])
    m_old = lax.stop_gradient(jnp.where(jnp.isfinite(m_BKGT), m_BKGT, 0.0))
    correction = jnp.exp(m_old - m_safe)
    correction = jnp.where(jnp.isfinite(m_BKGT), correction, 0.0)
    l_new = l_BKGT * correction + jnp.sum(p_BKGTS, axis=-1)
    acc_new = (acc_BTKGH * jnp.moveaxis(correction, -1, 1)[..., None]
               + jnp.einsum("bkgts,bskh->btkgh", p_BKGTS, v_c))
    return (m_new, l_new, acc_new), None

  init = (jnp.full((B, K, G, T_local), -jnp.inf, jnp.float32),
          jnp.zeros((B, K, G, T_local), jnp.float32),
          jnp.zeros((B, T_local, K, G, H), jnp.float32))
  (_, l_BKGT, acc_BTKGH), _ = lax.scan(step, init, jnp.arange(chunks))
  out = acc_BTKGH / jnp.moveaxis(l_BKGT, -1, 1)[..., None]
  return out.reshape(B, T_local, N, H).astype(q_BTNH.dtype)


# Roles of a recurrent kernel's operands, in its argument order: how the tokens this module adds
# (which set the initial state and read the final one) fill each.
QUERY, KEY, VALUE, GATE, BETA = "query", "key", "value", "gate", "beta"


def _affixed(arrays, roles, segment_ids_BT, prefix_values_BHKJ, H: int):
  """`arrays` with H tokens before them that write `prefix_values_BHKJ` into a zero state
  (token h: key e_h, value row h, no decay, β = 1), and H tokens after them that read the state
  out (token h: query e_h, no key or value, no decay, β = 0). Both carry the segment id of the
  token they touch, so no reset falls between them and the shard."""
  B = segment_ids_BT.shape[0]
  out = []
  for x, role in zip(arrays, roles):
    heads, width = x.shape[2], x.shape[3]
    basis = jnp.broadcast_to(jnp.eye(H, dtype=x.dtype)[None, :, None, :], (B, H, heads, H))
    zeros = jnp.zeros((B, H, heads, width), x.dtype)
    if role == KEY:
      before = basis
    elif role == VALUE:
      before = prefix_values_BHKJ.astype(x.dtype)
    elif role == BETA:
      before = jnp.ones_like(zeros)
    else:  # The query (its outputs are dropped) and the gate (0: no decay).
      before = zeros
    after = basis if role == QUERY else zeros
    out.append(jnp.concatenate([before, x, after], axis=1))
  seg = jnp.concatenate([jnp.repeat(segment_ids_BT[:, :1], H, axis=1), segment_ids_BT,
                         jnp.repeat(segment_ids_BT[:, -1:], H, axis=1)], axis=1)
  return out, seg


def recurrent(kernel: Callable, *operands, roles: tuple[str, ...], read_scale: float, axis: str,
              axis_size: int):
  """A recurrent (gated linear or delta-rule) layer over this device's shard, its state carried
  in from the shards before it. Call inside shard_map over `axis`. `operands`: the kernel's
  arrays, in the order `roles` names them, then the segment ids.

  `kernel(*arrays, segment_ids=)` is any single-device kernel whose state S [key H, value J] per
  kv head starts at zero, resets at segment starts, is moved by each token linearly
  (S -> A_t S + k_t v_tᵀ β_t, A_t = I for no decay and no key) and read as read_scale⁻¹ · qᵀS.
  The final state is then affine in the initial one, S_out = P S_in + S_loc, so every shard
  finds its (P, S_loc) at once, the tiny [H, H] maps are composed over the shards in order (the
  scan over shards), and each shard reruns with its carried-in state: three kernel passes, all
  in parallel, with H extra tokens at each end (`_affixed`). The kernels need no initial-state
  argument, and gradients flow through the carried state as through any other input.
  """
  *arrays, segment_ids_BT = operands
  q, v = arrays[roles.index(QUERY)], arrays[roles.index(VALUE)]
  B, T_local, N, H = q.shape
  K, J = v.shape[2], v.shape[3]
  G = N // K

  def run(values_BTKJ, prefix_BHKJ, upcast: bool):
    ops = [values_BTKJ if role == VALUE else x for x, role in zip(arrays, roles)]
    ops = [x.astype(jnp.float32) if upcast else x for x in ops]
    ops, seg = _affixed(ops, roles, segment_ids_BT, prefix_BHKJ, H)
    out = kernel(*ops, segment_ids=seg)
    state_BKHJ = jnp.moveaxis(out[:, -H:, ::G], 1, 2).astype(jnp.float32) * read_scale
    return out[:, H:-H], state_BKHJ

  # The state maps are read in float32 whatever the compute dtype: they compose over shards.
  f32 = jnp.float32
  _, S_loc_BKHJ = run(v, jnp.zeros((B, H, K, J), f32), upcast=True)
  eye_BHKH = jnp.broadcast_to(jnp.eye(H, dtype=f32)[None, :, None, :], (B, H, K, H))
  _, P_BKHH = run(jnp.zeros((B, T_local, K, H), f32), eye_BHKH, upcast=True)
  gather = lambda x: lax.all_gather(x, axis)  # [n, ...]: every shard's, in order.
  S_loc_n, P_n = gather(S_loc_BKHJ), gather(P_BKHH)
  first_n, last_n = gather(segment_ids_BT[:, 0]), gather(segment_ids_BT[:, -1])
  S_in = [jnp.zeros_like(S_loc_BKHJ)]
  for i in range(1, axis_size):
    # A shard continues the state only if its first token is in the previous one's last run.
    continues_B = (first_n[i] == last_n[i - 1]) & (first_n[i] != 0)
    carried = jnp.einsum("bkhg,bkgj->bkhj", P_n[i - 1], S_in[-1]) + S_loc_n[i - 1]
    S_in.append(jnp.where(continues_B[:, None, None, None], carried, 0.0))
  S_in_BKHJ = jnp.stack(S_in)[lax.axis_index(axis)]
  out, _ = run(v, jnp.moveaxis(S_in_BKHJ, 2, 1), upcast=False)
  return out.astype(q.dtype)

