# Tiers (pytest.ini): the remat tests compile 3-6 layer models' backward passes (with and without
# remat; ~60 s cold on 2 cores together), so by cost they are integration, `make test-all` only.
# test-all only: remat gives the plain model's loss and gradients (test_remat_matches_plain), and
# each extra block under remat stores little more than the residual stream
# (test_remat_stores_only_the_residual_stream_between_repeats); bfloat16 parameters in L and D
# layers (test_bfloat16_parameters_are_the_float32_ones_rounded_and_computed_alike[LG, DG]).
import numpy as np
import pytest
import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope.model import LanguageModel, layer_kinds
from hybrid_nope.model.layers import logical_axes
from tests.helpers import tiny_config

LOGICAL_NAMES = {"vocab", "embed", "heads", "kv_heads", "kv", "mlp"}


def build(**overrides):
  return LanguageModel(tiny_config(**{f"model__{k}": v for k, v in overrides.items()}).model,
                       rngs=nnx.Rngs(0))


def tokens(B=2, T=24, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (B, T)), jnp.int32)


def test_layer_kinds():
  assert layer_kinds("SG", 4) == "SGSG"
  assert layer_kinds("G", 3) == "GGG"
  with pytest.raises(ValueError, match="model.pattern"):
    layer_kinds("SX", 4)
  with pytest.raises(ValueError, match="model.num_layers"):
    layer_kinds("SG", 3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shapes_and_dtypes(dtype):
  model = build(dtype=dtype)
  logits = model(tokens())
  assert logits.shape == (2, 24, 258) and logits.dtype == jnp.float32
  params = nnx.state(model, nnx.Param)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  h = jax.make_jaxpr(lambda t: model(t))(tokens())
  uses_bf16 = "bf16" in str(h)
  assert uses_bf16 == (dtype == "bfloat16")


def test_every_parameter_has_logical_axes():
  model = build(tie_embeddings=False)
  variables = [v for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)]
  assert len(variables) > 10
  for v in variables:
    axes = logical_axes(v)
    assert axes is not None and len(axes) == v[...].ndim and set(axes) <= LOGICAL_NAMES


@pytest.mark.parametrize("pattern", ["SG", "G"])
def test_causality(pattern):
  model = build(pattern=pattern)
  t = 13
  base, changed = tokens(), tokens().at[:, t].set(7)
  diff = jnp.abs(model(base) - model(changed)).max(axis=(0, 2))
  assert float(diff[:t].max()) == 0.0
  assert float(diff[t]) > 0.0


def test_window_locality_in_sliding_window_model():
  window = 4
  model = build(pattern="S", num_layers=1, window=window)
  i = 20
  base = tokens()
  logits = model(base)[:, i]
  beyond = base.at[:, i - window].set((base[:, i - window] + 1) % 256)
  inside = base.at[:, i - window + 1].set((base[:, i - window + 1] + 1) % 256)
  assert float(jnp.abs(model(beyond)[:, i] - logits).max()) == 0.0
  assert float(jnp.abs(model(inside)[:, i] - logits).max()) > 0.0


def test_document_masking():
  model = build(pattern="SG", window=64)
  base = tokens()
  seg = jnp.concatenate([jnp.ones((2, 10), jnp.int32), 2 * jnp.ones((2, 14), jnp.int32)], 1)
  pos = jnp.concatenate([jnp.arange(10), jnp.arange(14)])[None].repeat(2, 0)
  changed = base.at[:, 3].set((base[:, 3] + 1) % 256)
  out_a = model(base, positions_BT=pos, segment_ids_BT=seg)
  out_b = model(changed, positions_BT=pos, segment_ids_BT=seg)
  assert float(jnp.abs(out_a[:, 10:] - out_b[:, 10:]).max()) == 0.0
  assert float(jnp.abs(out_a[:, 3:10] - out_b[:, 3:10]).max()) > 0.0
  # Without segment ids the second document does see the first.
  assert float(jnp.abs(model(base)[:, 10:] - model(changed)[:, 10:]).max()) > 0.0


@pytest.mark.parametrize("pattern, key", [("S", "swa_pos"), ("G", "global_pos")])
def test_rope_and_nope_differ(pattern, key):
  rope = build(pattern=pattern, **{key: "rope"})
  nope = build(pattern=pattern, **{key: "nope"})
  # Same seed, same parameters: only the position encoding differs.
  for a, b in zip(jax.tree.leaves(nnx.state(rope)), jax.tree.leaves(nnx.state(nope))):
    np.testing.assert_array_equal(a, b)
  t = tokens()
  assert float(jnp.abs(rope(t) - nope(t)).max()) > 1e-3
  # NoPE ignores positions entirely; RoPE sees relative distances, which stretching changes
  # (a uniform shift would not: RoPE scores depend on i - j only).
  stretched = jnp.broadcast_to(3 * jnp.arange(24), (2, 24))
  assert float(jnp.abs(nope(t) - nope(t, positions_BT=stretched)).max()) == 0.0
  assert float(jnp.abs(rope(t) - rope(t, positions_BT=stretched)).max()) > 1e-3


