"""hybrid_nope.kernels.delta_pallas_gpu (the gated delta rule's Triton kernels) in Pallas
interpret mode on CPU: output and the five gradients equal delta_xla's chunked form (and the
float64 recurrence of delta_reference.py), and the dispatch lowers it for CUDA.

Interpret mode compiles slowly (~15 s per program on 2 cores), so every numeric test uses one
shape per gate form (B=2, T=60, chunk 16: a partial last chunk) and shares its jitted program:
the per-head gate on GQA (N=4, K=2), the per-channel gate on GVA (q, k 2 heads, v 4), both with
d_v = 2 d_k. Relative error is rel_err's, max|got − want| / max|want| per tensor. Each test
draws a new seed and names it on failure; DELTA_TEST_SEED=<seed> reruns one.
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from delta_reference import delta_reference, random_delta_inputs
from hybrid_nope import kernels
from hybrid_nope.kernels import delta_pallas_gpu, delta_xla
from linear_reference import rel_err, seeded_rng

dispatch = sys.modules["hybrid_nope.kernels.delta_attention"]
fresh_rng = functools.partial(seeded_rng, "DELTA_TEST_SEED")

B, T, CHUNK = 2, 60, 16
# (N, K, V, Hk, Hv) per gate form.
LAYOUTS = {False: (4, 2, 2, 8, 16), True: (2, 2, 4, 8, 16)}
GATES = pytest.mark.parametrize("per_channel", [False, True],
                                ids=["per_head_gqa_dv2", "per_channel_gva2_dv2"])
# Row 0: runs ending on chunk edges (16, 32), padding inside (32-36) and at the end, id 2 again
# after padding (a new run); row 1 left-padded.
SEGMENTS = np.stack([np.repeat([1, 2, 3, 0, 2, 4, 0], [16, 9, 7, 5, 13, 6, 4]),
                     np.repeat([0, 5], [3, 57])]).astype(np.int32)
NAMES = ("out", "dq", "dk", "dv", "dlog_decay", "dbeta")


def _through_dispatch(kernel):
  """kernel (delta_xla's signature) on the operands kernels.delta_attention hands it (GVA's
  repeated q, k; the gates' unit axes)."""
  def fn(q, k, v, g, beta, segment_ids):
    q, k, g, beta = dispatch._gqa_operands(q, k, g, beta, v.shape[2])
    return kernel(q, k, v, g, beta, segment_ids=segment_ids)
  return fn


IMPLS = {
    "xla": _through_dispatch(functools.partial(delta_xla.delta_attention, chunk=CHUNK)),
    "pallas": _through_dispatch(functools.partial(delta_pallas_gpu.delta_attention,
                                                  chunk=CHUNK, interpret=True)),
}


@functools.cache
def out_and_grads(impl):
  @jax.jit
  def fn(args, seg, dout):
    out, vjp = jax.vjp(lambda *a: IMPLS[impl](*a, seg), *args)
    return (out, *vjp(dout))
  return fn


def draw(rng, per_channel, decay="mixed", beta="two", same_keys=False):
  """(q, k, v, log_decay, beta, dout) float32 for the gate form's layout."""
  N, K, V, H, Hv = LAYOUTS[per_channel]
  args = list(random_delta_inputs(rng, B, T, N, K, H, decay, beta, per_channel, V=V, Hv=Hv))
  if same_keys:  # one key direction per row and head: the hardest triangular systems
    args[1] = args[1][:, :1] * rng.uniform(0.5, 2.0, (B, T, 1, 1))
  dout = rng.standard_normal((B, T, max(N, V), Hv))
  return [jnp.asarray(a, jnp.float32) for a in args], jnp.asarray(dout, jnp.float32)


def compare(args, dout, seg=SEGMENTS):
  """{name: (error of pallas against xla, error of pallas against the float64 reference)}."""
  seg_j = jnp.asarray(seg)
  got = out_and_grads("pallas")(args, seg_j, dout)
  want = out_and_grads("xla")(args, seg_j, dout)
  ref_out, ref_grads = delta_reference(*args, seg, dout=dout)
  for x, y in zip(got, want):
    assert x.shape == y.shape and x.dtype == y.dtype == jnp.float32
    assert np.isfinite(np.asarray(x)).all()
  errors = {n: (rel_err(x, y), rel_err(x, r))
            for n, x, y, r in zip(NAMES, got, want, (ref_out, *ref_grads))}
  print(" ".join(f"{n} {e[0]:.1e}/{e[1]:.1e}" for n, e in errors.items()))
  return errors, got


@GATES
def test_matches_xla_on_packed_segments(per_channel):
  # β uniform in [0, 2], mixed decays, runs on and off chunk edges with padding.
  rng, seed = fresh_rng()
  errors, _ = compare(*draw(rng, per_channel))
  assert max(e[0] for e in errors.values()) <= 1e-5, (errors, seed)
  assert max(e[1] for e in errors.values()) <= 1e-5, (errors, seed)


@GATES
def test_beta_near_two_on_identical_keys(per_channel):
  # β ~ 2 on one key direction with no decay (delta_xla's hardest case: reflections whose sums
  # the chunk form carries); the forward substitution here against delta_xla's recursive
  # inverse. Tolerance as test_kernels_delta_attention's for the same case.
  rng, seed = fresh_rng()
  args, dout = draw(rng, per_channel, decay="near_one", beta="near_two", same_keys=True)
  errors, _ = compare(args, dout, np.ones((B, T), np.int32))
  assert max(e[0] for e in errors.values()) <= 5e-5, (errors, seed)
  assert max(e[1] for e in errors.values()) <= 5e-5, (errors, seed)


@GATES
def test_extreme_decays_stay_finite_and_match_xla(per_channel):
  # Decay exactly 0 (−inf), ~0 or exactly 1 everywhere with β ~ 2; row 1 all padding: zeros.
  rng, seed = fresh_rng()
  (q, k, v, g, beta), dout = draw(rng, per_channel, beta="near_two")
  seg = np.ones((B, T), np.int32) * np.array([[1], [0]], np.int32)
  for log_decay in (-np.inf, -80.0, 0.0):
    args = [q, k, v, jnp.full(g.shape, log_decay, jnp.float32), beta]
    errors, got = compare(args, dout, seg)
    for x in got:
      np.testing.assert_array_equal(x[1], 0.0)
    assert max(max(e) for e in errors.values()) <= 1e-5, (log_decay, errors, seed)


@pytest.mark.parametrize("impl", ["pallas", "auto"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_dispatch_lowers_the_triton_kernels_for_cuda(impl, per_channel):
  # The public function, values and gradients, exported for CUDA from this CPU: "pallas" puts
  # the forward, the reverse state pass and the per-chunk gradients in as Triton calls; "auto"
  # stays on XLA there (dispatch.TABLE's `auto` is empty until the kernel is measured on a GPU).
  from jax import export
  q, k = jnp.zeros((1, 256, 4, 64)), jnp.zeros((1, 256, 2, 64))
  v = jnp.zeros((1, 256, 2, 128))
  g = -jnp.ones((1, 256, 2, 64) if per_channel else (1, 256, 2))
  beta, seg = jnp.ones((1, 256, 2)), jnp.ones((1, 256), jnp.int32)
  grad = jax.jit(jax.grad(lambda *a: kernels.delta_attention(
      *a, segment_ids=seg, impl=impl).sum(), argnums=(0, 1, 2, 3, 4)))
  with kernels.target_platform("cuda"):
    exported = export.export(grad, platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(q, k, v, g, beta)
  text = exported.mlir_module()
  for name in ("delta_chunk_fwd", "delta_chunk_dstate", "delta_chunk_grads"):
    assert (f'name = "{name}"' in text) == (impl == "pallas"), name
  assert ("custom_call @__gpu$xla.gpu.triton" in text) == (impl == "pallas")


def test_chunk_must_be_a_power_of_two_of_at_least_16():
  x = jnp.zeros((1, 8, 1, 4))
  for chunk in (8, 24):
    with pytest.raises(ValueError, match=f"chunk={chunk}: expected a power of two >= 16"):
      delta_pallas_gpu.delta_attention(x, x, x, x[..., :1], x[..., :1], chunk=chunk,
                                       interpret=True)
