"""model/head.py: the blocked head and loss equal the full logits' (values, gradients with
respect to the head input and the unembedding, z-loss, padding, blocks that do not divide T,
bfloat16), the eval loss by position is unchanged, and the compiled train step holds no
[B, T, V] buffer (where the full path's does)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope.data.pipeline import loader
from hybrid_nope.errors import ConfigError
from hybrid_nope.model import head, loss
from hybrid_nope.train.optimizer import learning_rate_schedule, make_optimizer
from hybrid_nope.train.state import init_train_state
from hybrid_nope.train.step import make_eval_step, make_train_step
from hybrid_nope.validate import validate
from tests.helpers import largest_buffer, tiny_config

B, T, D, V = 3, 20, 16, 50


def inputs(dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((B, T, D)), dtype)
  w = jnp.asarray(rng.standard_normal((D, V)) * 0.5, jnp.float32)
  targets = jnp.asarray(rng.integers(0, V, (B, T)))
  weights = jnp.asarray(rng.random((B, T)) > 0.25, jnp.float32)  # Padding and masked tokens.
  return x, w, targets, weights


def full(x, w, targets, weights, z_loss, scale, dtype):
  sums = loss.objective_sums(head.head_logits(x, w, scale, dtype), targets, weights, z_loss)
  return sums["loss"] + sums["z_loss"], sums


def blocked(x, w, targets, weights, z_loss, scale, dtype, block):
  return head.objective_sums(x, w, targets, weights, z_loss=z_loss, block=block, scale=scale,
                             dtype=dtype)


def relative(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
@pytest.mark.parametrize("block", [1, 6, 20, 64])  # 6 and 1 of 20 ragged / exact; 64 > T.
@pytest.mark.parametrize("scale", [1.0, D ** -0.5])  # Untied head, tied head.
def test_loss_and_gradients_equal_the_full_logits_in_float32(z_loss, block, scale):
  x, w, targets, weights = inputs()
  grad = lambda f, *a: jax.value_and_grad(f, (0, 1), has_aux=True)(x, w, targets, weights, *a)
  (want, want_sums), (want_dx, want_dw) = grad(full, z_loss, scale, jnp.float32)
  (got, got_sums), (got_dx, got_dw) = grad(blocked, z_loss, scale, jnp.float32, block)
  assert relative(got, want) <= 1e-6
  for key in loss.OBJECTIVE_SUMS:
    np.testing.assert_allclose(got_sums[key], want_sums[key], rtol=1e-6)
  assert relative(got_dx, want_dx) <= 1e-6, relative(got_dx, want_dx)
  assert relative(got_dw, want_dw) <= 1e-6, relative(got_dw, want_dw)
  # The padding's gradient is exactly 0, as the full path's.
  assert np.all(np.asarray(got_dx)[np.asarray(weights) == 0] == 0)


def test_bfloat16_head_inputs_match_the_full_path_to_bfloat16_rounding():
  """Head input and matmul in bfloat16 (model.dtype bfloat16, logits_dtype compute): the head
  input's gradient comes back in bfloat16, the unembedding's in its float32."""
  x, w, targets, weights = inputs(jnp.bfloat16)
  grad = lambda f, *a: jax.value_and_grad(f, (0, 1), has_aux=True)(x, w, targets, weights, *a)
  (want, _), (want_dx, want_dw) = grad(full, 1e-3, D ** -0.5, jnp.bfloat16)
  (got, _), (got_dx, got_dw) = grad(blocked, 1e-3, D ** -0.5, jnp.bfloat16, 6)
  assert got_dx.dtype == jnp.bfloat16 and got_dw.dtype == jnp.float32
  assert relative(got, want) <= 1e-6  # The same bfloat16 logits, float32 from there on.
  # The full path rounds the head's gradient to bfloat16 once; the blocked one accumulates it
  # in float32 over the blocks, and rounds each block's logit gradient (one bfloat16 ulp).
  assert relative(got_dx, want_dx) <= 1e-2 and relative(got_dw, want_dw) <= 1e-2


def test_token_losses_equal_the_full_paths():
  x, w, targets, weights = inputs()
  want_BT, want_w = loss.weighted_token_losses(head.head_logits(x, w, 1.0, jnp.float32), targets,
                                               weights)
  got_BT, got_w = head.token_losses(x, w, targets, weights, block=6)
  assert got_BT.shape == (B, T)
  np.testing.assert_allclose(got_BT, want_BT, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got_w, want_w)


def tiny(loss_block, **overrides):
  return tiny_config(**{"model__loss_block": loss_block, "model__vocab_size": 300,
                        "train__warmup_steps": 0, **overrides})


def test_the_train_and_eval_steps_are_those_of_the_full_path():
  """A whole model (tied head; z-loss): the train step's gradients of every parameter and its
  metrics, and the eval loss by position, with blocks of 24 (not dividing seq_len 64) and
  without."""
  results = {}
  for loss_block in (0, 24):
    config = tiny(loss_block, train__z_loss=1e-3)
    tx = make_optimizer(config.train)
    model_def, state = init_train_state(config.model, tx, seed=0)
    assert model_def.bind(state.params).tie_embeddings
    batch = next(loader.train_iterator(config))
    grads = jax.jit(jax.grad(lambda p: model_def.objective_sums(p, batch, 1e-3)[0]))(state.params)
    _, metrics = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train),
                                         z_loss=1e-3))(state, batch)
    buckets = np.arange(config.data.seq_len) // 16
    by_bucket = jax.jit(make_eval_step(model_def, buckets))(state.params, batch)
    results[loss_block] = grads, metrics, by_bucket
  (g0, m0, e0), (g1, m1, e1) = results[0], results[24]
  worst = max(jax.tree.leaves(jax.tree.map(relative, g1, g0)))
  assert worst <= 1e-5, worst
  for key in ("loss", "z_loss", "grad_norm"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-6)
  np.testing.assert_allclose(e1[0], e0[0], rtol=1e-6)
  np.testing.assert_array_equal(e1[1], e0[1])


def test_the_blocked_train_step_holds_no_logits_of_the_whole_batch():
  """XLA's optimised module of the whole step: with model.loss_block no buffer reaches a
  quarter of [B, T, V] (a block is 1/16), and the temporaries are smaller than the full path's
  by more than one float32 copy of the logits; the full path holds [B, T, V] (the check can
  fail)."""
  found = {}
  rows, length, vocab = 4, 256, 2048
  for loss_block in (0, 16):
    config = tiny(loss_block, data__batch_size=rows, data__seq_len=length,
                  model__vocab_size=vocab)
    tx = make_optimizer(config.train)
    model_def, state = init_train_state(config.model, tx, seed=0)
    batch = next(loader.train_iterator(config))
    step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)))
    compiled = step.lower(state, batch).compile()
    found[loss_block] = (largest_buffer(compiled.as_text()),
                         compiled.memory_analysis().temp_size_in_bytes)
  logits = rows * length * vocab
  assert found[0][0] >= logits, found
  assert found[16][0] <= logits / 16, found
  assert found[0][1] - found[16][1] > 4 * logits, found


def test_a_negative_block_fails_naming_the_key():
  with pytest.raises(ConfigError, match="model.loss_block"):
    validate(tiny(-1), check_paths=False)
