# Tiers (pytest.ini): test_xla_matches_reference's grid of ten shapes (T up to 1000) costs ~55 s
# cold on 2 cores, so by cost it is integration, `make test-all` only; the chunked form against
# the reference on packed segments on and off chunk edges, extreme decays, prefill states and
# the sequential form stays in `make test`.
# test-all only: the chunked "xla" form matches the float64 recurrence across T (1 to 1000),
# GQA, decays, betas, per-head and per-channel gates and chunk sizes
# (test_xla_matches_reference); on identical keys with no decay
# (test_identical_keys_no_decay); in bfloat16 (test_bfloat16_close_to_reference);
# under jax_enable_x64 (test_xla_runs_under_x64). By cost (10-30 s cold each).
"""hybrid_nope.kernels.delta_attention (dispatch, argument checks, lowering), its "xla" chunked
form and delta_step, against the float64 recurrence of delta_reference.py on fresh random
inputs each run.

Relative error here is max|got − want| / max|want| per tensor (out, dq, dk, dv, dlog_decay,
dbeta). Every test draws a new seed and names it in its failure message; DELTA_TEST_SEED=<seed>
reruns with that one.
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from delta_reference import delta_reference, delta_reference_state, random_delta_inputs
from hybrid_nope import kernels
from hybrid_nope.kernels import delta_xla
from linear_reference import random_runs, rel_err, seeded_rng

dispatch = sys.modules["hybrid_nope.kernels.delta_attention"]
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU choices")


fresh_rng = functools.partial(seeded_rng, "DELTA_TEST_SEED")


def sequential_fn(q, k, v, g, beta, segment_ids=None):
  """delta_xla's one-token-at-a-time form, through the public reshapes of the gates."""
  g = g if g.ndim == 4 else g[..., None]
  return delta_xla.sequential(q, k, v, g, beta[..., None], segment_ids=segment_ids)


@functools.cache
def xla_fn(chunk):
  """delta_xla's chunked form at this chunk, through the public reshapes of the gates (one
  function per chunk, so that tests of equal shapes share compiled programs)."""
  def fn(q, k, v, g, beta, segment_ids=None):
    g = g if g.ndim == 4 else g[..., None]
    return delta_xla.delta_attention(q, k, v, g, beta[..., None], segment_ids=segment_ids,
                                     chunk=chunk)
  return fn


@functools.cache
def out_and_grads_fn(fn):
  """jit of (out, vjp(dout)) of fn; jit compiles once per shape, so tests of equal shapes
  (most below use B=2, T=64, N=4, K=2, H=8 with segments) share one program."""
  @jax.jit
  def out_and_grads(args, seg, dout):
    out, vjp = jax.vjp(lambda *a: fn(*a, segment_ids=seg), *args)
    return out, vjp(dout)
  return out_and_grads


