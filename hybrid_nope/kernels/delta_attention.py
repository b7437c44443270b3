"""`delta_attention(q, k, v, log_decay, beta, segment_ids=, impl=)` and `delta_step`: input
checks and dispatch.

The gated delta rule, per batch row and kv head, state S [value dim, key dim]:
  S_t = S_{t-1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
with q and k L2-normalised per head inside the kernel (float32, x / sqrt(Σx² + 1e-6) as fla's
l2norm) and α_t = exp(log_decay_t). log_decay [B, T, K] is one gate per kv head (Gated DeltaNet:
S_{t-1} diag(α_t) = α_t S_{t-1}); [B, T, K, H] is one per key channel (Kimi Delta Attention),
applied to the state's key channels before the delta update, i.e. KDA's
S_t = (I − β k kᵀ) Diag(α_t) S_{t-1} + β k vᵀ written for the transposed [key, value] state.
S_{t-1} = 0 where a maximal run of equal nonzero segment ids starts; segment 0 is padding, which
outputs 0 and neither reads nor writes the state. GQA: query head n reads kv head n // (N / K).
log_decay <= 0 and 0 <= beta <= 1 are the caller's contract (not checkable on traced values);
log_decay down to -inf gives finite outputs and gradients.

Implementations (`impl=`):
  "xla"   the chunked form in pure jax.numpy (delta_xla.py); every backend, the CPU default.
  "auto"  decided when the function is lowered (jax.lax.platform_dependent), as
          linear_attention() does: XLA on every platform today.

`delta_step` is the one-token recurrent form (generation), on the same conventions;
`delta_prefill` runs a prompt in the chunked form and returns the state after it, where
`delta_step` goes on.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import delta_xla, per_shard
# q, k, v and segment_ids obey attention()'s rules.
from hybrid_nope.kernels.attention import _check as _check_qkv

IMPLS = ("auto", "xla")


def _check_floating(name, x):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} dtype must be floating point; got {x.dtype}")


def _check_gates(log_decay, beta, B, K, H, lead: str, lead_shape: tuple):
  """log_decay [*lead, K] or [*lead, K, H]; beta [*lead, K]."""
  per_head, per_channel = (*lead_shape, K), (*lead_shape, K, H)
  if tuple(log_decay.shape) not in (per_head, per_channel):
    raise ValueError(f"log_decay shape {tuple(log_decay.shape)}: expected [{lead}, kv heads] = "
                     f"{per_head} (one gate per head) or [{lead}, kv heads, head_dim] = "
                     f"{per_channel} (one per key channel)")
  if tuple(beta.shape) != per_head:
    raise ValueError(f"beta shape {tuple(beta.shape)}: expected [{lead}, kv heads] = {per_head}")
  _check_floating("log_decay", log_decay)
  _check_floating("beta", beta)


def _check(q_BTNH, k_BTKH, v_BTKH, log_decay, beta_BTK, segment_ids, impl):
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r}: expected one of {IMPLS}")
  _check_qkv(q_BTNH, k_BTKH, v_BTKH, None, segment_ids, "xla")
  B, T, K, H = k_BTKH.shape
  _check_gates(log_decay, beta_BTK, B, K, H, "batch, time", (B, T))


def available_impls() -> tuple[str, ...]:
  """Concrete implementations that can run on the target platform (XLA runs everywhere)."""
  return IMPLS[1:]


def _per_platform(impl: str) -> dict:
  """platform -> kernel for jax.lax.platform_dependent, as linear_attention._per_platform."""
  del impl  # "xla" and "auto" are both the XLA kernel on every platform today.
  return {"default": delta_xla.delta_attention}


def resolve(impl: str) -> str:
  """The concrete implementation `impl` means on the target platform (any platform: XLA)."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r}: expected one of {IMPLS}")
  return "xla"


