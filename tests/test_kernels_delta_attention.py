"""hybrid_nope.kernels.delta_attention (dispatch, argument checks, lowering), its "xla" chunked
form and delta_step, against the float64 recurrence of delta_reference.py on fresh random
inputs each run.

Relative error here is max|got − want| / max|want| per tensor (out, dq, dk, dv, dlog_decay,
dbeta). Every test draws a new seed and names it in its failure message; DELTA_TEST_SEED=<seed>
reruns with that one.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from delta_reference import delta_reference, random_delta_inputs
from hybrid_nope import kernels
from hybrid_nope.kernels import delta_xla
from linear_reference import random_runs, rel_err

dispatch = sys.modules["hybrid_nope.kernels.delta_attention"]


def fresh_rng():
  seed = int(os.environ.get("DELTA_TEST_SEED", np.random.SeedSequence().entropy % 2**63))
  print(f"seed {seed}")
  return np.random.default_rng(seed), seed


def sequential_fn(q, k, v, g, beta, segment_ids=None):
  """delta_xla's one-token-at-a-time form, through the public reshapes of the gates."""
  g = g if g.ndim == 4 else g[..., None]
  return delta_xla.sequential(q, k, v, g, beta[..., None], segment_ids=segment_ids)


def check(fn, T, gqa, segments, decay, *, beta="uniform", per_channel=False,
          dtype=jnp.float32, tol=1e-5, B=2, N=4, H=8):
  """Forward and the five gradients of `fn` (one jitted program) against the reference.
  `segments`: False, True (random packed runs with padding) or an explicit [B, T] array."""
  rng, seed = fresh_rng()
  args = random_delta_inputs(rng, B, T, N, N // gqa, H, decay, beta, per_channel)
  seg = segments if not isinstance(segments, bool) else (
      random_runs(rng, B, T) if segments else None)
  args = [jnp.asarray(a, dtype) for a in args]
  dout = jnp.asarray(rng.standard_normal(args[0].shape), dtype)
  seg_j = None if seg is None else jnp.asarray(seg, jnp.int32)

  @jax.jit
  def out_and_grads(args, seg, dout):
    out, vjp = jax.vjp(lambda *a: fn(*a, segment_ids=seg), *args)
    return out, vjp(dout)

  out, grads = out_and_grads(args, seg_j, dout)
  # The reference sees exactly the (rounded) inputs the kernel saw.
  ref_out, ref_grads = delta_reference(*args, seg, dout=dout)
  assert out.shape == args[0].shape and out.dtype == dtype
  names = ("out", "dq", "dk", "dv", "dlog_decay", "dbeta")
  pairs = list(zip(names, (out, *grads), (ref_out, *ref_grads)))
  assert all(got.dtype == dtype and got.shape == want.shape for _, got, want in pairs)
  assert all(np.isfinite(np.asarray(got, np.float32)).all() for _, got, _ in pairs), seed
  errors = {name: rel_err(got, want) for name, got, want in pairs}
  print(" ".join(f"{n} {e:.1e}" for n, e in errors.items()))
  assert max(errors.values()) <= tol, (errors, f"seed {seed}")


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_sequential_matches_reference(per_channel):
  check(sequential_fn, 37, 2, True, "mixed", per_channel=per_channel)


def test_reference_gradients_match_finite_differences():
  rng, seed = fresh_rng()
  seg = np.array([[1, 1, 1, 2, 2, 0, 0, 2, 2, 2, 2], [0, 3, 3, 3, 3, 3, 1, 1, 0, 1, 1]])
  for per_channel in (False, True):
    inputs = list(random_delta_inputs(rng, 2, 11, 4, 2, 3, "moderate", "uniform", per_channel))
    dout = rng.standard_normal(inputs[0].shape)
    _, grads = delta_reference(*inputs, seg, dout=dout)
    eps = 1e-6
    for idx, grad in enumerate(grads):
      direction = rng.standard_normal(grad.shape)
      plus, minus = list(inputs), list(inputs)
      plus[idx] = plus[idx] + eps * direction
      minus[idx] = minus[idx] - eps * direction
      fd = (np.sum(delta_reference(*plus, seg) * dout)
            - np.sum(delta_reference(*minus, seg) * dout)) / (2 * eps)
      assert abs(np.sum(grad * direction) - fd) <= 1e-7 * max(1.0, abs(fd)), (
          per_channel, idx, seed)


def test_reference_follows_the_contract():
  # H = 1, q = k = 1 (unit up to the 1e-6 eps), α = 1/2, β = 1/2: S_t = S_{t-1}/4 + v_t/2; a
  # run starts at 3, padding at 5.
  v = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).reshape(1, 7, 1, 1)
  ones = np.ones_like(v)
  half = np.full((1, 7, 1), 0.5)
  out = delta_reference(ones, ones, v, np.log(half), half, np.array([[1, 1, 1, 2, 2, 0, 2]]))
  np.testing.assert_allclose(out[0, :, 0, 0], [0.5, 1.125, 1.78125, 2.0, 3.0, 0.0, 3.5],
                             rtol=1e-5)