def check(fn, T, gqa, segments, decay, *, beta="uniform", per_channel=False, same_keys=False,
          dtype=jnp.float32, tol=1e-5, B=2, N=4, H=8):
  """Forward and the five gradients of `fn` (one jitted program) against the reference.
  `segments`: False, True (random packed runs with padding) or an explicit [B, T] array;
  `same_keys`: every key of a row and head points the same way (the delta rule's hardest
  triangular systems)."""
  rng, seed = fresh_rng()
  args = list(random_delta_inputs(rng, B, T, N, N // gqa, H, decay, beta, per_channel))
  if same_keys:
    args[1] = args[1][:, :1] * rng.uniform(0.5, 2.0, (B, T, 1, 1))
  seg = segments if not isinstance(segments, bool) else (
      random_runs(rng, B, T) if segments else None)
  args = [jnp.asarray(a, dtype) for a in args]
  dout = jnp.asarray(rng.standard_normal(args[0].shape), dtype)
  seg_j = None if seg is None else jnp.asarray(seg, jnp.int32)
  out_and_grads = out_and_grads_fn(fn)
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


# Chunk boundaries fall inside segments: random runs start anywhere, T is rarely a multiple of
# the chunk, and test_segment_boundaries_off_and_on_chunk_edges puts boundaries just off (and
# on) chunk edges. (T, gqa, segments, decay, beta, per_channel, chunk); chunk None is the tuned
# delta_xla.CHUNK. The T = 64, gqa 2, chunk 16 cases share their programs with the tests below.
XLA_CASES = [
    (1, 4, True, "mixed", "uniform", False, None),
    (17, 1, True, "mixed", "uniform", True, 8),
    (17, 4, False, "near_one", "near_one", False, 4),
    (64, 2, True, "near_zero", "near_zero", True, 16),
    (64, 2, True, "near_one", "near_zero", False, 16),
    (64, 2, True, "moderate", "near_one", True, 16),
    (64, 2, True, "mixed", "near_one", False, 16),
    (100, 1, True, "mixed", "uniform", False, 64),
    (1000, 1, True, "mixed", "uniform", False, None),
    (1000, 4, True, "near_one", "near_one", True, None),
]


@pytest.mark.parametrize("T, gqa, segments, decay, beta, per_channel, chunk", XLA_CASES)
@pytest.mark.integration
def test_xla_matches_reference(T, gqa, segments, decay, beta, per_channel, chunk):
  # T = 1000: one batch row and H = 16 keep the float64 recurrence fast.
  kw = dict(B=1, H=16) if T == 1000 else {}
  check(xla_fn(chunk), T, gqa, segments, decay, beta=beta, per_channel=per_channel, **kw)


ONE_DOCUMENT = np.ones((2, 64), np.int32)


@pytest.mark.integration
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_identical_keys_no_decay(per_channel):
  # Each write erases a fraction β of the last along the one key direction: the triangular
  # systems are as far from the identity as they get (their inverses' entries do not shrink
  # along a chunk). β is uniform, not ~1: at β = 1 the true dlog_decay is all cancellation
  # (S_{t−1} (I − k kᵀ) = 0), beyond float32 even for the sequential form.
  check(xla_fn(16), 64, 2, ONE_DOCUMENT, "near_one", per_channel=per_channel, same_keys=True)


# Runs ending at 15, 16 (a chunk edge of 16), 17, 31, 33, 34 (length 1), padding inside and at
# the end, and id 2 again after id 3.
PACKED = np.tile(np.repeat([1, 2, 3, 2, 3, 1, 0, 2, 0], [15, 1, 1, 14, 2, 1, 6, 20, 4]),
                 (2, 1)).astype(np.int32)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_segment_boundaries_off_and_on_chunk_edges(per_channel):
  check(xla_fn(16), 64, 2, PACKED, "mixed", per_channel=per_channel)


@pytest.mark.integration
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_bfloat16_close_to_reference(per_channel):
  check(xla_fn(16), 64, 2, True, "moderate", per_channel=per_channel, dtype=jnp.bfloat16,
        tol=2e-2)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_extreme_decays_and_padding_rows_stay_finite(per_channel):
  # Decay exactly 0 (-inf), ~0 or exactly 1 everywhere; row 1 is all padding: zeros, no NaN.
  rng, seed = fresh_rng()
  q, k, v, g, beta = (jnp.asarray(a, jnp.float32) for a in random_delta_inputs(
      rng, 2, 64, 4, 2, 8, per_channel=per_channel))
  seg = ONE_DOCUMENT * np.array([[1], [0]], np.int32)
  for log_decay in (-1e4, -80.0, -np.inf, 0.0):
    g = jnp.full(g.shape, log_decay, jnp.float32)
    dout = jnp.ones(q.shape)
    out, grads = out_and_grads_fn(xla_fn(16))((q, k, v, g, beta), jnp.asarray(seg), dout)
    ref_out, ref_grads = delta_reference(q, k, v, g, beta, seg, dout=dout)
    for got, want in zip((out, *grads), (ref_out, *ref_grads)):
      assert np.all(np.isfinite(got)), (log_decay, seed)
      np.testing.assert_array_equal(got[1], 0.0)
      assert rel_err(got, want) <= 1e-5, (log_decay, seed)


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


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_prefill_state_is_the_reference_state_after_the_last_token(per_channel):
  # T = 75, not a multiple of the chunk. Row 0: packed runs with padding, the last run
  # starting mid-chunk; the state is that run's alone (reset at its start). Row 1: a
  # left-padded prompt, as generation lays prompts out.
  rng, seed = fresh_rng()
  B, T, N, K, H = 2, 75, 4, 2, 8
  q, k, v, g, beta = random_delta_inputs(rng, B, T, N, K, H, "mixed", "uniform", per_channel)
  seg = np.zeros((B, T), np.int32)
  seg[0] = random_runs(rng, 1, T, rate=0.08)[0]
  seg[0, -11:] = 7
  seg[1, 20:] = 1
  want = delta_reference_state(q, k, v, g, beta, seg)
  got = kernels.delta_prefill(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta)),
                              segment_ids=jnp.asarray(seg))
  assert got.shape == (B, K, H, H) and got.dtype == jnp.float32
  assert rel_err(got, want) <= 1e-5, (per_channel, seed)


