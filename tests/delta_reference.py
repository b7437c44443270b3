"""The float64 gated delta rule every delta kernel test compares against.

Written straight from the contract in DESIGN.md and independent of hybrid_nope: per (batch row,
state) a sequential recurrence over time with the explicit [Hv, Hk] matrices,
  S_t = S_{t-1} · diag(exp(log_decay_t)) · (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
q and k divided by sqrt(Σx² + 1e-6) per head, S_{t-1} = 0 where a run of equal nonzero segment
ids starts, and 0 output on padding (segment 0), which leaves the state alone. Heads q
[B,T,N,Hk], k [B,T,K,Hk], v [B,T,V,Hv] in the contract's two layouts (_head_maps): GQA (V == K,
one state per k/v head, query head n reads state n // (N/K)) and GVA (N == K, one state per value
head j, reading the q/k head j // (V/K)); the gates are per state. It runs in JAX
with float64 enabled so that its gradients are autodiff's (checked against central finite
differences in test_kernels_delta_attention.py).
"""
import jax
import jax.numpy as jnp
import numpy as np

from linear_reference import random_linear_inputs


def _normalise(x):
  return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _forward(q, k, v, g, beta, reset, valid):
  """float64 arrays; g [B,T,V] or [B,T,V,Hk]; reset, valid bool [B,T]."""
  return _forward_and_state(q, k, v, g, beta, reset, valid)[0]


def _head_maps(N, K, V):
  """(key head of each state, state of each output head, query head of each output head)."""
  if V == K and N % K == 0:  # GQA: a state per k/v head, read by N/K query heads
    return np.arange(K), np.arange(N) // (N // K), np.arange(N)
  if N == K and V % K == 0:  # GVA: a state per value head, reading q/k head j // (V/K)
    return np.arange(V) // (V // K), np.arange(V), np.arange(V) // (V // K)
  raise ValueError(f"heads N={N}, K={K}, V={V} are neither GQA nor GVA")


def _forward_and_state(q, k, v, g, beta, reset, valid):
  """(out [B, T, outputs, Hv], the state S [B, V, Hv, Hk] after the last token)."""
  B, T, N, H = q.shape
  K, (V, J) = k.shape[2], v.shape[2:]
  key_of_state, state_of_out, query_of_out = _head_maps(N, K, V)
  q = _normalise(q)[:, :, query_of_out]  # [B, T, outputs, Hk]
  k = _normalise(k)[:, :, key_of_state]  # [B, T, V, Hk]
  g = g if g.ndim == 4 else jnp.broadcast_to(g[..., None], k.shape)
  eye = jnp.eye(H, dtype=q.dtype)

  def body(S, xs):  # S [B, V, Hv, Hk]
    q, k, v, g, beta, reset, valid = xs
    # Padding neither reads nor writes S (nor resets it: a prompt's state survives the
    # padding after it).
    previous = jnp.where(reset[:, None, None, None], 0.0, S)
    erase = eye - beta[..., None, None] * k[..., :, None] * k[..., None, :]
    decay = jnp.exp(g)[..., :, None] * eye  # diag(α_t)
    new = previous @ decay @ erase + beta[..., None, None] * v[..., :, None] * k[..., None, :]
    S = jnp.where(valid[:, None, None, None], new, S)
    out = jnp.einsum("bovd,bod->bov", S[:, state_of_out], q) * valid[:, None, None]
    return S, out

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  S, out = jax.lax.scan(body, jnp.zeros((B, V, J, H), q.dtype),
                        tuple(map(time_major, (q, k, v, g, beta, reset, valid))))
  return jnp.moveaxis(out, 0, 1), S


# One program for the output and the state: tests that want both on one shape compile once.
_forward_and_state_jit = jax.jit(_forward_and_state)


@jax.jit
def _out_and_grads(args, masks, dout):
  out, vjp = jax.vjp(lambda *a: _forward(*a, *masks), *args)
  return out, vjp(dout)


def _runs(segment_ids, B, T):
  """(reset [B,T]: a run of equal ids starts here, valid [B,T]: not padding)."""
  seg = np.ones((B, T), np.int64) if segment_ids is None else np.asarray(segment_ids, np.int64)
  reset = np.ones((B, T), bool)
  reset[:, 1:] = seg[:, 1:] != seg[:, :-1]
  return reset, seg != 0


def delta_reference(q, k, v, log_decay, beta, segment_ids=None, dout=None):
  """out [B,T,max(N,V),Hv] float64 numpy, or (out, (dq, dk, dv, dlog_decay, dbeta)) given
  `dout`."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, log_decay, beta)]
    B, T = args[0].shape[:2]
    masks = [jnp.asarray(m) for m in _runs(segment_ids, B, T)]
    if dout is None:
      return np.asarray(_forward_and_state_jit(*args, *masks)[0])
    out, grads = _out_and_grads(args, masks, jnp.asarray(np.asarray(dout, np.float64)))
    return np.asarray(out), tuple(np.asarray(x) for x in grads)


def delta_reference_state(q, k, v, log_decay, beta, segment_ids=None):
  """The state S [B, V, Hv, Hk] after the last token, float64 numpy."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, log_decay, beta)]
    B, T = args[0].shape[:2]
    masks = [jnp.asarray(m) for m in _runs(segment_ids, B, T)]
    return np.asarray(_forward_and_state_jit(*args, *masks)[1])


def random_delta_inputs(rng, B, T, N, K, H, decay="mixed", beta="uniform", per_channel=False,
                        V=None, Hv=None):
  """q [B,T,N,H], k [B,T,K,H], v [B,T,V,Hv] unit normal (V = K, Hv = H unless given);
  log_decay [B,T,V,H] if per_channel else [B,T,V], drawn as in random_linear_inputs (`decay`:
  mixed, near_one, near_zero, moderate); beta [B,T,V]: "uniform" in [0, 1], "near_zero" in
  [0, 1e-4] (some exactly 0), "near_one" in [1 − 1e-4, 1] (some exactly 1), "two" uniform in
  [0, 2], "near_two" in [2 − 1e-4, 2] (some exactly 2)."""
  V, Hv = V or K, Hv or H
  q, k, v, g = random_linear_inputs(rng, B, T, N, K, H, decay)
  if (V, Hv) != (K, H):  # the default draws stay those of earlier versions
    v = rng.standard_normal((B, T, V, Hv))
    g = random_linear_inputs(rng, B, T, V, V, H, decay)[3]
  if not per_channel:
    g = g[..., 0]
  shape = (B, T, V)
  if beta in ("uniform", "two"):
    b = rng.uniform(0.0, 1.0 if beta == "uniform" else 2.0, shape)
  elif beta == "near_zero":
    b = np.where(rng.random(shape) < 0.2, 0.0, rng.uniform(0.0, 1e-4, shape))
  elif beta in ("near_one", "near_two"):
    top = 1.0 if beta == "near_one" else 2.0
    b = np.where(rng.random(shape) < 0.2, top, top - rng.uniform(0.0, 1e-4, shape))
  else:
    raise ValueError(beta)
  return q, k, v, g, b
