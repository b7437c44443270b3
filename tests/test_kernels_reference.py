"""The float64 numpy attention every kernel test compares against, and a check of its gradients.

Written straight from the contract in DESIGN.md, loop-free and independent of hybrid_nope: the
forward is a masked softmax, the gradients the textbook softmax backward. The backward is
checked here against central finite differences of the forward, so the kernel tests can use
exact float64 gradients instead of noisy finite differences.
"""
import numpy as np
import jax.numpy as jnp


def reference(q, k, v, window, segment_ids, dout=None):
  """out [B,T,N,H] in float64, or (out, (dq, dk, dv)) when a cotangent `dout` is given."""
  # Heads-major [B, N, T, H] so every product is a BLAS matmul (np.einsum would loop in C).
  q, k, v = (np.asarray(a, np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
  B, N, T, H = q.shape
  K = k.shape[1]
  kr = np.repeat(k, N // K, axis=1)  # query head n reads kv head n // (N/K)
  vr = np.repeat(v, N // K, axis=1)
  logits = q @ kr.swapaxes(-1, -2) / np.sqrt(H)
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  allowed = j <= i
  if window is not None:
    allowed &= j > i - window
  allowed = np.broadcast_to(allowed, (B, T, T))
  if segment_ids is not None:
    seg = np.asarray(segment_ids)
    allowed = allowed & (seg[:, :, None] == seg[:, None, :])
  logits = np.where(allowed[:, None], logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  out = p @ vr
  to_btnh = lambda x: x.transpose(0, 2, 1, 3)
  if dout is None:
    return to_btnh(out)
  do = np.asarray(dout, np.float64).transpose(0, 2, 1, 3)
  dp = do @ vr.swapaxes(-1, -2)
  ds = p * (dp - np.sum(do * out, -1, keepdims=True))
  dq = ds @ kr / np.sqrt(H)
  dk = ds.swapaxes(-1, -2) @ q / np.sqrt(H)
  dv = p.swapaxes(-1, -2) @ do
  fold = lambda x: x.reshape(B, K, N // K, T, H).sum(2)  # GQA: a kv head sums its group.
  return to_btnh(out), (to_btnh(dq), to_btnh(fold(dk)), to_btnh(fold(dv)))


def random_inputs(rng, B, T, N, K, H, dtype=jnp.float32):
  q = rng.standard_normal((B, T, N, H))
  k = rng.standard_normal((B, T, K, H))
  v = rng.standard_normal((B, T, K, H))
  return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def random_segments(rng, B, T, rate=0.1):
  """Packed documents: a new segment starts at each position with probability `rate`."""
  starts = rng.random((B, T)) < rate
  starts[:, 0] = True
  return jnp.asarray(np.cumsum(starts, axis=1), jnp.int32)


def rel_err(a, b):
  """‖a − b‖ / ‖b‖, with ‖b‖ floored at an RMS of 0.1 (inputs are unit normal): the q, k
  gradients of rows that see only themselves are exactly 0, and there float32 rounding
  (~1e-7) can only be judged against the scale gradients normally have."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 0.1 * np.sqrt(b.size))


def test_reference_gradients_match_finite_differences():
  rng = np.random.default_rng()
  q, k, v = (np.asarray(a, np.float64) for a in random_inputs(rng, 2, 11, 4, 2, 3))
  seg = random_segments(rng, 2, 11, rate=0.3)
  dout = rng.standard_normal(q.shape)
  _, grads = reference(q, k, v, 4, seg, dout)
  eps = 1e-6
  for idx, g in enumerate(grads):
    direction = rng.standard_normal(g.shape)
    args = [q, k, v]
    plus, minus = list(args), list(args)
    plus[idx] = args[idx] + eps * direction
    minus[idx] = args[idx] - eps * direction
    fd = (np.sum(reference(*plus, 4, seg) * dout)
          - np.sum(reference(*minus, 4, seg) * dout)) / (2 * eps)
    assert abs(np.sum(g * direction) - fd) <= 1e-7 * max(1.0, abs(fd)), idx


def test_reference_masks_what_the_contract_says():
  # Window 2 with a segment break at 2: row 2 sees only itself, row 3 sees 2 and 3.
  q = np.zeros((1, 4, 1, 1))
  k = np.zeros((1, 4, 1, 1))
  v = np.arange(4.0).reshape(1, 4, 1, 1)
  out = reference(q, k, v, 2, np.array([[0, 0, 1, 1]]))
  np.testing.assert_allclose(out[0, :, 0, 0], [0.0, 0.5, 2.0, 2.5])
