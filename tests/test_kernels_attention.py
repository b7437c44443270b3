"""hybrid_nope.kernels.attention against an independent float64 numpy reference."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from hybrid_nope.kernels import IMPLS, attention


def reference(q, k, v, window, segment_ids):
  """Loop-free float64 numpy attention written straight from the contract."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, T, N, H = q.shape
  K = k.shape[2]
  k = np.repeat(k, N // K, axis=2)  # query head n reads kv head n // (N/K)
  v = np.repeat(v, N // K, axis=2)
  logits = np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(H)
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
  return np.einsum("bnqk,bknh->bqnh", p, v)


def random_inputs(rng, B, T, N, K, H, dtype=jnp.float32):
  q = rng.standard_normal((B, T, N, H))
  k = rng.standard_normal((B, T, K, H))
  v = rng.standard_normal((B, T, K, H))
  return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def random_segments(rng, B, T):
  starts = rng.random((B, T)) < 0.1
  starts[:, 0] = True
  return jnp.asarray(np.cumsum(starts, axis=1), jnp.int32)


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("impl", [i for i in IMPLS if i != "auto"])
@pytest.mark.parametrize("T", [1, 17, 256, 1000])
@pytest.mark.parametrize("window", [1, 7, "T-1", "T", "2T", None])
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("segments", [False, True])
def test_forward_matches_reference(impl, T, window, gqa, segments):
  rng = np.random.default_rng()
  w = {"T-1": max(T - 1, 1), "T": T, "2T": 2 * T}.get(window, window)
  q, k, v = random_inputs(rng, 2, T, 4, 4 // gqa, 8)
  seg = random_segments(rng, 2, T) if segments else None
  out = attention(q, k, v, window=w, segment_ids=seg, impl=impl)
  assert out.shape == q.shape and out.dtype == q.dtype
  assert np.all(np.isfinite(out))
  assert rel_err(out, reference(q, k, v, w, seg)) <= 1e-5


@pytest.mark.parametrize("T, window", [(33, 5), (33, None), (300, 7), (300, 100)])
@pytest.mark.parametrize("gqa", [1, 4])
def test_gradients_match_reference(T, window, gqa):
  # T=300 with a small window takes the blocked sliding-window path (with tail padding).
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, 2, T, 4, 4 // gqa, 8)
  seg = random_segments(rng, 2, T)
  cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

  def loss(q, k, v):
    return jnp.sum(attention(q, k, v, window=window, segment_ids=seg) * cot)

  grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  # Central finite differences of the float64 reference along a random direction per input.
  eps = 1e-4
  for idx, g in enumerate(grads):
    direction = rng.standard_normal(g.shape)
    args = [np.asarray(a, np.float64) for a in (q, k, v)]
    plus, minus = list(args), list(args)
    plus[idx] = args[idx] + eps * direction
    minus[idx] = args[idx] - eps * direction
    cot64 = np.asarray(cot, np.float64)
    fd = (np.sum(reference(*plus, window, seg) * cot64)
          - np.sum(reference(*minus, window, seg) * cot64)) / (2 * eps)
    analytic = np.sum(np.asarray(g, np.float64) * direction)
    assert abs(analytic - fd) <= 1e-4 * max(1.0, abs(fd)), (idx, analytic, fd)


def test_auto_dispatches_to_a_correct_implementation():
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, 2, 256, 4, 2, 8)
  seg = random_segments(rng, 2, 256)
  for window in (7, None):
    out = attention(q, k, v, window=window, segment_ids=seg, impl="auto")
    assert rel_err(out, reference(q, k, v, window, seg)) <= 1e-5


def test_bfloat16_close_to_reference():
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, 2, 64, 4, 1, 16, jnp.bfloat16)
  seg = random_segments(rng, 2, 64)
  out = attention(q, k, v, window=16, segment_ids=seg)
  assert out.dtype == jnp.bfloat16
  assert rel_err(out, reference(q, k, v, 16, seg)) <= 2e-2


def test_window_one_is_identity_on_values():
  rng = np.random.default_rng(0)
  q, k, v = random_inputs(rng, 1, 10, 2, 2, 4)
  np.testing.assert_allclose(attention(q, k, v, window=1), v, rtol=1e-6)


@pytest.mark.parametrize("kwargs, name", [
    (dict(window=0), "window"),
    (dict(window=-3), "window"),
    (dict(segment_ids=jnp.zeros((2, 5), jnp.int32)), "segment_ids"),
    (dict(impl="magic"), "impl"),
])
def test_bad_arguments_name_themselves(kwargs, name):
  q, k, v = random_inputs(np.random.default_rng(0), 2, 8, 4, 2, 4)
  with pytest.raises(ValueError, match=name):
    attention(q, k, v, **kwargs)


def test_bad_head_counts_and_dtypes():
  rng = np.random.default_rng(0)
  q, k, v = random_inputs(rng, 1, 8, 4, 3, 4)
  with pytest.raises(ValueError, match="multiple of k/v heads"):
    attention(q, k, v)
  q, k, v = random_inputs(rng, 1, 8, 4, 2, 4)
  with pytest.raises(ValueError, match="dtypes"):
    attention(q, k.astype(jnp.bfloat16), v)
