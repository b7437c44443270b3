"""hybrid_nope.kernels.attention (dispatch, argument checks) and the "xla" implementation,
against the float64 reference on fresh random inputs each run."""
import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope import kernels
from hybrid_nope.kernels import xla
from test_kernels_reference import random_inputs, random_segments, reference, rel_err

# The module (the package re-exports its function under the same name).
dispatch = sys.modules["hybrid_nope.kernels.attention"]
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU choices")


def windows_for(T):
  """The issue's windows {1, 7, 64, T-1, T, 2T, None}, deduplicated for tiny T."""
  return sorted({1, 7, 64, max(T - 1, 1), T, 2 * T}) + [None]


def check_against_reference(fn, T, window, gqa, segments, *, dtype=jnp.float32, tol=1e-5, B=2,
                            N=4, H=8):
  """Forward and dq, dk, dv of `fn` (jitted as one program) against the float64 reference."""
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, B, T, N, N // gqa, H, dtype)
  seg = random_segments(rng, B, T) if segments else None
  dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

  @jax.jit
  def out_and_grads(q, k, v, seg, dout):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, window=window, segment_ids=seg), q, k, v)
    return out, vjp(dout)

  out, grads = out_and_grads(q, k, v, seg, dout)
  ref_out, ref_grads = reference(q, k, v, window, seg, dout)
  assert out.shape == q.shape and out.dtype == q.dtype
  for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref_grads)):
    assert got.dtype == dtype, name
    assert np.all(np.isfinite(np.asarray(got, np.float32))), name
    assert rel_err(got, want) <= tol, (name, rel_err(got, want))


# Every (T, window) of the grid, alternating the two main (GQA, segments) pairings; at
# T = 256 both pairings for every window, and the two other pairings for three of them.
PAIRINGS = ((1, False), (4, True))
XLA_CASES = [(T, w, *PAIRINGS[n % 2])
             for T in (1, 17, 1000) for n, w in enumerate(windows_for(T))]
XLA_CASES += [(256, w, gqa, seg) for w in windows_for(256) for gqa, seg in PAIRINGS]
XLA_CASES += [(256, w, gqa, seg) for w in (7, 64, None) for gqa, seg in ((1, True), (4, False))]


@pytest.mark.parametrize("T, window, gqa, segments", XLA_CASES)
def test_xla_matches_reference(T, window, gqa, segments):
  # One batch row at T = 1000 halves the O(T²) reference; T = 256 covers per-row segments.
  check_against_reference(xla.attention, T, window, gqa, segments, B=1 if T == 1000 else 2)


@pytest.mark.parametrize("block_q, chunk_k", [(16, 16), (16, 48)])
@pytest.mark.parametrize("T, window", [(300, None), (300, 40), (300, 7)])
def test_xla_multi_chunk_tiling_matches_reference(block_q, chunk_k, T, window):
  # Small tiles force the online-softmax path over many key chunks (the tuned tiling reaches
  # it only for global attention and windows over ~2k) and ragged tails.
  fn = lambda q, k, v, **kw: xla.attention(q, k, v, block_q=block_q, chunk_k=chunk_k, **kw)
  check_against_reference(fn, T, window, 2, True)


def test_xla_bfloat16_close_to_reference():
  check_against_reference(xla.attention, 200, 16, 4, True, dtype=jnp.bfloat16, tol=2e-2)
  check_against_reference(xla.attention, 200, None, 1, True, dtype=jnp.bfloat16, tol=2e-2)


@pytest.mark.parametrize("window", [1, None])
def test_rows_that_see_only_themselves_are_exact_and_finite(window):
  # Every token its own segment (or window 1): each row's only key is itself, so out = v of
  # its kv head, and the gradients must stay finite (no 0/0 from an empty softmax).
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, 2, 70, 4, 2, 8)
  seg = None if window == 1 else jnp.arange(70)[None].repeat(2, 0)

  @jax.jit
  def out_and_grads(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: kernels.attention(q, k, v, window=window,
                                                         segment_ids=seg), q, k, v)
    return out, vjp(jnp.ones_like(out))

  out, grads = out_and_grads(q, k, v)
  np.testing.assert_allclose(out, jnp.repeat(v, 2, axis=2), rtol=1e-6, atol=1e-6)
  for g in grads:
    assert np.all(np.isfinite(g))