def delta_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                    log_decay: jax.Array, beta_BTK: jax.Array, *,
                    segment_ids: jax.Array | None = None, impl: str = "auto", batch_axes=None,
                    head_axes=None) -> jax.Array:
  """The gated delta rule (segment-reset, GQA); returns [B, T, N, H] in q's dtype.

  `log_decay`: [B, T, K] (per head) or [B, T, K, H] (per key channel). `batch_axes` /
  `head_axes` name the context mesh axes that split the batch and the heads; given a
  multi-device mesh each device runs the kernel on its own shard (per_shard.py).
  """
  _check(q_BTNH, k_BTKH, v_BTKH, log_decay, beta_BTK, segment_ids, impl)
  resolve(impl)
  # per_shard splits [B, T, heads, .] operands: the per-head gates travel as [B, T, K, 1].
  g_BTKX = log_decay if log_decay.ndim == 4 else log_decay[..., None]
  return per_shard.run_on_platforms(_per_platform(impl),
                                    (q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK[..., None]),
                                    segment_ids, batch_axes=batch_axes, head_axes=head_axes)


def delta_step(state_BKHH: jax.Array, q_BNH: jax.Array, k_BKH: jax.Array, v_BKH: jax.Array,
               log_decay: jax.Array, beta_BK: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One token of the gated delta rule: (state_t float32 [B, K, H_value, H_key], out [B, N, H]
  in q's dtype). log_decay [B, K] or [B, K, H]; q, k are normalised here as in
  delta_attention. A new document starts from a zero state (the caller resets it)."""
  if q_BNH.ndim != 3 or k_BKH.ndim != 3 or v_BKH.ndim != 3:
    raise ValueError(f"q, k, v must be rank 3 [batch, heads, head_dim]; got q={q_BNH.shape} "
                     f"k={k_BKH.shape} v={v_BKH.shape}")
  B, K, H = k_BKH.shape
  N = q_BNH.shape[1]
  if tuple(v_BKH.shape) != (B, K, H) or q_BNH.shape[0] != B or q_BNH.shape[2] != H or N % K:
    raise ValueError(f"q {q_BNH.shape}, k {k_BKH.shape}, v {v_BKH.shape}: expected q [batch, "
                     "heads, head_dim] and k, v [batch, kv heads, head_dim] with heads a "
                     "multiple of kv heads")
  if tuple(state_BKHH.shape) != (B, K, H, H):
    raise ValueError(f"state shape {tuple(state_BKHH.shape)}: expected [batch, kv heads, "
                     f"head_dim, head_dim] = {(B, K, H, H)}")
  _check_gates(log_decay, beta_BK, B, K, H, "batch", (B,))
  for name, x in (("q", q_BNH), ("k", k_BKH), ("v", v_BKH), ("state", state_BKHH)):
    _check_floating(name, x)
  g = log_decay if log_decay.ndim == 3 else log_decay[..., None]
  state, out = delta_xla.step(state_BKHH.astype(jnp.float32),
                              delta_xla.l2norm(q_BNH).reshape(B, K, N // K, H),
                              delta_xla.l2norm(k_BKH), v_BKH.astype(jnp.float32),
                              g.astype(jnp.float32), beta_BK.astype(jnp.float32))
  return state, out.reshape(B, N, H).astype(q_BNH.dtype)


def delta_prefill(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                  log_decay: jax.Array, beta_BTK: jax.Array, *,
                  segment_ids: jax.Array | None = None) -> jax.Array:
  """The state after the last token, float32 [B, K, H_value, H_key] as `delta_step` takes it:
  a prompt in the chunked form (one scan step per chunk, not per token). Arguments as
  delta_attention's; padding (segment 0) leaves the state alone, so left-padded prompts of
  different lengths share one call."""
  _check(q_BTNH, k_BTKH, v_BTKH, log_decay, beta_BTK, segment_ids, "xla")
  g_BTKX = log_decay if log_decay.ndim == 4 else log_decay[..., None]
  _, state = delta_xla.chunked(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK[..., None],
                               segment_ids=segment_ids, return_state=True)
  return state
