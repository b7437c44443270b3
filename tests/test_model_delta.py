"""The gated delta rule layer (pattern letter D) against the published formulas in float64 numpy
(Gated DeltaNet; KDA's per-channel gate), its short convolution that stays inside a document,
the gate and β the recency hook reads, its parameters' logical axes, and D in a model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.model import LanguageModel, delta
from hybrid_nope.model.layers import logical_axes
from tests.helpers import tiny_config

D, N, K, H = 32, 4, 2, 8


def make_layer(gate="head", seed=0):
  return delta.DeltaAttention(d_model=D, num_heads=N, num_kv_heads=K, head_dim=H, norm_eps=1e-6,
                              gate=gate, impl="xla", dtype=jnp.float32, rngs=nnx.Rngs(seed))


def jitted(layer):
  """layer(x, segment_ids) compiled once (eager runs op by op, slowly on 2 cores)."""
  return jax.jit(lambda x, seg: layer(x, positions_BT=None, segment_ids_BT=seg))


def rel_err(got, want):
  return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def silu(z):
  return z / (1 + np.exp(-z))


def numpy_delta_layer(layer, x, segment_ids):
  """Yang et al. (2024) Gated DeltaNet, per-channel α as Kimi Delta Attention, written out
  one token at a time in float64 from the layer's parameters. State S [value, key] per row and
  kv head; a document is a run of equal nonzero ids; id 0 is padding (reads and writes
  nothing, outputs 0)."""
  p = {name: np.asarray(v[...], np.float64) for name, v in nnx.state(layer, nnx.Param).items()}
  x = np.asarray(x, np.float64)
  B, T, _ = x.shape
  run_start = np.zeros((B, T), int)  # the first position of each position's document
  for b in range(B):
    for t in range(1, T):
      same = segment_ids[b, t] == segment_ids[b, t - 1]
      run_start[b, t] = run_start[b, t - 1] if same else t

  def conv(z, w):  # causal depthwise, taps w[0] (oldest) … w[3] (current), inside a document
    out = np.zeros_like(z)
    for b in range(B):
      for t in range(T):
        for lag in range(4):
          if t - lag >= run_start[b, t]:
            out[b, t] += w[3 - lag] * z[b, t - lag]
    return silu(out)

  q = conv(np.einsum("btd,dnh->btnh", x, p["wq_DNH"]), p["w_conv_q_WNH"])
  k = conv(np.einsum("btd,dkh->btkh", x, p["wk_DKH"]), p["w_conv_k_WKH"])
  v = conv(np.einsum("btd,dkh->btkh", x, p["wv_DKH"]), p["w_conv_v_WKH"])
  q /= np.linalg.norm(q, axis=-1, keepdims=True)
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  beta = 1 / (1 + np.exp(-x @ p["w_beta_DK"]))
  low = x @ p["w_gate_down_DR"]
  if layer.gate == "head":
    z = low @ p["w_gate_up_RK"] + p["gate_bias_K"]
    z = np.repeat(z[..., None], H, axis=-1)  # one α for every key channel of a head
  else:
    z = np.einsum("btr,rkh->btkh", low, p["w_gate_up_RKH"]) + p["gate_bias_KH"]
  alpha = np.exp(-np.logaddexp(0.0, -z) / 16.0)  # exp(logsigmoid(z) / τ)
  o = np.zeros((B, T, N, H))
  group = N // K
  for b in range(B):
    for kv in range(K):
      S = np.zeros((H, H))
      for t in range(T):
        if segment_ids[b, t] == 0:
          continue
        if run_start[b, t] == t:
          S = np.zeros((H, H))
        kt, bt = k[b, t, kv], beta[b, t, kv]
        S = S @ np.diag(alpha[b, t, kv]) @ (np.eye(H) - bt * np.outer(kt, kt))
        S = S + bt * np.outer(v[b, t, kv], kt)
        for n in range(kv * group, (kv + 1) * group):
          o[b, t, n] = S @ q[b, t, n]
  o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-6) * p["out_norm_scale_H"]
  g = np.einsum("btd,dnh->btnh", x, p["w_out_gate_DNH"])
  return np.einsum("btnh,nhd->btd", o * silu(g), p["wo_NHD"])


def segments():
  """Row 0: three documents whose boundaries fall anywhere in a chunk; row 1: a 5-token
  document, a long one, then padding."""
  seg = np.repeat(np.array([[1, 2, 3], [1, 1, 0]]), [23, 41, 30], axis=1).astype(np.int32)
  seg[1, :5] = 4
  return seg


@pytest.mark.parametrize("gate", delta.GATES)
def test_layer_matches_the_published_formulas_with_segments_and_gqa(gate):
  seed = int(np.random.default_rng().integers(1 << 30))  # Fresh each run, named on failure.
  layer = make_layer(gate, seed)
  seg = segments()
  x = np.random.default_rng(seed).standard_normal((2, seg.shape[1], D)).astype(np.float32)
  out = jitted(layer)(jnp.asarray(x), jnp.asarray(seg))
  want = numpy_delta_layer(layer, x, seg)
  valid = seg != 0
  assert rel_err(np.asarray(out)[valid], want[valid]) < 1e-5, seed
  assert np.all(np.isfinite(np.asarray(out)))


def test_the_short_convolution_does_not_leak_across_documents():
  """Changing document A's tokens leaves document B's outputs as they were (B's first three
  positions are where a convolution over the boundary would read A), and padding is read by
  no one."""
  layer = make_layer()
  seg = jnp.asarray(np.repeat([[1, 2, 0]], [20, 20, 8], axis=1).astype(np.int32))
  x = jax.random.normal(jax.random.key(0), (1, 48, D))
  other = x.at[:, :20].set(jax.random.normal(jax.random.key(1), (1, 20, D)))
  other = other.at[:, 40:].set(7.0)
  forward = jitted(layer)
  run = lambda x: np.asarray(forward(x, seg))
  base, changed = run(x), run(other)
  np.testing.assert_array_equal(changed[:, 20:40], base[:, 20:40])
  assert np.abs(changed[:, :20] - base[:, :20]).min() > 0
  # Without segment ids the same change does reach B through the convolution and the state.
  free = lambda x: np.asarray(forward(x, None))
  assert np.abs(free(other)[:, 20:23] - free(x)[:, 20:23]).min() > 0


def test_conv_windows_of_a_sequence_are_the_decode_windows():
  """The sequence form equals a decode step that keeps the last 4 inputs (zeros at a document
  start): what a one-token step calls conv_output on."""
  x = np.random.default_rng(0).standard_normal((1, 12, 3)).astype(np.float32)
  seg = np.array([[1] * 5 + [2] * 7])
  windows = np.asarray(delta.conv_windows(jnp.asarray(x), jnp.asarray(seg)))
  window = np.zeros((delta.CONV_WIDTH, 3))
  for t in range(12):
    if t and seg[0, t] != seg[0, t - 1]:
      window[:] = 0
    window = np.concatenate([window[1:], x[0, t:t + 1]])
    np.testing.assert_array_equal(windows[0, t], window)


@pytest.mark.parametrize("gate, shape", [("head", (2, 64, K)), ("channel", (2, 64, K, H))])
def test_gate_and_beta_for_the_hook(gate, shape):
  layer = make_layer(gate)
  x = jax.random.normal(jax.random.key(3), (2, 64, D))
  log_alpha, beta = np.asarray(layer.log_decay(x)), np.asarray(layer.beta(x))
  assert log_alpha.shape == shape and log_alpha.dtype == np.float32 and (log_alpha < 0).all()
  # GLA's init: logsigmoid of ~unit-variance logits over τ = 16 gives α ≈ 0.95; β ≈ 1/2.
  assert 0.93 < np.exp(log_alpha).mean() < 0.97 and np.std(log_alpha) > 0.01
  assert beta.shape == (2, 64, K) and beta.dtype == np.float32
  assert ((beta > 0) & (beta < 1)).all() and 0.4 < beta.mean() < 0.6 and beta.std() > 0.05


def test_bad_gate_names_the_key():
  with pytest.raises(ValueError, match="model.delta_gate='scalar'"):
    make_layer("scalar")


@pytest.mark.parametrize("gate", delta.GATES)
def test_parameters_carry_logical_axes(gate):
  names = {"embed", "heads", "kv_heads", "kv", None}
  for name, v in nnx.state(make_layer(gate), nnx.Param).items():
    axes = logical_axes(v)
    assert axes is not None and len(axes) == v[...].ndim and set(axes) <= names, name
  axes = {name: logical_axes(v) for name, v in nnx.state(make_layer(gate), nnx.Param).items()}
  assert axes["w_conv_k_WKH"] == (None, "kv_heads", "kv")
  assert axes["w_beta_DK"] == ("embed", "kv_heads")


def test_a_delta_hybrid_is_causal():
  """The model wires D layers from the config (here DGDG, per-channel gate). Remat over D
  layers is the mesh test's (tests/scripts/mesh_runs.py: LDG under remat on 8 devices against
  one device without), as compiling their backward pass twice here would cost ~20 s."""
  cfg = tiny_config(model__pattern="DG", model__num_layers=4, model__delta_gate="channel").model
  graphdef, params = nnx.split(LanguageModel(cfg, rngs=nnx.Rngs(0)))
  assert params["blocks"][0]["attn"]["w_gate_up_RKH"].shape == (16, K, H)
  logits = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
  t = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 24)), jnp.int32)
  changed = t.at[:, 13].set((t[:, 13] + 1) % 256)
  diff = jnp.abs(logits(params, t) - logits(params, changed)).max(axis=(0, 2))
  assert float(diff[:13].max()) == 0.0 and float(diff[13]) > 0.0
