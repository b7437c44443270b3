# Tiers (pytest.ini): test_gradient_accumulation_gives_the_updates_of_the_whole_batch compiles the
# train step three times (1, 2 and 4 microbatches; ~30 s cold on 2 cores), so by cost it is
# integration, `make test-all` only.
# test-all only: 2 and 4 microbatches give the losses and parameters of the whole batch, and not
# the mean of microbatch means (test_gradient_accumulation_gives_the_updates_of_the_whole_batch;
# the microbatch split itself is checked here in `make test`); bfloat16 parameters and Adam
# moments stay bfloat16 and train, with train.z_loss logged as its formula gives
# (test_bfloat16_parameters_and_moments_stay_so_and_train_with_z_loss_logged: another train-step
# compile; the dtypes and the z-loss formula are checked in `make test` by test_train_optimizer
# and test_model_loss).
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hybrid_nope.data.pipeline import loader
from hybrid_nope.train.optimizer import learning_rate_schedule, make_optimizer
from hybrid_nope.train.state import init_train_state
from hybrid_nope.model.loss import cross_entropy_sums
from hybrid_nope.train.step import make_eval_step, make_train_step, microbatches, train_step_for
from tests.helpers import tiny_config


def test_steps_on_a_fixed_batch_reduce_loss():
  config = tiny_config(train__warmup_steps=0, train__learning_rate=3e-3, train__steps=30)
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  batch = next(loader.train_iterator(config))
  step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)))
  eval_step = jax.jit(make_eval_step(model_def, np.zeros(config.data.seq_len, np.int32)))
  loss_sum, weight_sum = (float(a[0]) for a in eval_step(state.params, batch))
  losses = []
  for _ in range(15):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  # The first step's loss is the loss at init, as the eval step computes it.
  np.testing.assert_allclose(losses[0], loss_sum / weight_sum, rtol=1e-5)
  assert int(state.step) == 15
  assert losses[-1] < 0.7 * losses[0], losses


import pytest  # noqa: E402


@pytest.mark.integration
def test_bfloat16_parameters_and_moments_stay_so_and_train_with_z_loss_logged():
  """model.param_dtype and train.opt_state_dtype bfloat16 (gradients in float32), with
  train.z_loss on: the loss falls, the state stays bfloat16, and `z_loss` is logged as
  coefficient × the weighted mean of log²Z (numpy, float64, on the logits before the update)."""
  config = tiny_config(train__warmup_steps=0, train__learning_rate=3e-3, train__steps=30,
                       model__param_dtype="bfloat16", train__opt_state_dtype="bfloat16",
                       train__z_loss=1e-2)
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  batch = next(loader.train_iterator(config))
  step = jax.jit(train_step_for(config, model_def, tx))
  logits = np.asarray(model_def.apply(state.params, batch), np.float64)
  log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  weights = np.asarray(batch["weights"], np.float64)
  want_z = 1e-2 * (weights * log_z ** 2).sum() / weights.sum()
  losses = []
  for i in range(15):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
    if i == 0:
      assert float(metrics["z_loss"]) == pytest.approx(want_z, rel=1e-5)
  assert losses[-1] < 0.8 * losses[0], losses
  bf16 = {np.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(state.params)} == bf16
  adam = state.opt_state[1][0]
  assert {x.dtype for x in jax.tree.leaves((adam.mu, adam.nu))} == bf16


@pytest.mark.parametrize("bad", [dict(train__b2=float("nan")),
                                 dict(train__weight_decay=float("nan")),
                                 dict(train__learning_rate=1e30)])
def test_a_non_finite_update_returns_the_old_state_and_says_so(bad):
  """The step-level guard that test_train_loop's end-to-end cases rely on: the update is taken
  only if the new params, optimizer state and loss are all finite."""
  config = tiny_config(train__warmup_steps=0, **bad)
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  batch = next(loader.train_iterator(config))
  step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)))
  before = jax.tree.map(np.asarray, state)
  for _ in range(2):  # lr=1e30 overflows on the second step, once the moments hold a gradient.
    state, metrics = step(state, batch)
  assert not bool(metrics["update_finite"])
  after = jax.tree.map(np.asarray, state)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after.params))
  assert int(after.step) <= 1
  if int(after.step) == 0:  # Refused from the first step: nothing moved.
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before.params),
                                                     jax.tree.leaves(after.params)))


