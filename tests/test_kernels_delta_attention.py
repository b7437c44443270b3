# Tiers (pytest.ini): test_xla_matches_reference's grid of ten shapes (T up to 1000) costs ~55 s
# cold on 2 cores, so by cost it is integration, `make test-all` only; the chunked form against
# the reference on packed segments on and off chunk edges, extreme decays, β near 2, prefill
# states then steps and the sequential form stay in `make test`, their per-head gate in GQA and
# their per-channel gate in GVA, both with d_v = 2 d_k (LAYOUTS); so does fla's naive gated
# delta rule.
# test-all only: the chunked "xla" form matches the float64 recurrence across T (1 to 1000),
# GQA, decays, betas, per-head and per-channel gates and chunk sizes
# (test_xla_matches_reference); on identical keys with no decay
# (test_identical_keys_no_decay); in bfloat16 (test_bfloat16_close_to_reference);
# under jax_enable_x64 (test_xla_runs_under_x64); the public dispatch on every head layout
# with either gate (test_public_dispatch_head_layouts); fla's naive KDA
# (test_matches_fla_naive_recurrent_with_repeated_heads[kda]). By cost (2-30 s cold each).
"""hybrid_nope.kernels.delta_attention (dispatch, argument checks, lowering), its "xla" chunked
form and delta_step, against the float64 recurrence of delta_reference.py on fresh random
inputs each run.

Relative error here is max|got − want| / max|want| per tensor (out, dq, dk, dv, dlog_decay,
dbeta). Every test draws a new seed and names it in its failure message; DELTA_TEST_SEED=<seed>
reruns with that one.
"""
import contextlib
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from delta_reference import delta_reference, delta_reference_state, random_delta_inputs
from hybrid_nope import kernels
from hybrid_nope.kernels import delta_xla
from hybrid_nope.kernels import dispatch as kernel_dispatch
from linear_reference import random_runs, rel_err, seeded_rng

dispatch = sys.modules["hybrid_nope.kernels.delta_attention"]
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU choices")


fresh_rng = functools.partial(seeded_rng, "DELTA_TEST_SEED")


def sequential_fn(q, k, v, g, beta, segment_ids=None):
  """delta_xla's one-token-at-a-time form, through the dispatch's operands (GVA's repeated q
  and k, the gates' unit axes)."""
  q, k, g, beta = dispatch._gqa_operands(q, k, g, beta, v.shape[2])
  return delta_xla.sequential(q, k, v, g, beta, segment_ids=segment_ids)


@functools.cache
def xla_fn(chunk):
  """delta_xla's chunked form at this chunk, through the dispatch's operands (one function
  per chunk, so that tests of equal shapes share compiled programs)."""
  def fn(q, k, v, g, beta, segment_ids=None):
    q, k, g, beta = dispatch._gqa_operands(q, k, g, beta, v.shape[2])
    return delta_xla.delta_attention(q, k, v, g, beta, segment_ids=segment_ids, chunk=chunk)
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


def draw(rng, B, T, decay="mixed", beta="uniform", per_channel=False, *, N=4, gqa=2, gva=1,
         H=8, Hv=None):
  """(q, k, v, log_decay, beta as random_delta_inputs draws them, the output's shape): q has N
  heads, k N / gqa, v gva times as many as k (GVA where gva > 1: then gqa = 1) of size Hv
  (default H)."""
  K = N // gqa
  inputs = random_delta_inputs(rng, B, T, N, K, H, decay, beta, per_channel, V=K * gva, Hv=Hv)
  return list(inputs), (B, T, max(N, K * gva), Hv or H)