@on_cpu
def test_auto_is_xla_on_cpu_and_pallas_on_tpu_and_cuda():
  rng = np.random.default_rng()
  q, k, v = random_inputs(rng, 2, 64, 4, 2, 8)
  assert kernels.resolve("auto", q) == "xla"
  for window in (7, None):
    out = jax.jit(lambda q, k, v: kernels.attention(q, k, v, window=window, impl="auto"))(q, k, v)
    assert rel_err(out, reference(q, k, v, window, None)) <= 1e-5
  for platform in ("tpu", "cuda"):
    with kernels.target_platform(platform):
      assert kernels.resolve("auto", q) == "pallas"
      assert "pallas" in kernels.available_impls(q)
  with kernels.target_platform("tpu"):
    with pytest.raises(ValueError, match="cuDNN runs on CUDA GPUs only"):
      kernels.attention(q, k, v, impl="cudnn")


@pytest.mark.parametrize("platform, target, kernel_names", [
    ("tpu", "tpu_custom_call", ["splash_mha_fwd", "splash_mha_dkv", "splash_mha_dq"]),
    ("cuda", "__gpu$xla.gpu.triton", ["swa_flash_fwd", "swa_flash_dq", "swa_flash_dkv"]),
])
@pytest.mark.parametrize("x64", [False, True])
def test_one_function_lowers_to_each_platforms_kernel(platform, target, kernel_names, x64):
  from jax import export
  q, k, v = random_inputs(np.random.default_rng(0), 1, 256, 4, 2, 64)
  seg = jnp.ones((1, 256), jnp.int32)
  grad = jax.jit(jax.grad(lambda q, k, v: kernels.attention(
      q, k, v, window=64, segment_ids=seg).sum(), argnums=(0, 1, 2)))
  with jax.enable_x64(x64):
    assert "custom_call" not in grad.lower(q, k, v).as_text()  # CPU: the xla path.
    exported = export.export(grad, platforms=[platform], disabled_checks=[
        export.DisabledSafetyCheck.custom_call(target)])(q, k, v)
  text = exported.mlir_module()
  assert f"custom_call @{target}" in text
  for name in kernel_names:
    assert name in text, name
@on_cpu
@pytest.mark.parametrize("impl", ["pallas", "cudnn"])
def test_unavailable_impl_names_itself_and_the_alternatives(impl):
  q, k, v = random_inputs(np.random.default_rng(0), 1, 8, 2, 2, 8)
  with pytest.raises(ValueError, match=rf"impl='{impl}'.*Available: \('xla',\)"):
    kernels.attention(q, k, v, impl=impl)


@on_cpu
def test_every_impl_is_documented_and_selectable():
  assert kernels.IMPLS == ("auto", "xla", "pallas", "cudnn")
  q = jnp.zeros((1, 8, 2, 8))
  assert kernels.available_impls(q) == ("xla",)  # On this CPU-only test machine.


@pytest.mark.parametrize("kwargs, name", [
    (dict(window=0), "window"),
    (dict(window=-3), "window"),
    (dict(window=2.5), "window"),
    (dict(segment_ids=jnp.zeros((2, 5), jnp.int32)), "segment_ids"),
    (dict(segment_ids=jnp.zeros((2, 8), jnp.float32)), "segment_ids"),
    (dict(impl="magic"), "impl"),
])
def test_bad_arguments_name_themselves(kwargs, name):
  q, k, v = random_inputs(np.random.default_rng(0), 2, 8, 4, 2, 4)
  with pytest.raises(ValueError, match=name):
    kernels.attention(q, k, v, **kwargs)


def test_bad_head_counts_shapes_and_dtypes():
  rng = np.random.default_rng(0)
  q, k, v = random_inputs(rng, 1, 8, 4, 3, 4)
  with pytest.raises(ValueError, match="q heads N=4 must be a multiple of k/v heads K=3"):
    kernels.attention(q, k, v)
  q, k, v = random_inputs(rng, 1, 8, 4, 2, 4)
  with pytest.raises(ValueError, match="dtypes"):
    kernels.attention(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(ValueError, match="k shape"):
    kernels.attention(q, k[:, :5], v[:, :5])
  with pytest.raises(ValueError, match="rank 4"):
    kernels.attention(q[0], k, v)


def test_xla_runs_under_x64():
  # With jax_enable_x64 Python ints become int64 indices; slices must not mix index dtypes.
  with jax.enable_x64(True):
    check_against_reference(xla.attention, 40, 9, 2, True)