def padded_batches(config, count):
  """Training batches whose rows hold two documents and unequal padding: each row's second half
  is a new document (its own segment id, positions from 0, no loss on its first token), and
  the last 3 × (row index) tokens are padding (segment 0, weight 0), so the microbatches of a
  batch hold different token counts."""
  it = loader.train_iterator(config)
  half = config.data.seq_len // 2
  out = []
  for _ in range(count):
    batch = {k: np.array(v) for k, v in next(it).items()}
    batch["segment_ids"][:, half:] = batch["segment_ids"][:, :1] + 1
    batch["positions"][:, half:] = np.arange(config.data.seq_len - half)
    batch["weights"][:, half] = 0
    for r in range(len(batch["inputs"])):
      pad = 3 * r
      if pad:
        batch["segment_ids"][r, -pad:] = 0
        batch["weights"][r, -pad:] = 0
    out.append(batch)
  return out


@pytest.mark.long
@pytest.mark.integration
def test_gradient_accumulation_gives_the_updates_of_the_whole_batch():
  """Three updates with 1, 2 and 4 microbatches: the same parameters (float32, relative 1e-6).
  A mean of microbatch means would weigh a padded microbatch's tokens more and fail this."""
  config = tiny_config(data__batch_size=8, train__warmup_steps=0, train__learning_rate=3e-3)
  batches = padded_batches(config, 3)
  tx = make_optimizer(config.train)
  params, losses, steps = {}, {}, {}
  for accum in (1, 2, 4):
    model_def, state = init_train_state(config.model, tx, seed=0)
    steps[accum] = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train),
                                           accum))
    losses[accum] = []
    for batch in batches:
      state, metrics = steps[accum](state, batch)
      losses[accum].append(float(metrics["loss"]))
    params[accum] = jax.tree.leaves(jax.tree.map(np.asarray, state.params))
  for accum in (2, 4):
    np.testing.assert_allclose(losses[accum], losses[1], rtol=1e-6)
    for got, want in zip(params[accum], params[1]):
      assert relative(got, want) < 1e-6, relative(got, want)
  # Microbatches hold different token counts, so the mean of their means is another update,
  # far outside that tolerance: the test can tell the two apart.
  assert len({float(batches[0]["weights"][i::4].sum()) for i in range(4)}) > 1
  model_def, state = init_train_state(config.model, tx, seed=0)
  mean_loss = lambda p, b: (lambda l, w: l / w)(*cross_entropy_sums(
      model_def.apply(p, b), b["targets"], b["weights"]))
  micro = microbatches(batches[0], 4)
  grad = jax.jit(jax.grad(mean_loss))  # One compile for the four microbatches.
  grads = jax.tree.map(lambda *g: sum(g) / 4, *[
      grad(state.params, {k: v[i] for k, v in micro.items()}) for i in range(4)])
  updates, _ = tx.update(grads, state.opt_state, state.params)
  means_of_means = jax.tree.leaves(optax.apply_updates(state.params, updates))
  whole = jax.tree.leaves(steps[4](state, batches[0])[0].params)
  assert max(relative(a, b) for a, b in zip(means_of_means, whole)) > 1e-4


def relative(got, want) -> float:
  """‖got − want‖ / ‖want‖ (Adam's sign-like first steps amplify float32 rounding in
  near-zero gradient entries element by element, not in the norm)."""
  return float(np.linalg.norm(np.asarray(got) - np.asarray(want)) / np.linalg.norm(want))


def test_microbatches_spread_each_over_the_batchs_rows():
  x = np.arange(8)[:, None] * np.ones((1, 3), int)
  split = microbatches({"inputs": x}, 4)["inputs"]
  assert split.shape == (4, 2, 3)
  np.testing.assert_array_equal(split[1][:, 0], [1, 5])  # Rows 1 and 5: one from each half.
