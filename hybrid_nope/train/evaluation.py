"""Evaluation: the eval rows at each length multiple, their jitted steps, and the loss by
position bucket that each eval record holds."""
from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np
from absl import logging

from hybrid_nope.data.pipeline import loader
from hybrid_nope.model.loss import unigram_entropy
from hybrid_nope.run.run_dir import METRICS
from hybrid_nope.train import sharding
from hybrid_nope.train.step import make_eval_step


@dataclasses.dataclass
class EvalSet:
  """The eval rows at one multiple k of the training length, and the step that scores them."""
  multiple: int
  batches: list
  step: object
  bucket_size: int

  @property
  def suffix(self) -> str:  # Record keys: eval_loss (k = 1), eval_loss@2x, ...
    return "" if self.multiple == 1 else f"@{self.multiple}x"


def evaluate(eval_step, params, batches, bucket_size: int, suffix: str = "") -> dict:
  """Mean eval loss, and the loss per bucket of `bucket_size` positions (None where empty)."""
  loss_b = weight_b = 0.0
  for batch in batches:
    l, w = jax.device_get(eval_step(params, batch))
    loss_b, weight_b = loss_b + np.asarray(l, np.float64), weight_b + np.asarray(w, np.float64)
  by_position = [float(l / w) if w > 0 else None for l, w in zip(loss_b, weight_b)]
  return {f"eval_loss{suffix}": float(loss_b.sum() / weight_b.sum()),
          f"eval_loss_by_position{suffix}": by_position, "eval_bucket_size": bucket_size,
          f"eval_bucket_weights{suffix}": weight_b.tolist()}


def evaluate_and_log(eval_sets: list, params, writer, step: int) -> float:
  """Evaluates at every length multiple, writes one record and the TensorBoard scalars, logs;
  returns the eval loss at the training length."""
  record = {"step": step}
  for ev in eval_sets:
    result = evaluate(ev.step, params, ev.batches, ev.bucket_size, ev.suffix)
    record.update(result)
    by_position = result[f"eval_loss_by_position{ev.suffix}"]
    writer.write_scalars(step, {f"eval_loss{ev.suffix}": result[f"eval_loss{ev.suffix}"], **{
        f"eval_loss_by_position{ev.suffix}/{b * ev.bucket_size:06d}": l
        for b, l in enumerate(by_position) if l is not None}})
    logging.info("step %d | eval_loss%s %.4f | by %d positions: %s", step, ev.suffix,
                 result[f"eval_loss{ev.suffix}"], ev.bucket_size,
                 " ".join("-" if l is None else f"{l:.3f}" for l in by_position))
  writer.write_record(METRICS, record)
  return record["eval_loss"]


def process_rows(batch: dict) -> dict:
  """This process's contiguous share of a batch every process holds whole (eval)."""
  p, n = jax.process_index(), jax.process_count()
  size = len(next(iter(batch.values()))) // n
  return {k: v[p * size:(p + 1) * size] for k, v in batch.items()}


def eval_rows(config) -> tuple[list[dict], float]:
  """(the eval batches, their unigram entropy: the loss of a model that ignores context)."""
  eval_rows = loader.eval_batches(config)
  entropy = unigram_entropy(np.concatenate([b["targets"] for b in eval_rows]),
                            np.concatenate([b["weights"] for b in eval_rows]))
  logging.info("eval-set unigram entropy %.4f nats/token (context-free baseline)", entropy)
  return eval_rows, entropy


def eval_sets(config, mesh, model_def, state_shardings, eval_rows) -> list[EvalSet]:
  """The eval rows and a jitted eval step at each of eval.length_multiples (k × seq_len).
  (Compiling them here, before the init hook, made the hook's splash-attention trace on an
  8-device mesh fail on a mesh mismatch; so they compile at the first eval, whose time the ETA
  leaves out of the eval mean once a second eval is timed.)"""
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in loader.BATCH_KEYS}
  sets = []
  for k in sorted(config.eval.length_multiples):
    seq_len = k * config.data.seq_len
    if k == 1:
      rows = eval_rows
    else:
      longer = ml_collections.ConfigDict(config.to_dict())
      longer.data.seq_len = seq_len
      rows = loader.eval_batches(longer)
    buckets = loader.position_buckets(seq_len, config.eval.bucket_size)
    step = jax.jit(make_eval_step(model_def, buckets),
                   in_shardings=(state_shardings.params, batch_shardings),
                   out_shardings=sharding.replicated(mesh))
    sets.append(EvalSet(k, [sharding.global_batch(process_rows(b), mesh) for b in rows], step,
                        config.eval.bucket_size))
  return sets
