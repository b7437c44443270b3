# Tiers (pytest.ini): test_pallas_interpret_matches_reference's grid in interpret mode (slow; ~17 s
# cold on 2 cores) is integration by cost, `make test-all` only; the Pallas kernel's segment
# boundaries, bfloat16 and extreme decays stay in `make test`.
# test-all only: the Pallas GLA kernel in interpret mode matches the float64 recurrence across
# T, GQA, segments, decays and chunks (test_pallas_interpret_matches_reference); the xla form
# under jax_enable_x64 (test_xla_runs_under_x64).
"""hybrid_nope.kernels.linear_attention (dispatch, argument checks, lowering) and its "xla" and
"pallas" (interpret mode) implementations, against the float64 recurrence of linear_reference.py
on fresh random inputs each run.

Relative error here is max|got − want| / max|want| per tensor (out, dq, dk, dv, dlog_decay).
Every test draws a new seed and names it in its failure message; LINEAR_TEST_SEED=<seed>
reruns with that one.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope import kernels
from hybrid_nope.kernels import dispatch as kernel_dispatch
from hybrid_nope.kernels import linear_pallas, linear_xla
from linear_reference import (linear_reference, random_linear_inputs, random_runs, rel_err,
                              seeded_rng)

on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU choices")


fresh_rng = functools.partial(seeded_rng, "LINEAR_TEST_SEED")


def xla_fn(chunk):
  return lambda q, k, v, g, **kw: linear_xla.linear_attention(q, k, v, g, chunk=chunk, **kw)


def pallas_fn(chunk):
  return lambda q, k, v, g, **kw: linear_pallas.linear_attention(q, k, v, g, chunk=chunk,
                                                                 interpret=True, **kw)


def check(fn, T, gqa, segments, decay, *, dtype=jnp.float32, tol=1e-5, B=2, N=4, H=8):
  """Forward and the four gradients of `fn` (one jitted program) against the reference.
  `segments`: False, True (random packed runs with padding) or an explicit [B, T] array."""
  rng, seed = fresh_rng()
  q, k, v, g = random_linear_inputs(rng, B, T, N, N // gqa, H, decay)
  seg = segments if not isinstance(segments, bool) else (
      random_runs(rng, B, T) if segments else None)
  args = [jnp.asarray(a, dtype) for a in (q, k, v, g)]
  dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
  seg_j = None if seg is None else jnp.asarray(seg, jnp.int32)

  @jax.jit
  def out_and_grads(q, k, v, g, seg, dout):
    out, vjp = jax.vjp(lambda q, k, v, g: fn(q, k, v, g, segment_ids=seg), q, k, v, g)
    return out, vjp(dout)

  out, grads = out_and_grads(*args, seg_j, dout)
  # The reference sees exactly the (rounded) inputs the kernel saw.
  ref_out, ref_grads = linear_reference(*(np.asarray(a, np.float64) for a in args), seg,
                                        dout=np.asarray(dout, np.float64))
  assert out.shape == q.shape and out.dtype == dtype
  errors = {}
  for name, got, want in zip(("out", "dq", "dk", "dv", "dlog_decay"), (out, *grads),
                             (ref_out, *ref_grads)):
    assert got.dtype == dtype and got.shape == want.shape, name
    assert np.all(np.isfinite(np.asarray(got, np.float32))), (name, seed)
    errors[name] = rel_err(got, want)
  print(" ".join(f"{n} {e:.1e}" for n, e in errors.items()))
  assert max(errors.values()) <= tol, (errors, f"seed {seed}")


# Chunk boundaries fall inside segments: random runs start anywhere, T is rarely a multiple of
# the chunk, and PACKED below puts boundaries just off (and once exactly on) chunk edges.
# (T, gqa, segments, decay, chunk); chunk None is the tuned linear_xla.CHUNK (32).
XLA_CASES = [
    (1, 4, True, "mixed", None),
    (17, 1, True, "mixed", 8),
    (17, 4, False, "near_one", 2),
    (64, 4, False, "moderate", 16),
    (64, 1, True, "near_zero", 16),
    (64, 4, True, "near_one", 16),
    (1000, 1, True, "mixed", None),
    (1000, 4, False, "near_one", None),
]


@pytest.mark.parametrize("T, gqa, segments, decay, chunk", XLA_CASES)
def test_xla_matches_reference(T, gqa, segments, decay, chunk):
  # T = 1000: one batch row and H = 16 keep the float64 recurrence fast.
  kw = dict(B=1, H=16) if T == 1000 else {}
  check(xla_fn(chunk), T, gqa, segments, decay, **kw)


def packed(B, T):
  """Runs ending at 5, 63, 64 (a chunk edge of 16 and 64), 70, 71 (length 1), padding inside
  and at the end, and id 2 again after id 3."""
  seg = np.zeros((B, T), np.int32)
  for start, end, i in [(0, 5, 1), (5, 63, 2), (63, 64, 3), (64, 70, 2), (70, 71, 3),
                        (71, 90, 2), (100, 130, 1)]:
    seg[:, start:end] = i
  return seg


def test_xla_segment_boundaries_off_and_on_chunk_edges():
  check(xla_fn(16), 140, 4, packed(2, 140), "mixed")
  check(xla_fn(64), 140, 1, packed(2, 140), "moderate")


PALLAS_CASES = [
    (17, 4, True, "mixed", 8),
    (64, 1, True, "near_zero", 16),
    (64, 4, False, "near_one", 16),
    (1000, 4, True, "mixed", 64),
]


@pytest.mark.parametrize("T, gqa, segments, decay, chunk", PALLAS_CASES)
@pytest.mark.integration
def test_pallas_interpret_matches_reference(T, gqa, segments, decay, chunk):
  kw = dict(B=1, H=16) if T == 1000 else {}
  check(pallas_fn(chunk), T, gqa, segments, decay, **kw)


def test_pallas_interpret_segment_boundaries():
  check(pallas_fn(16), 140, 4, packed(2, 140), "mixed", B=2)


@pytest.mark.parametrize("fn", [xla_fn(16), pallas_fn(16)], ids=["xla", "pallas"])
def test_bfloat16_close_to_reference(fn):
  check(fn, 100, 4, True, "moderate", dtype=jnp.bfloat16, tol=2e-2)


@pytest.mark.parametrize("log_decay", [-1e4, -80.0, -jnp.inf, 0.0])
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_extreme_decays_and_padding_rows_stay_finite(log_decay, impl):
  # Decay exactly 0 (-inf), ~0 or exactly 1 everywhere; row 1 is all padding: zeros, no NaN.
  rng, seed = fresh_rng()
  q, k, v, _ = random_linear_inputs(rng, 2, 40, 4, 2, 8)
  q, k, v = (jnp.asarray(a, jnp.float32) for a in (q, k, v))
  g = jnp.full(k.shape, log_decay, jnp.float32)
  seg = jnp.asarray(np.stack([np.ones(40), np.zeros(40)]), jnp.int32)
  fn = (xla_fn(16) if impl == "xla" else pallas_fn(16))
  out, vjp = jax.vjp(jax.jit(lambda q, k, v, g: fn(q, k, v, g, segment_ids=seg)), q, k, v, g)
  grads = vjp(jnp.ones_like(out))
  for x in (out, *grads):
    assert np.all(np.isfinite(x)), seed
    np.testing.assert_array_equal(x[1], 0.0)
  if np.isfinite(log_decay):  # the reference's exp(-inf) * 0 would be its own NaN
    ref_out, ref_grads = linear_reference(q, k, v, g, seg, dout=np.ones(out.shape))
    for got, want in zip((out, *grads), (ref_out, *ref_grads)):
      assert rel_err(got, want) <= 1e-5, seed


def test_reference_gradients_match_finite_differences():
  rng, seed = fresh_rng()
  q, k, v, g = random_linear_inputs(rng, 2, 11, 4, 2, 3, "moderate")
  seg = np.array([[1, 1, 1, 2, 2, 0, 0, 2, 2, 2, 2], [0, 3, 3, 3, 3, 3, 1, 1, 0, 1, 1]])
  dout = rng.standard_normal(q.shape)
  _, grads = linear_reference(q, k, v, g, seg, dout)
  eps = 1e-6
  for idx, grad in enumerate(grads):
    direction = rng.standard_normal(grad.shape)
    plus, minus = [q, k, v, g], [q, k, v, g]
    plus[idx] = plus[idx] + eps * direction
    minus[idx] = minus[idx] - eps * direction
    fd = (np.sum(linear_reference(*plus, seg) * dout)
          - np.sum(linear_reference(*minus, seg) * dout)) / (2 * eps)
    assert abs(np.sum(grad * direction) - fd) <= 1e-7 * max(1.0, abs(fd)), (idx, seed)


def test_reference_follows_the_contract():
  # H = 1, q = k = 1, decay 1/2: S_t = S_{t-1} / 2 + v_t; a run starts at 3, padding at 5.
  v = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).reshape(1, 7, 1, 1)
  ones = np.ones_like(v)
  out = linear_reference(ones, ones, v, np.log(0.5) * ones, np.array([[1, 1, 1, 2, 2, 0, 2]]))
  np.testing.assert_allclose(out[0, :, 0, 0], [1.0, 2.5, 4.25, 4.0, 7.0, 0.0, 7.0])


@on_cpu
def test_dispatch_runs_xla_on_cpu():
  rng, seed = fresh_rng()
  q, k, v, g = (jnp.asarray(a, jnp.float32) for a in random_linear_inputs(rng, 2, 50, 4, 1, 8))
  seg = jnp.asarray(random_runs(rng, 2, 50))
  assert kernel_dispatch.resolve("linear_attention", "auto") == "xla"
  assert kernel_dispatch.available_impls("linear_attention") == ("xla",)
  for impl in ("auto", "xla"):
    out = jax.jit(lambda *a: kernels.linear_attention(*a, segment_ids=seg, impl=impl))(q, k, v, g)
    assert rel_err(out, linear_reference(q, k, v, g, seg)) <= 1e-5, seed
  assert kernels.LINEAR_IMPLS == ("auto", "xla", "pallas")
  with kernels.target_platform("tpu"):
    assert kernel_dispatch.resolve("linear_attention", "pallas") == "pallas"
    assert kernel_dispatch.resolve("linear_attention", "auto") == "xla"
  with pytest.raises(ValueError, match=r"impl='pallas'.*Available: \('xla',\)"):
    kernels.linear_attention(q, k, v, g, impl="pallas")


# "auto" on every platform; "pallas" where its kernel exists (TPU here, CUDA in
# test_kernels_linear_pallas_gpu.py; elsewhere it raises, as test_dispatch_runs_xla_on_cpu checks).
@pytest.mark.parametrize("platform, impl", [("cpu", "auto"), ("tpu", "auto"), ("cuda", "auto"),
                                            ("tpu", "pallas")])
def test_one_function_lowers_for_each_platform(platform, impl):
  from jax import export
  q = jnp.zeros((1, 256, 4, 64))
  k, g = jnp.zeros((1, 256, 2, 64)), -jnp.ones((1, 256, 2, 64))
  seg = jnp.ones((1, 256), jnp.int32)
  grad = jax.jit(jax.grad(lambda q, k, v, g: kernels.linear_attention(
      q, k, v, g, segment_ids=seg, impl=impl).sum(), argnums=(0, 1, 2, 3)))
  with kernels.target_platform(platform):
    exported = export.export(grad, platforms=[platform], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("tpu_custom_call")])(q, k, k, g)
  text = exported.mlir_module()
  # "auto" is XLA everywhere today (dispatch.TABLE's `auto` is empty for it).
  assert ("gla_chunk_fwd" in text) == (impl == "pallas")
  assert ("custom_call @tpu_custom_call" in text) == (impl == "pallas")


@pytest.mark.parametrize("kwargs, name", [
    (dict(impl="magic"), "impl"),
    (dict(segment_ids=jnp.zeros((2, 5), jnp.int32)), "segment_ids"),
    (dict(segment_ids=jnp.zeros((2, 8), jnp.float32)), "segment_ids"),
    (dict(log_decay=jnp.zeros((2, 8, 4, 4))), "log_decay shape"),
    (dict(log_decay=jnp.zeros((2, 8, 2, 4), jnp.int32)), "log_decay dtype"),
])
def test_bad_arguments_name_themselves(kwargs, name):
  q = jnp.zeros((2, 8, 4, 4))
  k = v = jnp.zeros((2, 8, 2, 4))
  g = kwargs.pop("log_decay", jnp.zeros((2, 8, 2, 4)))
  with pytest.raises(ValueError, match=name):
    kernels.linear_attention(q, k, v, g, **kwargs)


def test_bad_heads_shapes_dtypes_and_chunks():
  q, k = jnp.zeros((1, 8, 4, 4)), jnp.zeros((1, 8, 3, 4))
  with pytest.raises(ValueError, match="q heads N=4 must be a multiple of k/v heads K=3"):
    kernels.linear_attention(q, k, k, k)
  k = jnp.zeros((1, 8, 2, 4))
  with pytest.raises(ValueError, match="dtypes"):
    kernels.linear_attention(q, k.astype(jnp.bfloat16), k, k)
  with pytest.raises(ValueError, match="rank 4"):
    kernels.linear_attention(q[0], k, k, k)
  with pytest.raises(ValueError, match="chunk=12"):
    linear_xla.linear_attention(q, k, k, k, chunk=12)
  with pytest.raises(ValueError, match="chunk=4"):
    linear_pallas.linear_attention(q, k, k, k, chunk=4, interpret=True)


@pytest.mark.integration
def test_xla_runs_under_x64():
  with jax.enable_x64(True):
    check(xla_fn(8), 30, 2, True, "mixed")
