"""`delta_attention(q, k, v, log_decay, beta, segment_ids=, impl=)`, `delta_step` and
`delta_prefill`: input checks and dispatch.

The gated delta rule, per batch row and value head, state S [value dim Hv, key dim Hk]:
  S_t = S_{t-1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
with q and k L2-normalised per head inside the kernel (float32, x / sqrt(Σx² + 1e-6) as fla's
l2norm) and α_t = exp(log_decay_t). log_decay [B, T, V] is one gate per value head (Gated
DeltaNet: S_{t-1} diag(α_t) = α_t S_{t-1}); [B, T, V, Hk] is one per key channel (Kimi Delta
Attention), applied to the state's key channels before the delta update, i.e. KDA's
S_t = (I − β k kᵀ) Diag(α_t) S_{t-1} + β k vᵀ written for the transposed [key, value] state.
S_{t-1} = 0 where a maximal run of equal nonzero segment ids starts; segment 0 is padding, which
outputs 0 and neither reads nor writes the state.

Heads: q [B, T, N, Hk], k [B, T, K, Hk], v [B, T, V, Hv]; Hv may differ from Hk (published
Gated DeltaNet: expand_v = 2, Hv = 2 Hk). Exactly two layouts are legal (`_heads`; anything
else is a ValueError naming the shapes):
  GQA  V == K, N a multiple of K: query head n reads k, v head n // (N / K); out [B, T, N, Hv].
  GVA  N == K, V a multiple of K: value head j has its own state, gate and β and reads the q, k
       head j // (V / K) (transformers Qwen3-Next's repeat_interleave of q and k, as fla);
       out [B, T, V, Hv].
beta is [B, T, V] in both. GVA runs as GQA on q and k repeated to V heads (`_shared_qk`).
log_decay <= 0 and 0 <= beta <= 2 are the caller's contract (not checkable on traced values;
β = 2 sigmoid is fla's and transformers' allow_neg_eigval: I − β k kᵀ has eigenvalue 1 − β in
[−1, 1] along k, so the state still does not grow); log_decay down to -inf gives finite outputs
and gradients.

Implementations (`impl=`):
  "xla"    the chunked form in pure jax.numpy (delta_xla.py); every backend, the CPU default.
  "pallas" Triton kernels for CUDA GPUs (delta_pallas_gpu.py): the chunked forward and a
           hand-written backward. CUDA only (tests run it with interpret=True on the module).
  "auto"   decided when the function is lowered (jax.lax.platform_dependent), as
           linear_attention() does: XLA on every platform today. The Pallas kernel has never
           run on a GPU (checked in interpret mode and lowered with jax.export only), so
           "auto" will not choose it until it has been measured faster there; the `auto` of
           dispatch.py's table is the one place to change that.

`delta_step` is the one-token recurrent form (generation), on the same conventions;
`delta_prefill` runs a prompt in the chunked form and returns the state after it, where
`delta_step` goes on.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import context_parallel as cp
from hybrid_nope.kernels import delta_xla, dispatch, per_shard
# q, k and segment_ids obey attention()'s rules.
from hybrid_nope.kernels.attention import check_qkv

IMPLS = dispatch.TABLE["delta_attention"].impls


def _check_floating(name, x):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} dtype must be floating point; got {x.dtype}")


def _heads(q, k, v, lead: str) -> int:
  """V, the number of states (value heads), of q [*lead, N, Hk], k [*lead, K, Hk] and
  v [*lead, V, Hv] in one of the two legal head layouts (module docstring)."""
  shapes = tuple(tuple(x.shape) for x in (q, k, v))
  expected = (f"q {shapes[0]}, k {shapes[1]}, v {shapes[2]}: expected q [{lead}, heads N, "
              f"key dim], k [{lead}, heads K, key dim], v [{lead}, heads V, value dim] with "
              "GQA (V == K, N a multiple of K) or GVA (N == K, V a multiple of K)")
  rank = len(lead.split(",")) + 2
  if ({len(s) for s in shapes} != {rank} or len({s[:-2] for s in shapes}) != 1
      or shapes[0][-1] != shapes[1][-1]):
    raise ValueError(expected)
  N, K, V = (s[-2] for s in shapes)
  if min(N, K, V) < 1 or not ((V == K and N % K == 0) or (N == K and V % K == 0)):
    raise ValueError(f"heads N={N}, K={K}, V={V}; {expected}")
  return V


def _shared_qk(q, k, V: int):
  """q, k [..., heads, Hk] as the GQA form sees them: under GVA repeated to the V value heads,
  each in place (head j of the result is j // (V / K)); unchanged under GQA (V == K)."""
  repeats = V // k.shape[-2]
  if repeats == 1:
    return q, k
  return jnp.repeat(q, repeats, axis=-2), jnp.repeat(k, repeats, axis=-2)


def _check_gates(log_decay, beta, V, H, lead: str, lead_shape: tuple):
  """log_decay [*lead, V] or [*lead, V, H]; beta [*lead, V]."""
  per_head, per_channel = (*lead_shape, V), (*lead_shape, V, H)
  if tuple(log_decay.shape) not in (per_head, per_channel):
    raise ValueError(f"log_decay shape {tuple(log_decay.shape)}: expected [{lead}, value heads] "
                     f"= {per_head} (one gate per head) or [{lead}, value heads, key dim] = "
                     f"{per_channel} (one per key channel)")
  if tuple(beta.shape) != per_head:
    raise ValueError(f"beta shape {tuple(beta.shape)}: expected [{lead}, value heads] = "
                     f"{per_head}")
  _check_floating("log_decay", log_decay)
  _check_floating("beta", beta)


def _check(q_BTNH, k_BTKH, v_BTVJ, log_decay, beta_BTV, segment_ids, impl) -> int:
  """The argument checks of delta_attention and delta_prefill; returns V."""
  dispatch.check_impl("delta_attention", impl)
  V = _heads(q_BTNH, k_BTKH, v_BTVJ, "batch, time")
  check_qkv(q_BTNH, k_BTKH, k_BTKH, None, segment_ids)
  if v_BTVJ.dtype != q_BTNH.dtype:
    raise ValueError(f"q, k, v dtypes must match; got q={q_BTNH.dtype} v={v_BTVJ.dtype}")
  B, T, _, H = k_BTKH.shape
  _check_gates(log_decay, beta_BTV, V, H, "batch, time", (B, T))
  return V


def _gqa_operands(q_BTNH, k_BTKH, log_decay, beta_BTV, V):
  """(q, k, g [B, T, V, Hk or 1], beta [B, T, V, 1]): delta_xla's layout; per_shard splits
  [B, T, heads, .] operands, so the per-head gates travel with a unit last axis."""
  q, k = _shared_qk(q_BTNH, k_BTKH, V)
  g_BTVX = log_decay if log_decay.ndim == 4 else log_decay[..., None]
  return q, k, g_BTVX, beta_BTV[..., None]


def delta_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTVJ: jax.Array,
                    log_decay: jax.Array, beta_BTV: jax.Array, *,
                    segment_ids: jax.Array | None = None, impl: str = "auto", batch_axes=None,
                    head_axes=None, sequence_axes=None) -> jax.Array:
  """The gated delta rule (segment-reset, GQA or GVA); returns [B, T, max(N, V), Hv] in q's
  dtype.

  `log_decay`: [B, T, V] (per head) or [B, T, V, Hk] (per key channel); `beta` [B, T, V].
  `batch_axes` / `head_axes` / `sequence_axes` name the context mesh axes that split the
  batch, the heads and the sequence; given a multi-device mesh each device runs the kernel on
  its own shard (per_shard.py), a split sequence carrying the state across shards
  (context_parallel.recurrent).
  """
  V = _check(q_BTNH, k_BTKH, v_BTVJ, log_decay, beta_BTV, segment_ids, impl)
  dispatch.resolve("delta_attention", impl)
  q, k, g, beta = _gqa_operands(q_BTNH, k_BTKH, log_decay, beta_BTV, V)
  form = functools.partial(cp.recurrent, roles=(cp.QUERY, cp.KEY, cp.VALUE, cp.GATE, cp.BETA),
                           read_scale=1.0)
  return per_shard.run_on_platforms(dispatch.branches("delta_attention", impl),
                                    (q, k, v_BTVJ, g, beta), segment_ids,
                                    batch_axes=batch_axes, head_axes=head_axes,
                                    sequence_axes=sequence_axes, sequence_form=form)