def test_tied_and_untied_heads():
  tied, untied = build(tie_embeddings=True), build(tie_embeddings=False)
  assert not hasattr(tied, "head_DV") and untied.head_DV[...].shape == (32, 258)
  for model in (tied, untied):
    # Logits start near unit scale, so the initial loss is close to log(V).
    assert 0.5 < float(jnp.std(model(tokens()))) < 2.0


@pytest.mark.parametrize("pattern", [  # L and D layers run ~7 s each here: test-all only.
    "SG", pytest.param("LG", marks=pytest.mark.integration),
    pytest.param("DG", marks=pytest.mark.integration)])
def test_bfloat16_parameters_are_the_float32_ones_rounded_and_computed_alike(pattern):
  """model.param_dtype: the same initialisation, stored rounded to bfloat16; the forward pass
  (float32 compute) equals the float32 model's holding those rounded values."""
  stored, wide = build(pattern=pattern, param_dtype="bfloat16"), build(pattern=pattern)
  params = nnx.state(stored, nnx.Param)
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  nnx.update(wide, jax.tree.map(lambda p: p.astype(jnp.float32), params))
  np.testing.assert_array_equal(stored(tokens()), wide(tokens()))


@pytest.mark.parametrize("tied", [True, False])
def test_logits_dtype_float32_computes_the_head_in_float32(tied):
  """With bfloat16 compute, "compute" rounds the logits to bfloat16 before the float32 cast;
  "float32" gives the final norm's output times the head in float32."""
  seen = {}

  def final(layer, name, x_BTD):
    seen[name] = x_BTD
    return x_BTD

  wide, narrow = (build(dtype="bfloat16", tie_embeddings=tied, logits_dtype=kind)
                  for kind in ("float32", "compute"))
  got = wide(tokens(), observe=final)
  x_BTD = np.asarray(seen["final_norm"], np.float32)
  head_DV = (np.asarray(wide.embed.embedding_VD[...]).T * 32 ** -0.5 if tied
             else np.asarray(wide.head_DV[...]))
  np.testing.assert_allclose(got, x_BTD @ head_DV, rtol=1e-5, atol=1e-5)
  rounded = lambda l: np.asarray(jnp.asarray(l).astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(narrow(tokens()), rounded(narrow(tokens())))
  assert not np.array_equal(got, rounded(got))


@pytest.mark.parametrize("pattern,num_layers", [("SG", 6), ("G", 3), ("SSG", 6)])
@pytest.mark.integration
def test_remat_matches_plain(pattern, num_layers):
  t = tokens()
  plain, remat = (build(remat=r, pattern=pattern, num_layers=num_layers) for r in (False, True))

  def loss(m):
    return jnp.mean(m(t) ** 2)

  np.testing.assert_allclose(loss(plain), loss(remat), rtol=1e-6)
  g_plain, g_remat = nnx.grad(loss)(plain), nnx.grad(loss)(remat)
  for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.long
@pytest.mark.integration
def test_remat_stores_only_the_residual_stream_between_repeats():
  """What each extra block adds to the compiled backward pass's peak temporaries: all its
  activations without remat, and little more than one [T, D] residual with it."""
  def temporaries_MiB(remat, num_layers, T=2048):
    model = build(remat=remat, num_layers=num_layers, d_model=64, mlp_dim=256)
    graphdef, state = nnx.split(model)
    t = jnp.zeros((1, T), jnp.int32)
    grad = jax.jit(jax.grad(lambda s: jnp.mean(nnx.merge(graphdef, s)(t) ** 2)))
    return grad.lower(state).compile().memory_analysis().temp_size_in_bytes / 2**20

  # Per extra block, from 2 to 6 blocks (compile time grows with the block count).
  plain_growth = (temporaries_MiB(False, 6) - temporaries_MiB(False, 2)) / 4
  remat_growth = (temporaries_MiB(True, 6) - temporaries_MiB(True, 2)) / 4
  # Each plain block keeps ~14 MiB of [T, 64] and [T, 256] activations at T=2048.
  assert plain_growth > 10, plain_growth
  assert remat_growth < 0.2 * plain_growth, (remat_growth, plain_growth)