def test_step_matches_reference():
  # delta_step applied token by token is the reference without segments.
  rng, seed = fresh_rng()
  for per_channel in (False, True):
    q, k, v, g, beta = random_delta_inputs(rng, 2, 9, 4, 2, 8, "mixed", "uniform", per_channel)
    want = delta_reference(q, k, v, g, beta)
    state = jnp.zeros((2, 2, 8, 8))
    step = jax.jit(kernels.delta_step)
    for t in range(9):
      state, out = step(state, *(jnp.asarray(x[:, t], jnp.float32) for x in (q, k, v, g, beta)))
      assert out.dtype == jnp.float32 and state.dtype == jnp.float32
      assert rel_err(out, want[:, t]) <= 1e-5, (per_channel, t, seed)


@pytest.mark.parametrize("kwargs, name", [
    (dict(impl="magic"), "impl"),
    (dict(segment_ids=jnp.zeros((2, 5), jnp.int32)), "segment_ids"),
    (dict(segment_ids=jnp.zeros((2, 8), jnp.float32)), "segment_ids"),
    (dict(log_decay=jnp.zeros((2, 8, 4))), r"log_decay shape \(2, 8, 4\): expected .* \(2, 8, 2\)"),
    (dict(log_decay=jnp.zeros((2, 8, 2, 3))), r"log_decay shape .* \(2, 8, 2, 4\)"),
    (dict(log_decay=jnp.zeros((2, 8, 2), jnp.int32)), "log_decay dtype"),
    (dict(beta=jnp.zeros((2, 8, 2, 4))), r"beta shape \(2, 8, 2, 4\): expected .* \(2, 8, 2\)"),
    (dict(beta=jnp.zeros((2, 8, 2), jnp.int32)), "beta dtype"),
])
def test_bad_arguments_name_themselves(kwargs, name):
  q = jnp.zeros((2, 8, 4, 4))
  k = v = jnp.zeros((2, 8, 2, 4))
  g = kwargs.pop("log_decay", jnp.zeros((2, 8, 2)))
  beta = kwargs.pop("beta", jnp.zeros((2, 8, 2)))
  with pytest.raises(ValueError, match=name):
    kernels.delta_attention(q, k, v, g, beta, **kwargs)


def test_bad_heads_and_step_arguments():
  q, k = jnp.zeros((1, 8, 4, 4)), jnp.zeros((1, 8, 3, 4))
  g = jnp.zeros((1, 8, 3))
  with pytest.raises(ValueError, match="q heads N=4 must be a multiple of k/v heads K=3"):
    kernels.delta_attention(q, k, k, g, g)
  with pytest.raises(ValueError, match=r"state shape \(1, 2, 4, 3\): expected .* \(1, 2, 4, 4\)"):
    kernels.delta_step(jnp.zeros((1, 2, 4, 3)), jnp.zeros((1, 4, 4)), jnp.zeros((1, 2, 4)),
                       jnp.zeros((1, 2, 4)), jnp.zeros((1, 2)), jnp.zeros((1, 2)))
  with pytest.raises(ValueError, match=r"beta shape \(1, 2, 1\): expected \[batch, kv heads\]"):
    kernels.delta_step(jnp.zeros((1, 2, 4, 4)), jnp.zeros((1, 4, 4)), jnp.zeros((1, 2, 4)),
                       jnp.zeros((1, 2, 4)), jnp.zeros((1, 2)), jnp.zeros((1, 2, 1)))