def check(fn, T, gqa, segments, decay, *, beta="uniform", per_channel=False, same_keys=False,
          dtype=jnp.float32, tol=1e-5, B=2, **heads):
  """Forward and the five gradients of `fn` (one jitted program) against the reference; heads
  as draw()'s. `segments`: False, True (random packed runs with padding) or an explicit [B, T]
  array; `same_keys`: every key of a row and head points the same way (the delta rule's
  hardest triangular systems)."""
  rng, seed = fresh_rng()
  args, out_shape = draw(rng, B, T, decay, beta, per_channel, gqa=gqa, **heads)
  if same_keys:
    args[1] = args[1][:, :1] * rng.uniform(0.5, 2.0, (B, T, 1, 1))
  seg = segments if not isinstance(segments, bool) else (
      random_runs(rng, B, T) if segments else None)
  args = [jnp.asarray(a, dtype) for a in args]
  dout = jnp.asarray(rng.standard_normal(out_shape), dtype)
  seg_j = None if seg is None else jnp.asarray(seg, jnp.int32)
  out_and_grads = out_and_grads_fn(fn)
  out, grads = out_and_grads(args, seg_j, dout)
  # The reference sees exactly the (rounded) inputs the kernel saw.
  ref_out, ref_grads = delta_reference(*args, seg, dout=dout)
  assert out.shape == dout.shape and out.dtype == dtype
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


# Head layouts (check()'s keywords; issue 39). The everyday tests run their per-head gate on
# GQA and their per-channel gate on GVA with V = 4K, both with d_v = 2 d_k: one compiled
# program per gate, shared by the tests of equal shapes.
GQA_DV, GVA_DV = dict(N=4, gqa=2, Hv=16), dict(N=2, gqa=1, gva=4, Hv=16)
LAYOUTS = {False: GQA_DV, True: GVA_DV}
GATES = pytest.mark.parametrize("per_channel", [False, True],
                                ids=["per_head_gqa_dv2", "per_channel_gva4_dv2"])


@GATES
def test_segment_boundaries_off_and_on_chunk_edges(per_channel):
  check(xla_fn(16), 64, segments=PACKED, decay="mixed", beta="two", per_channel=per_channel,
        **LAYOUTS[per_channel])


@pytest.mark.integration
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_bfloat16_close_to_reference(per_channel):
  check(xla_fn(16), 64, 2, True, "moderate", per_channel=per_channel, dtype=jnp.bfloat16,
        tol=2e-2)


@GATES
def test_extreme_decays_and_padding_rows_stay_finite(per_channel):
  # Decay exactly 0 (-inf), ~0 or exactly 1 everywhere; row 1 is all padding: zeros, no NaN.
  rng, seed = fresh_rng()
  inputs, out_shape = draw(rng, 2, 64, beta="two", per_channel=per_channel,
                           **LAYOUTS[per_channel])
  q, k, v, g, beta = (jnp.asarray(a, jnp.float32) for a in inputs)
  seg = ONE_DOCUMENT * np.array([[1], [0]], np.int32)
  for log_decay in (-1e4, -80.0, -np.inf, 0.0):
    g = jnp.full(g.shape, log_decay, jnp.float32)
    dout = jnp.ones(out_shape)
    out, grads = out_and_grads_fn(xla_fn(16))((q, k, v, g, beta), jnp.asarray(seg), dout)
    ref_out, ref_grads = delta_reference(q, k, v, g, beta, seg, dout=dout)
    for got, want in zip((out, *grads), (ref_out, *ref_grads)):
      assert np.all(np.isfinite(got)), (log_decay, seed)
      np.testing.assert_array_equal(got[1], 0.0)
      assert rel_err(got, want) <= 1e-5, (log_decay, seed)


@GATES
def test_sequential_matches_reference(per_channel):
  check(sequential_fn, 37, segments=True, decay="mixed", beta="two", per_channel=per_channel,
        **LAYOUTS[per_channel])


