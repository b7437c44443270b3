"""Token cross-entropy with per-token weights (0 for padding and each document's first token)."""
from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import optax


def cross_entropy_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array):
  """(sum of weighted token losses, sum of weights), so means combine exactly across batches."""
  losses_BT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV.astype(jnp.float32), targets_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  return jnp.sum(losses_BT * weights_BT), jnp.sum(weights_BT)


def cross_entropy_by_bucket(logits_BTV, targets_BT, weights_BT, bucket_T, num_buckets: int):
  """Per position bucket: (sum of weighted token losses [nb], sum of weights [nb])."""
  losses_BT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV.astype(jnp.float32), targets_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  loss_T, weight_T = jnp.sum(losses_BT * weights_BT, 0), jnp.sum(weights_BT, 0)
  return (jax.ops.segment_sum(loss_T, bucket_T, num_buckets),
          jax.ops.segment_sum(weight_T, bucket_T, num_buckets))


def unigram_entropy(targets_BT, weights_BT) -> float:
  """Entropy (nats) of the weighted target-token distribution: the loss a model that ignores
  context entirely could reach, so a trained model's loss should be clearly below it."""
  targets = np.asarray(targets_BT).ravel()
  weights = np.asarray(weights_BT, np.float64).ravel()
  counts = np.bincount(targets, weights=weights)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())
