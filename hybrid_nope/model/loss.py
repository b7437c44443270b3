"""Token cross-entropy with per-token weights (0 for padding and each document's first token):
the one loss of training, eval and checkpoint analysis; and training's objective, that loss
plus train.z_loss's auxiliary term."""
from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import optax


def weighted_token_losses(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array):
  """(token loss x weight [B, T], weight [B, T]), in float32."""
  losses_BT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV.astype(jnp.float32), targets_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  return losses_BT * weights_BT, weights_BT


def cross_entropy_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array):
  """(sum of weighted token losses, sum of weights), so means combine exactly across batches."""
  loss_BT, weights_BT = weighted_token_losses(logits_BTV, targets_BT, weights_BT)
  return jnp.sum(loss_BT), jnp.sum(weights_BT)


OBJECTIVE_SUMS = ("loss", "weight", "z_loss")  # The keys of objective_sums' dict.


def objective_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array,
                   z_loss: float = 0.0) -> dict:
  """The train step's sums, each a float32 scalar: "loss" and "weight" (as cross_entropy_sums)
  and "z_loss": z_loss × Σ weight · log²Z, Z the softmax normaliser of each token's logits
  (PaLM, Chowdhery et al. 2022, §5, with 1e-4: it keeps log Z near 0, so the logits cannot
  drift); 0 and not computed where z_loss is 0. The objective is ("loss" + "z_loss") / "weight"."""
  loss, weight = cross_entropy_sums(logits_BTV, targets_BT, weights_BT)
  if not z_loss:
    return {"loss": loss, "weight": weight, "z_loss": jnp.zeros((), jnp.float32)}
  log_z_BT = jax.nn.logsumexp(logits_BTV.astype(jnp.float32), axis=-1)
  return {"loss": loss, "weight": weight,
          "z_loss": z_loss * jnp.sum(jnp.square(log_z_BT) * weights_BT.astype(jnp.float32))}


def sums_by_id(x_BT: jax.Array, ids_BT: jax.Array, num_ids: int) -> jax.Array:
  """[num_ids]: the sum of x over the entries with each id (a bucket, a region)."""
  return jax.ops.segment_sum(x_BT.ravel(), jnp.broadcast_to(ids_BT, x_BT.shape).ravel(),
                             num_ids)


def sums_by_bucket(loss_BT, weights_BT, bucket_T, num_buckets: int):
  """Per position bucket: (sum of weighted token losses [nb], sum of weights [nb]), from
  `weighted_token_losses`' pair (or `ModelDef.token_losses`', blocked or not)."""
  return sums_by_id(loss_BT, bucket_T, num_buckets), sums_by_id(weights_BT, bucket_T, num_buckets)


# The record key of the eval set's unigram entropy (metrics.jsonl at step 0; the loss plots'
# baseline): named here, beside the function, for the trainer and the analysis both.
UNIGRAM_ENTROPY_KEY = "eval_unigram_entropy"


def unigram_entropy(targets_BT, weights_BT) -> float:
  """Entropy (nats) of the weighted target-token distribution: the loss a model that ignores
  context entirely could reach, so a trained model's loss should be clearly below it."""
  targets = np.asarray(targets_BT).ravel()
  weights = np.asarray(weights_BT, np.float64).ravel()
  counts = np.bincount(targets, weights=weights)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())
