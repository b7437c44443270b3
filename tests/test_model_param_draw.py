import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.model import param_draw
from hybrid_nope.model.layers import EMBEDDING_INIT, default_init, param
from tests.helpers import REPO, xla_flags

KEY = jax.random.key(7)


@pytest.mark.parametrize("shape", [(768, 3328), (3328, 768), (12, 64), (1, 5)])
def test_inits_equal_jax_initialisers_bit_for_bit(shape):
  """The independent reference: jax's own variance-scaling and normal initialisers."""
  pairs = ((default_init, nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")),
           (EMBEDDING_INIT, nnx.initializers.normal(stddev=1.0)))
  for ours, theirs in pairs:
    np.testing.assert_array_equal(np.asarray(ours(KEY, shape)), np.asarray(theirs(KEY, shape)))


@pytest.mark.parametrize("fan_in,fan_out", [
    (3, 5),                                  # one block, mostly unused
    (512, 512),                              # exactly one block
    (700, 801),                              # three blocks, a partial last one
])
@pytest.mark.parametrize("init", [default_init, EMBEDDING_INIT], ids=["truncated", "normal"])
def test_blocks_laid_end_to_end_are_the_whole_draw(fan_in, fan_out, init):
  assert fan_in * fan_out != param_draw.BLOCK or (fan_in, fan_out) == (512, 512)
  whole = jax.jit(lambda k: init(k, (fan_in, fan_out)))(KEY)
  blocked = param_draw.drawn_matrix(KEY, init, fan_in, fan_out)
  assert blocked.dtype == np.float32 and blocked.shape == (fan_in, fan_out)
  np.testing.assert_array_equal(blocked, np.asarray(whole))


def test_one_program_per_distribution_whatever_the_shapes():
  param_draw._block.clear_cache()
  for shape in [(9, 31), (31, 9), (300, 1000), (40, 41)]:
    param_draw.drawn_matrix(KEY, default_init, *shape)
  assert param_draw._block._cache_size() == 1


def test_an_unknown_distribution_is_refused():
  with pytest.raises(ValueError, match="'uniform': expected 'truncated_normal' or 'normal'"):
    param_draw.Init("uniform", fan_in_scaled=True)


def test_an_offset_key_draws_32_bit_samples_and_derives_no_keys():
  """The offset PRNG serves the block draws only: a split, a fold-in or another width would
  not be the parameter's own draw, so each fails rather than return other bits."""
  offset_key = jax.random.wrap_key_data(np.array([1, 2, 0], np.uint32),
                                        impl=param_draw._OFFSET_THREEFRY)
  for derive in (lambda: jax.random.split(offset_key), lambda: jax.random.fold_in(offset_key, 1)):
    with pytest.raises(NotImplementedError, match="an offset key only draws"):
      derive()
  with pytest.raises(NotImplementedError, match="take 32-bit samples, not 16-bit"):
    jax.random.bits(offset_key, (4,), np.uint16)
  # A 32-bit draw works, and an offset of 3 is the same key's draw from its fourth element on.
  at_3 = jax.random.wrap_key_data(np.array([1, 2, 3], np.uint32), impl=param_draw._OFFSET_THREEFRY)
  np.testing.assert_array_equal(jax.random.bits(at_3, (4,), np.uint32),
                                jax.random.bits(offset_key, (7,), np.uint32)[3:])


def test_only_concrete_partitionable_threefry_keys_are_drawn_in_blocks():
  assert param_draw.blockable(KEY, 10)
  assert not param_draw.blockable(jax.random.key(0, impl="rbg"), 10)
  assert not param_draw.blockable(KEY, 2 ** 32)
  jax.jit(lambda k: param_draw.blockable(k, 10) and 1 / 0)(KEY)  # False inside a trace


@pytest.mark.parametrize("shape,in_axes", [((6, 4, 5), (0,)), ((4, 5, 6), (0, 1)),
                                           ((4, 5, 6), (1,))])
def test_param_drawn_eagerly_equals_its_draw_inside_a_trace(shape, in_axes):
  """Layout (fan-in axes first, then back in place) is the same on the host as in a trace."""
  axes = (None,) * len(shape)
  eager = param(nnx.Rngs(3), default_init, shape, axes, in_axes)[...]
  traced = jax.jit(lambda: param(nnx.Rngs(3), default_init, shape, axes, in_axes)[...])()
  assert eager.shape == shape
  np.testing.assert_array_equal(np.asarray(eager), np.asarray(traced))


_SHARDED = """
import jax, numpy as np
from flax import nnx
from hybrid_nope.model.layers import default_init, param
from hybrid_nope.train import sharding
mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"))
with sharding.activation_rules(mesh):
  value = param(nnx.Rngs(3), default_init, (16, 8, 4), ("embed", "heads", "kv"))[...]
whole = jax.jit(lambda: param(nnx.Rngs(3), default_init, (16, 8, 4), (None,) * 3)[...])()
assert tuple(value.sharding.spec) == ("fsdp", "tensor", None), value.sharding.spec
assert len(value.addressable_shards) == 8 and value.addressable_shards[0].data.shape == (8, 2, 4)
np.testing.assert_array_equal(np.asarray(value), np.asarray(whole))
print("OK")
"""


def test_param_is_placed_in_its_shards_with_the_whole_draws_values():
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices=8), JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-c", _SHARDED], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]
