# Tiers (pytest.ini): each case is one XLA:CPU compile of the four kernels in interpret mode
# (~8-17 s on 2 cores), so the everyday tier keeps five of them (GQA 1, 2, 4; segments with
# padding; 1, 2 and 4 sub-chunks per chunk; mixed, strong, near-one, -inf and 0 decays). A gla
# config lowering for cuda with these kernels is test_train_lowering's (make test-all).
"""hybrid_nope.kernels.linear_pallas_gpu (the Triton GLA kernels) in interpret mode on CPU: output
and dq, dk, dv, dlog_decay equal the XLA path (linear_xla) and the float64 recurrence
(linear_reference.py) to float32 round-off; impl="pallas" dispatches to it on CUDA and the
lowered module carries its four Triton calls.

Every test draws a new seed and names it in its failure message; LINEAR_TEST_SEED=<seed> reruns
with that one.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from hybrid_nope import kernels
from hybrid_nope.kernels import dispatch as kernel_dispatch
from hybrid_nope.kernels import linear_pallas_gpu, linear_xla, target_platform
from hybrid_nope.train.lowering import kernels_in
from linear_reference import (linear_reference, random_linear_inputs, random_runs, rel_err,
                              seeded_rng)
from test_kernels_linear_attention import packed

fresh_rng = functools.partial(seeded_rng, "LINEAR_TEST_SEED")
GPU_KERNELS = ("gla_chunk_states", "gla_chunk_out", "gla_chunk_dstates", "gla_chunk_grads")


def gpu_fn(chunk):
  return lambda q, k, v, g, **kw: linear_pallas_gpu.linear_attention(
      q, k, v, g, chunk=chunk, interpret=True, **kw)


def out_and_grads(fn, args, seg, dout):
  @jax.jit
  def run(q, k, v, g, dout):
    out, vjp = jax.vjp(lambda q, k, v, g: fn(q, k, v, g, segment_ids=seg), q, k, v, g)
    return out, vjp(dout)
  return run(*args, dout)


# (T, gqa, segments, decay, chunk, H): T never a multiple of the chunk; chunk 16, 32 and 64 are
# 1, 2 and 4 sub-chunks (the diagonal levels alone, then the off-diagonal splits); H = 8 pads
# to Triton's 16. segments "packed": runs ending just off and on chunk edges, padding inside.
# decay "strong_then_weak": -1e4 then log decays of 1e-5..1e-2, where a difference of prefix
# sums would have lost every digit of the weak steps.
CASES = [
    (40, 2, True, "mixed", 32, 16),
    (20, 2, True, "mixed", 32, 16),  # one chunk: no later chunk to carry dlog_decay from
    (70, 1, False, "near_zero", 32, 8),
    (140, 4, "packed", "near_one", 16, 16),
    (100, 1, True, "strong_then_weak", None, 16),
]


def strong_then_weak(rng, shape):
  g = -np.exp(rng.uniform(-12.0, -4.0, shape))
  g[:, 3::16], g[:, 21::16] = -1e4, -30.0  # inside sub-chunks, every 16 rows
  return g


@pytest.mark.parametrize("T, gqa, segments, decay, chunk, H", CASES)
def test_matches_xla_and_reference(T, gqa, segments, decay, chunk, H):
  rng, seed = fresh_rng()
  B, N = 2, 4
  strong = decay == "strong_then_weak"
  q, k, v, g = random_linear_inputs(rng, B, T, N, N // gqa, H, "mixed" if strong else decay)
  g = strong_then_weak(rng, g.shape) if strong else g
  seg = (packed(B, T) if segments == "packed" else random_runs(rng, B, T) if segments
         else None)
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g)]
  dout = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
  seg_j = None if seg is None else jnp.asarray(seg, jnp.int32)
  got = out_and_grads(gpu_fn(chunk), args, seg_j, dout)
  xla = out_and_grads(linear_xla.linear_attention, args, seg_j, dout)
  ref = linear_reference(*(np.asarray(a, np.float64) for a in args), seg,
                         dout=np.asarray(dout, np.float64))
  names = ("out", "dq", "dk", "dv", "dlog_decay")
  flat = lambda x: (x[0], *x[1])
  vs_xla = {n: rel_err(a, b) for n, a, b in zip(names, flat(got), flat(xla))}
  vs_ref = {n: rel_err(a, b) for n, a, b in zip(names, flat(got), flat(ref))}
  print("vs xla", " ".join(f"{n} {e:.1e}" for n, e in vs_xla.items()))
  print("vs ref", " ".join(f"{n} {e:.1e}" for n, e in vs_ref.items()))
  for x, want in zip(flat(got), flat(ref)):
    assert x.dtype == jnp.float32 and x.shape == want.shape
  assert max(vs_xla.values()) <= 1e-5, (vs_xla, f"seed {seed}")
  assert max(vs_ref.values()) <= 1e-5, (vs_ref, f"seed {seed}")


def test_extreme_decays_and_padding_rows_stay_finite():
  # Decay exactly 0 (-inf), ~0 or exactly 1 everywhere; row 1 is all padding: zeros, no NaN.
  rng, seed = fresh_rng()
  q, k, v, _ = random_linear_inputs(rng, 2, 40, 4, 2, 16)
  q, k, v = (jnp.asarray(a, jnp.float32) for a in (q, k, v))
  seg = jnp.asarray(np.stack([np.ones(40), np.zeros(40)]), jnp.int32)
  run = jax.jit(lambda q, k, v, g: out_and_grads(gpu_fn(16), (q, k, v, g), seg,
                                                 jnp.ones(q.shape, jnp.float32)))
  xla = jax.jit(lambda q, k, v, g: out_and_grads(linear_xla.linear_attention, (q, k, v, g),
                                                 seg, jnp.ones(q.shape, jnp.float32)))
  for log_decay in (-jnp.inf, -1e4, -80.0, 0.0):
    g = jnp.full(k.shape, log_decay, jnp.float32)
    (out, grads), (out_x, grads_x) = run(q, k, v, g), xla(q, k, v, g)
    for x, want in zip((out, *grads), (out_x, *grads_x)):
      assert np.all(np.isfinite(x)), (log_decay, seed)
      np.testing.assert_array_equal(x[1], 0.0)
      assert rel_err(x, want) <= 1e-5, (log_decay, seed)


def test_pallas_means_the_triton_kernels_on_cuda_and_auto_keeps_xla():
  with target_platform("cuda"):
    assert kernel_dispatch.resolve("linear_attention", "pallas") == "pallas"
    assert kernel_dispatch.resolve("linear_attention", "auto") == "xla"  # not measured on a GPU yet
    cuda = kernel_dispatch.branches("linear_attention", "pallas")["cuda"]
    assert cuda.module is linear_pallas_gpu and cuda.function == "linear_attention"
  with target_platform("cpu"), pytest.raises(ValueError, match="TPU and CUDA GPUs only"):
    kernel_dispatch.resolve("linear_attention", "pallas")


def test_lowers_for_cuda_with_the_four_triton_kernels():
  B, T, N, K, H = 1, 200, 4, 2, 64
  sds = lambda *s, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(s, dtype)

  def step(q, k, v, g, seg):
    fn = lambda q, k, v, g: kernels.linear_attention(q, k, v, g, segment_ids=seg, impl="pallas")
    out, vjp = jax.vjp(fn, q, k, v, g)
    return out, vjp(out)

  with target_platform("cuda"):
    exported = export.export(
        jax.jit(step), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
            sds(B, T, N, H), sds(B, T, K, H), sds(B, T, K, H), sds(B, T, K, H),
            sds(B, T, dtype=jnp.int32))
  found = kernels_in(exported.mlir_module())
  assert set(found["custom_calls"]) == {"__gpu$xla.gpu.triton"}
  assert set(found["kernels"]) == set(GPU_KERNELS)

