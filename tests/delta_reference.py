"""The float64 gated delta rule every delta kernel test compares against.

Written straight from the contract in DESIGN.md and independent of hybrid_nope: per (batch row,
kv head) a sequential recurrence over time with the explicit [H, H] matrices,
  S_t = S_{t-1} · diag(exp(log_decay_t)) · (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
q and k divided by sqrt(Σx² + 1e-6) per head, S_{t-1} = 0 where a run of equal nonzero segment
ids starts, and 0 output on padding (segment 0), which leaves the state alone. It runs in JAX
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
  """float64 arrays; g [B,T,K] or [B,T,K,H]; reset, valid bool [B,T]."""
  return _forward_and_state(q, k, v, g, beta, reset, valid)[0]


def _forward_and_state(q, k, v, g, beta, reset, valid):
  """(out, the state S [B, K, H value, H key] after the last token)."""
  B, T, N, H = q.shape
  K = k.shape[2]
  q = _normalise(q).reshape(B, T, K, N // K, H)
  k = _normalise(k)
  g = g if g.ndim == 4 else jnp.broadcast_to(g[..., None], k.shape)
  eye = jnp.eye(H, dtype=q.dtype)

  def body(S, xs):  # S [B, K, H value, H key]
    q, k, v, g, beta, reset, valid = xs
    S = jnp.where(reset[:, None, None, None], 0.0, S)
    erase = eye - beta[..., None, None] * k[..., :, None] * k[..., None, :]
    decay = jnp.exp(g)[..., :, None] * eye  # diag(α_t)
    new = S @ decay @ erase + beta[..., None, None] * v[..., :, None] * k[..., None, :]
    S = jnp.where(valid[:, None, None, None], new, S)
    out = jnp.einsum("bkvd,bkgd->bkgv", S, q) * valid[:, None, None, None]
    return S, out

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  S, out = jax.lax.scan(body, jnp.zeros((B, K, H, H), q.dtype),
                        tuple(map(time_major, (q, k, v, g, beta, reset, valid))))
  return jnp.moveaxis(out, 0, 1).reshape(B, T, N, H), S


_forward_jit = jax.jit(_forward)


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
  """out [B,T,N,H] float64 numpy, or (out, (dq, dk, dv, dlog_decay, dbeta)) given `dout`."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, log_decay, beta)]
    B, T = args[0].shape[:2]
    masks = [jnp.asarray(m) for m in _runs(segment_ids, B, T)]
    if dout is None:
      return np.asarray(_forward_jit(*args, *masks))
    out, grads = _out_and_grads(args, masks, jnp.asarray(np.asarray(dout, np.float64)))
    return np.asarray(out), tuple(np.asarray(x) for x in grads)


def delta_reference_state(q, k, v, log_decay, beta, segment_ids=None):
  """The state S [B, K, H value, H key] after the last token, float64 numpy."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, log_decay, beta)]
    B, T = args[0].shape[:2]
    masks = [jnp.asarray(m) for m in _runs(segment_ids, B, T)]
    return np.asarray(jax.jit(_forward_and_state)(*args, *masks)[1])


def random_delta_inputs(rng, B, T, N, K, H, decay="mixed", beta="uniform", per_channel=False):
  """q, k, v unit normal; log_decay [B,T,K,H] if per_channel else [B,T,K], drawn as in
  random_linear_inputs (`decay`: mixed, near_one, near_zero, moderate); beta [B,T,K]:
  "uniform" in [0, 1], "near_zero" in [0, 1e-4] (some exactly 0), "near_one" in [1 − 1e-4, 1]
  (some exactly 1)."""
  q, k, v, g = random_linear_inputs(rng, B, T, N, K, H, decay)
  if not per_channel:
    g = g[..., 0]
  shape = (B, T, K)
  if beta == "uniform":
    b = rng.uniform(0.0, 1.0, shape)
  elif beta == "near_zero":
    b = np.where(rng.random(shape) < 0.2, 0.0, rng.uniform(0.0, 1e-4, shape))
  elif beta == "near_one":
    b = np.where(rng.random(shape) < 0.2, 1.0, 1.0 - rng.uniform(0.0, 1e-4, shape))
  else:
    raise ValueError(beta)
  return q, k, v, g, b
