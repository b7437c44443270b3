"""Eval loss by context position: how many earlier tokens of its own document a token's row
holds (report.py's definitions), bucketed, and split at the training length for extrapolation.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.model.definition import ModelDef
from hybrid_nope.model.loss import sums_by_id


def context_positions(segment_ids_BT: np.ndarray) -> np.ndarray:
  """int32 [B, T]: index minus the index where the token's document starts in its row."""
  seg = np.asarray(segment_ids_BT)
  B, T = seg.shape
  index_BT = np.broadcast_to(np.arange(T), (B, T))
  starts = np.ones((B, T), bool)
  starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
  start_BT = np.maximum.accumulate(np.where(starts, index_BT, 0), axis=1)
  return (index_BT - start_BT).astype(np.int32)


@functools.lru_cache(maxsize=16)  # One compilation per model and length, across calls.
def sums_by_context(model_def: ModelDef, num_buckets: int, token_losses=None):
  """(params, batch, bucket_BT, region_BT) -> weighted loss and weight sums per bucket [nb] and
  per region [3]; `token_losses(params, batch)` in place of the model's own
  (`ModelDef.token_losses`: blocked where model.loss_block says so)."""
  def fn(params, batch, bucket_BT, region_BT):
    loss_BT, weights_BT = (token_losses or model_def.token_losses)(params, batch)
    return (sums_by_id(loss_BT, bucket_BT, num_buckets),
            sums_by_id(weights_BT, bucket_BT, num_buckets),
            sums_by_id(loss_BT, region_BT, 3), sums_by_id(weights_BT, region_BT, 3))
  return jax.jit(fn)


def _mean(loss: float, weight: float) -> float | None:
  return float(loss / weight) if weight > 0 else None


def evaluate_by_context(model_def: ModelDef, params, batches: Sequence[dict], *,
                        bucket_size: int, train_seq_len: int,
                        rows_per_call: int | None = None, token_losses=None) -> dict[str, Any]:
  """Eval loss overall and per bucket of `bucket_size` context positions; with T the training
  length, `loss_within` over context positions < T, `loss_near` over [T/2, T), `loss_beyond`
  over >= T, and `ratio` = loss_beyond / loss_near. `rows_per_call` bounds the rows of one
  forward (with model.loss_block 0 it bounds the logits held: rows x seq_len x vocab floats);
  None = a whole eval batch. `token_losses(params, batch) -> (token loss x weight, weight)`:
  a forward in place of the model's (an intervention, `controls.eval_token_losses`; a hashable
  function, one compilation each); every array of a batch is cut into the same rows."""
  T = batches[0]["inputs"].shape[1]
  num_buckets = -(-T // bucket_size)
  fn = sums_by_context(model_def, num_buckets, token_losses)
  sums = [np.zeros(num_buckets), np.zeros(num_buckets), np.zeros(3), np.zeros(3)]
  for batch in batches:
    context_BT = context_positions(batch["segment_ids"])
    region_BT = ((context_BT >= train_seq_len // 2).astype(np.int32)
                 + (context_BT >= train_seq_len))
    chunk = rows_per_call or len(context_BT)
    for i in range(0, len(context_BT), chunk):
      rows = slice(i, i + chunk)
      out = jax.device_get(fn(params, {k: jnp.asarray(v[rows]) for k, v in batch.items()},
                              jnp.asarray(context_BT[rows] // bucket_size),
                              jnp.asarray(region_BT[rows])))
      sums = [s + np.asarray(o, np.float64) for s, o in zip(sums, out)]
  loss_b, weight_b, loss_r, weight_r = sums
  near, beyond = _mean(loss_r[1], weight_r[1]), _mean(loss_r[2], weight_r[2])
  return {
      "seq_len": int(T), "loss": float(loss_b.sum() / weight_b.sum()),
      "bucket_size": int(bucket_size),
      "loss_by_position": [_mean(l, w) for l, w in zip(loss_b, weight_b)],
      "weights": weight_b.tolist(),
      "loss_within": _mean(loss_r[:2].sum(), weight_r[:2].sum()), "loss_near": near,
      "loss_beyond": beyond, "ratio": beyond / near if beyond is not None and near else None,
  }
