"""analysis/checkpoint/context_loss.py: context positions restart at each document, the loss
by context position and its regions are the token losses' own weighted means, and with
model.loss_block the clean and intervened evals equal the full logits' without holding them."""
import jax
import numpy as np

from hybrid_nope.analysis.checkpoint import context_loss, controls
from hybrid_nope.data.pipeline import loader
from hybrid_nope.model.definition import init_model
from hybrid_nope.model.loss import weighted_token_losses
from tests.helpers import largest_buffer, tiny_config


def test_context_positions_restart_at_each_document():
  seg = np.array([[3, 3, 4, 4, 4, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(context_loss.context_positions(seg),
                                [[0, 1, 0, 1, 2, 0, 1], [0, 1, 2, 3, 4, 5, 6]])


def test_buckets_and_regions_are_weighted_means_of_the_token_losses():
  config = tiny_config()
  model_def, params = init_model(config.model, 0)
  batches = loader.eval_batches(config)
  train_seq_len, bucket = config.data.seq_len // 2, 8  # Rows twice the "training" length.
  got = context_loss.evaluate_by_context(model_def, params, batches, bucket_size=bucket,
                                         train_seq_len=train_seq_len, rows_per_call=1)
  loss, weight, context = [], [], []
  for batch in batches:
    loss_BT, weights_BT = jax.device_get(weighted_token_losses(
        model_def.apply(params, batch), batch["targets"], batch["weights"]))
    loss.append(loss_BT), weight.append(weights_BT)
    context.append(context_loss.context_positions(batch["segment_ids"]))
  loss, weight, context = (np.concatenate(x).ravel() for x in (loss, weight, context))
  mean = lambda where: loss[where].sum() / weight[where].sum()
  np.testing.assert_allclose(got["loss"], mean(np.ones_like(context, bool)), rtol=1e-5)
  np.testing.assert_allclose(got["loss_within"], mean(context < train_seq_len), rtol=1e-5)
  near = mean((context >= train_seq_len // 2) & (context < train_seq_len))
  beyond = mean(context >= train_seq_len)
  np.testing.assert_allclose([got["loss_near"], got["loss_beyond"], got["ratio"]],
                             [near, beyond, beyond / near], rtol=1e-5)
  np.testing.assert_allclose(got["loss_by_position"][1], mean(context // bucket == 1), rtol=1e-5)
  np.testing.assert_allclose(sum(got["weights"]), weight.sum(), rtol=1e-6)


def test_with_a_loss_block_the_evals_are_the_full_logits_and_never_hold_them():
  """The same params with model.loss_block 0 and 16: the eval by context position, clean and
  under the noise control (the causal test's intervened forward), agrees; its compiled program
  holds a [rows, T, V] buffer only without the block (the check can fail)."""
  got, largest = {}, {}
  for block in (0, 16):
    config = tiny_config(model__loss_block=block, model__vocab_size=2048)
    model_def, params = init_model(config.model, 0)
    batches = loader.eval_batches(config)[:1]
    noisy = controls.for_condition(controls.with_permutations(batches), controls.NOISE, 0.5)
    token_losses = controls.eval_token_losses(model_def, (0,), config.model.d_model)
    kw = dict(bucket_size=8, train_seq_len=config.data.seq_len)
    got[block] = [context_loss.evaluate_by_context(model_def, params, b, token_losses=f, **kw)
                  for b, f in ((batches, None), (noisy, token_losses))]
    T = config.data.seq_len
    context_BT = np.zeros(noisy[0]["inputs"].shape, np.int32)  # Shapes only: what it holds.
    compiled = context_loss.sums_by_context(model_def, -(-T // 8), token_losses).lower(
        params, noisy[0], context_BT, context_BT).compile()
    largest[block] = largest_buffer(compiled.as_text())
    logits = np.prod(batches[0]["inputs"].shape) * config.model.vocab_size
  for full, blocked in zip(got[0], got[16]):
    np.testing.assert_allclose(blocked["loss"], full["loss"], rtol=1e-5)
    np.testing.assert_allclose(blocked["loss_by_position"], full["loss_by_position"], rtol=1e-5)
  assert got[0][1]["loss"] != got[0][0]["loss"]  # The intervention reached the loss.
  assert largest[0] >= logits and largest[16] <= logits / 2, (largest, logits)