def test_reference_gradients_match_finite_differences():
  rng, seed = fresh_rng()
  seg = np.array([[1, 1, 1, 2, 2, 0, 0, 2, 2, 2, 2], [0, 3, 3, 3, 3, 3, 1, 1, 0, 1, 1]])
  # Per-head gate on GQA; per-channel gate on GVA (V = 2K) with d_v ≠ d_k; β in [0, 2].
  for per_channel, heads in ((False, dict(N=4, gqa=2)), (True, dict(N=2, gqa=1, gva=2, Hv=5))):
    inputs, out_shape = draw(rng, 2, 11, "moderate", "two", per_channel, H=3, **heads)
    dout = rng.standard_normal(out_shape)
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
  assert kernel_dispatch.resolve("delta_attention", "auto") == "xla"
  assert kernel_dispatch.available_impls("delta_attention") == ("xla",)
  assert kernels.DELTA_IMPLS == ("auto", "xla", "pallas")
  want = delta_reference(*args, seg)
  for impl in ("auto", "xla"):
    out = jax.jit(lambda *a: kernels.delta_attention(*a, segment_ids=jnp.asarray(seg),
                                                     impl=impl))(*args)
    assert rel_err(out, want) <= 1e-5, seed
  for platform in ("tpu", "cuda"):
    with kernels.target_platform(platform):
      assert kernel_dispatch.resolve("delta_attention", "auto") == "xla"
  with kernels.target_platform("cuda"):
    assert kernel_dispatch.resolve("delta_attention", "pallas") == "pallas"
    assert "pallas" in kernel_dispatch.available_impls("delta_attention")
  for platform in (None, "tpu"):
    with kernels.target_platform(platform) if platform else contextlib.nullcontext():
      with pytest.raises(ValueError, match=r"impl='pallas'.*CUDA GPUs only.*Available: "
                                           r"\('xla',\)"):
        kernels.delta_attention(*args, impl="pallas")


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
  with pytest.raises(ValueError, match="heads N=4, K=3, V=3; .* GQA .* or GVA"):
    kernels.delta_attention(q, k, k, g, g)
  with pytest.raises(ValueError, match=r"state shape \(1, 2, 4, 3\): expected .* \(1, 2, 4, 4\)"):
    kernels.delta_step(jnp.zeros((1, 2, 4, 3)), jnp.zeros((1, 4, 4)), jnp.zeros((1, 2, 4)),
                       jnp.zeros((1, 2, 4)), jnp.zeros((1, 2)), jnp.zeros((1, 2)))
  with pytest.raises(ValueError, match=r"beta shape \(1, 2, 1\): expected \[batch, value heads\]"):
    kernels.delta_step(jnp.zeros((1, 2, 4, 4)), jnp.zeros((1, 4, 4)), jnp.zeros((1, 2, 4)),
                       jnp.zeros((1, 2, 4)), jnp.zeros((1, 2)), jnp.zeros((1, 2, 1)))


@pytest.mark.integration
def test_xla_runs_under_x64():
  with jax.enable_x64(True):
    check(xla_fn(8), 30, 2, True, "mixed")