def delta_step(state_BVJH: jax.Array, q_BNH: jax.Array, k_BKH: jax.Array, v_BVJ: jax.Array,
               log_decay: jax.Array, beta_BV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One token of the gated delta rule: (state_t float32 [B, V, Hv, Hk], out [B, max(N, V),
  Hv] in q's dtype). Heads as delta_attention's; log_decay [B, V] or [B, V, Hk], beta [B, V];
  q, k are normalised here as in delta_attention. A new document starts from a zero state
  (the caller resets it)."""
  V = _heads(q_BNH, k_BKH, v_BVJ, "batch")
  B, _, H = k_BKH.shape
  J = v_BVJ.shape[-1]
  if tuple(state_BVJH.shape) != (B, V, J, H):
    raise ValueError(f"state shape {tuple(state_BVJH.shape)}: expected [batch, value heads, "
                     f"value dim, key dim] = {(B, V, J, H)}")
  _check_gates(log_decay, beta_BV, V, H, "batch", (B,))
  for name, x in (("q", q_BNH), ("k", k_BKH), ("v", v_BVJ), ("state", state_BVJH)):
    _check_floating(name, x)
  # Normalised before the GVA repeat: the same vectors, computed once per q, k head.
  q, k = _shared_qk(delta_xla.l2norm(q_BNH), delta_xla.l2norm(k_BKH), V)
  N = q.shape[1]
  g = log_decay if log_decay.ndim == 3 else log_decay[..., None]
  state, out = delta_xla.step(state_BVJH.astype(jnp.float32), q.reshape(B, V, N // V, H), k,
                              v_BVJ.astype(jnp.float32), g.astype(jnp.float32),
                              beta_BV.astype(jnp.float32))
  return state, out.reshape(B, N, J).astype(q_BNH.dtype)


def delta_prefill(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTVJ: jax.Array,
                  log_decay: jax.Array, beta_BTV: jax.Array, *,
                  segment_ids: jax.Array | None = None) -> jax.Array:
  """The state after the last token, float32 [B, V, Hv, Hk] as `delta_step` takes it: a
  prompt in the chunked form (one scan step per chunk, not per token). Arguments as
  delta_attention's; padding (segment 0) leaves the state alone, so left-padded prompts of
  different lengths share one call."""
  V = _check(q_BTNH, k_BTKH, v_BTVJ, log_decay, beta_BTV, segment_ids, "xla")
  q, k, g, beta = _gqa_operands(q_BTNH, k_BTKH, log_decay, beta_BTV, V)
  _, state = delta_xla.chunked(q, k, v_BTVJ, g, beta, segment_ids=segment_ids,
                               return_state=True)
  return state