def test_backward_keeps_only_inputs_and_chunk_states():
  # The step is rematerialised: what the forward saves for the backward is the inputs and the
  # state entering each chunk (one [H, H] per chunk and kv head), not every chunk's terms.
  B, T, N, K, H, C = 1, 512, 4, 2, 32, 32
  rng, _ = fresh_rng()
  args = [jnp.asarray(a, jnp.float32) for a in random_delta_inputs(rng, B, T, N, K, H)]
  residuals = jax.make_jaxpr(lambda *a: jax.tree.leaves(jax.vjp(xla_fn(C), *a)[1]))(*args)
  saved = sum(np.prod(x.shape) * x.dtype.itemsize for x in residuals.out_avals)
  print(f"saved {saved} bytes; inputs {sum(x.nbytes for x in args)}")
  inputs, states = sum(x.nbytes for x in args), (T // C) * B * K * H * H * 4
  assert saved <= 2 * (inputs + states), (saved, inputs, states)


@on_cpu
def test_dispatch_runs_xla_on_cpu():
  rng, seed = fresh_rng()
  args = [jnp.asarray(a, jnp.float32) for a in random_delta_inputs(rng, 2, 50, 4, 2, 8)]
  seg = random_runs(rng, 2, 50)
  assert dispatch.resolve("auto") == "xla" and dispatch.available_impls() == ("xla",)
  assert kernels.DELTA_IMPLS == ("auto", "xla")
  want = delta_reference(*args, seg)
  for impl in ("auto", "xla"):
    out = jax.jit(lambda *a: kernels.delta_attention(*a, segment_ids=jnp.asarray(seg),
                                                     impl=impl))(*args)
    assert rel_err(out, want) <= 1e-5, seed
  for platform in ("tpu", "cuda"):
    with kernels.target_platform(platform):
      assert dispatch.resolve("auto") == "xla"


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_one_function_lowers_for_each_platform(platform):
  from jax import export
  q, k = jnp.zeros((1, 256, 4, 64)), jnp.zeros((1, 256, 2, 64))
  g, beta = -jnp.ones((1, 256, 2)), jnp.ones((1, 256, 2)) / 2
  seg = jnp.ones((1, 256), jnp.int32)
  grad = jax.jit(jax.grad(lambda *a: kernels.delta_attention(*a, segment_ids=seg).sum(),
                          argnums=(0, 1, 2, 3, 4)))
  with kernels.target_platform(platform):
    exported = export.export(grad, platforms=[platform])(q, k, k, g, beta)
  assert exported.platforms == (platform,)


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


@pytest.mark.integration
def test_xla_runs_under_x64():
  with jax.enable_x64(True):
    check(xla_fn(8), 30, 2, True, "mixed")