@pytest.mark.slow
@pytest.mark.parametrize("layout", [GQA_DV, dict(N=2, gqa=1, gva=2), GVA_DV],
                         ids=["gqa_dv2", "gva2", "gva4_dv2"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_public_dispatch_head_layouts(layout, per_channel):
  # kernels.delta_attention itself (its tuned chunk; T = 100 ends mid-chunk) on every layout
  # and gate, β in [0, 2].
  check(kernels.delta_attention, 100, segments=True, decay="mixed", beta="two",
        per_channel=per_channel, **layout)


@GATES
def test_beta_near_two_on_identical_keys(per_channel):
  # β ~ 2 (allow_neg_eigval) on one key direction with no decay: each write reflects the
  # state along k (eigenvalue 1 − β ~ −1) instead of erasing it, so the state is a random walk
  # whose steps the chunk form sums (U) and the UT transform's inverse (I + β KK)⁻¹ has ±2
  # entries all along its chunk. Worst 1.4e-5 over 30 seeds per gate (the sequential form's
  # ~4e-6; at β ~ 1 the chunk form's ~7e-7, dlog_decay aside); delta_xla's docstring has
  # chunk 32.
  check(xla_fn(16), 64, segments=ONE_DOCUMENT, decay="near_one", beta="near_two",
        per_channel=per_channel, same_keys=True, tol=5e-5, **LAYOUTS[per_channel])


@GATES
def test_prefill_then_steps_match_the_reference(per_channel):
  # delta_prefill's state after a prompt of 75 tokens (not a multiple of the chunk), then
  # delta_step token by token from it: the state and every generated output are the
  # reference's over the whole sequence. Row 0: packed runs with padding, the last run starting
  # mid-chunk and going on through the steps (the state is that run's alone); row 1 a
  # left-padded prompt, as generation lays prompts out.
  rng, seed = fresh_rng()
  B, T, prompt = 2, 85, 75
  inputs, (_, _, heads, Hv) = draw(rng, B, T, "mixed", "two", per_channel,
                                   **LAYOUTS[per_channel])
  V, H = inputs[2].shape[2], inputs[1].shape[3]
  seg = np.zeros((B, T), np.int32)
  seg[0] = random_runs(rng, 1, T, rate=0.08)[0]
  seg[0, prompt - 11:] = 7
  seg[1, 20:] = 1
  want_out = delta_reference(*inputs, seg)
  # The steps as padding leave the reference state where the prompt left it (and keep the
  # shape, so the two reference calls share a program).
  want_state = delta_reference_state(*inputs, np.where(np.arange(T) < prompt, seg, 0))
  f32 = [jnp.asarray(x, jnp.float32) for x in inputs]
  state = kernels.delta_prefill(*(x[:, :prompt] for x in f32),
                                segment_ids=jnp.asarray(seg[:, :prompt]))
  assert state.shape == (B, V, Hv, H) and state.dtype == jnp.float32
  errors = [rel_err(state, want_state)]
  step = jax.jit(kernels.delta_step)
  for t in range(prompt, T):
    state, out = step(state, *(x[:, t] for x in f32))
    assert out.shape == (B, heads, Hv) and out.dtype == state.dtype == jnp.float32
    errors.append(rel_err(out, want_out[:, t]))
  print(f"state {errors[0]:.1e} steps {max(errors[1:]):.1e}")
  assert max(errors) <= 1e-5, (per_channel, errors, seed)


def fla_naive_recurrent(q, k, v, beta, g, scale):
  """fla's naive_recurrent_gated_delta_rule (g [B, H, T]) and naive_recurrent_kda (g
  [B, H, T, d_k]), written here from their published definitions in fla's [B, H, T, d] layout,
  float64, with the l2norm fla applies first (x / sqrt(Σx² + 1e-6)): per (b, h) from S = 0
  [d_k, d_v], S = S ⊙ exp(g_t) (per key row for KDA); S += k_t (β_t (v_t − Sᵀ k_t))ᵀ;
  o_t = Sᵀ q_t with q scaled by `scale`."""
  q, k = (x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6) for x in (q, k))
  q = q * scale
  B, Hh, T, Dk = q.shape
  S = np.zeros((B, Hh, Dk, v.shape[-1]))
  o = np.zeros((B, Hh, T, v.shape[-1]))
  for t in range(T):
    decay = np.exp(g[:, :, t])
    S = S * (decay[..., None, None] if decay.ndim == 2 else decay[..., :, None])
    u = beta[:, :, t, None] * (v[:, :, t] - np.einsum("bhkv,bhk->bhv", S, k[:, :, t]))
    S = S + k[:, :, t, :, None] * u[..., None, :]
    o[:, :, t] = np.einsum("bhk,bhkv->bhv", q[:, :, t], S)
  return o


@pytest.mark.parametrize("per_channel", [
    False, pytest.param(True, marks=pytest.mark.slow)], ids=["gated_delta_rule", "kda"])
def test_matches_fla_naive_recurrent_with_repeated_heads(per_channel):
  # Qwen3-Next's layout: V = 2K value heads, q and k repeat_interleave'd to them, d_v = 2 d_k,
  # β = 2 sigmoid (allow_neg_eigval). Our kernel leaves q unscaled: its output times d_k^−1/2.
  rng, seed = fresh_rng()
  B, T, K, V, H, Hv = 2, 50, 2, 4, 8, 16
  q, k, v, g, beta = random_delta_inputs(rng, B, T, K, K, H, "moderate", "two", per_channel,
                                         V=V, Hv=Hv)
  fla_layout = lambda x: np.moveaxis(x, 2, 1)  # [B, T, heads, ...] -> [B, heads, T, ...]
  want = fla_naive_recurrent(*(fla_layout(np.repeat(x, V // K, axis=2)) for x in (q, k)),
                             *(fla_layout(x) for x in (v, beta, g)), scale=H ** -0.5)
  out = jax.jit(kernels.delta_attention)(*(jnp.asarray(x, jnp.float32)
                                           for x in (q, k, v, g, beta)))
  assert out.shape == (B, T, V, Hv)
  err = rel_err(np.asarray(out) * H ** -0.5, fla_layout(want))
  print(f"out {err:.1e}")
  assert err <= 1e-5, (per_channel, err, seed)


def _zeros(*shapes):
  return [jnp.zeros(s) for s in shapes]


@pytest.mark.parametrize("q, k, v", [
    ((1, 8, 4, 4), (1, 8, 2, 4), (1, 8, 4, 4)),  # V ≠ K and N ≠ K: neither layout
    ((1, 8, 2, 4), (1, 8, 2, 4), (1, 8, 3, 4)),  # V not a multiple of K
    ((1, 8, 3, 4), (1, 8, 2, 4), (1, 8, 2, 4)),  # N not a multiple of K
    ((1, 8, 2, 4), (1, 8, 2, 4), (1, 8, 4, 4, 1)),  # v of rank 5
    ((1, 8, 2, 4), (1, 8, 2, 6), (1, 8, 2, 4)),  # q, k head dims differ
    ((1, 8, 2, 4), (1, 8, 2, 4), (2, 8, 4, 4)),  # v's batch differs
])
def test_head_layouts_other_than_gqa_and_gva_are_refused(q, k, v):
  V = v[2]
  shape = lambda s: r"\(" + ", ".join(map(str, s)) + r"\)"
  match = rf"q {shape(q)}, k {shape(k)}, v {shape(v)}: expected .* GQA .* GVA"
  for fn in (kernels.delta_attention, kernels.delta_prefill):
    with pytest.raises(ValueError, match=match):
      fn(*_zeros(q, k, v, (1, 8, V), (1, 8, V)))
  step_shapes = [s[:1] + s[2:] for s in (q, k, v)]
  with pytest.raises(ValueError, match=r"q \(1, .*: expected q \[batch, heads N"):
    kernels.delta_step(*_zeros((1, V, v[-1], q[-1]), *step_shapes, (1, V), (1, V)))


def test_gva_gates_and_state_are_per_value_head():
  # q, k 2 heads of 4, v 4 heads of 8: gates [.., 4 (, 4)], state [1, 4, 8, 4].
  q, v = (1, 8, 2, 4), (1, 8, 4, 8)
  with pytest.raises(ValueError, match=r"log_decay shape \(1, 8, 2\): expected .* \(1, 8, 4\) "
                                       r".* \(1, 8, 4, 4\)"):
    kernels.delta_attention(*_zeros(q, q, v, (1, 8, 2), (1, 8, 4)))
  with pytest.raises(ValueError, match=r"beta shape \(1, 8, 2\): expected .* \(1, 8, 4\)"):
    kernels.delta_attention(*_zeros(q, q, v, (1, 8, 4, 4), (1, 8, 2)))
  with pytest.raises(ValueError, match=r"state shape \(1, 4, 4, 4\): expected \[batch, value "
                                       r"heads, value dim, key dim\] = \(1, 4, 8, 4\)"):
    kernels.delta_step(*_zeros((1, 4, 4, 4), (1, 2, 4), (1, 2, 4), (1, 4, 8), (1, 4), (1, 4)))
  with pytest.raises(ValueError, match="q, k, v dtypes must match"):
    kernels.delta_attention(*_zeros(q, q), jnp.zeros(v, jnp.bfloat16), *_zeros((1, 8, 4),
                                                                               (1, 8, 4)))
