"""Score text files on a checkpoint: loss per token, bits per byte and loss by position bucket,
at any length (`launch/score.py`).

Each file is tokenised as training saw documents (the byte tokenizer with BOS, or the data's
tokenizer.json) and cut into rows of `seq_len` targets, each row its own context from position
0, so every token after the first is scored exactly once. A row shorter than `seq_len` is
padded (segment 0, weight 0). NoPE and SWA layers have no position limit, so `seq_len` may
exceed the training length; position buckets then show how the loss holds up past it.
Bits per byte = total nats / ln 2 / the file's UTF-8 bytes, lm-evaluation-harness's convention.
"""
from __future__ import annotations

import math
import os

import jax
import numpy as np

from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.run.checkpoints import AnalysisError
from hybrid_nope.run.reader import RunReader
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.tokenization.text_codec import text_codec
from hybrid_nope.model.loss import sums_by_bucket


def tokenizer_for(config, tokenizer_path: str | None = None):
  """text -> int ids: the byte tokenizer (data.source=stdlib) with BOS, or a tokenizer.json
  (`tokenizer_path`, else the one the data carries) with its own special tokens
  (data/tokenization/text_codec.py)."""
  return text_codec(config, tokenizer_path).encode


def file_rows(ids: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
  """Rows [R, seq_len] of one document's ids: row k predicts ids[k·T + 1 : (k+1)·T + 1] from
  ids[k·T : (k+1)·T], positions from 0; the tail is padding."""
  targets = len(ids) - 1
  if targets < 1:
    raise AnalysisError("a file must give at least two tokens to score one")
  count = -(-targets // seq_len)
  rows = {k: np.zeros((count, seq_len), np.int32) for k in loader.BATCH_KEYS}
  rows["weights"] = np.zeros((count, seq_len), np.float32)
  for r in range(count):
    n = min(seq_len, targets - r * seq_len)
    start = r * seq_len
    rows["inputs"][r, :n] = ids[start:start + n]
    rows["targets"][r, :n] = ids[start + 1:start + n + 1]
    rows["weights"][r, :n] = 1.0
    rows["positions"][r, :n] = np.arange(n)
    rows["segment_ids"][r, :n] = 1
  return rows


def score_files(run: RunReader, files: list[str], *, step: int | None = None,
                seq_len: int | None = None, bucket_size: int | None = None,
                tokenizer_path: str | None = None, rows_per_call: int = 8,
                overrides: dict | None = None) -> dict:
  """{"step", "seq_len", "files": [per file: tokens, bytes, loss, bits_per_byte,
  loss_by_position], "total": the same over all files}."""
  config = checkpoints.apply_overrides(run.config, overrides)
  seq_len = seq_len or config.data.seq_len
  bucket_size = bucket_size or min(config.eval.bucket_size, seq_len)
  step, model_def, params = checkpointed.restore_params(run.with_config(config), step)
  encode = tokenizer_for(config, run.tokenizer_path(tokenizer_path))
  buckets_T = loader.position_buckets(seq_len, bucket_size)
  num_buckets = int(buckets_T.max()) + 1

  @jax.jit
  def sums(params, batch):
    return sums_by_bucket(*model_def.token_losses(params, batch), buckets_T, num_buckets)

  results, total_loss, total_weight, total_bytes = [], np.zeros(num_buckets), np.zeros(
      num_buckets), 0
  for path in files:
    if not os.path.isfile(path):
      raise AnalysisError(f"{path} is not a file to score")
    with open(path, "rb") as f:
      data = f.read()
    rows = file_rows(encode(data.decode("utf-8", errors="replace")), seq_len)
    loss_b, weight_b = np.zeros(num_buckets), np.zeros(num_buckets)
    for start in range(0, len(rows["inputs"]), rows_per_call):
      batch = {k: v[start:start + rows_per_call] for k, v in rows.items()}
      l, w = jax.device_get(sums(params, batch))
      loss_b, weight_b = loss_b + np.asarray(l, np.float64), weight_b + np.asarray(w, np.float64)
    results.append(_summary(path, loss_b, weight_b, len(data), bucket_size))
    total_loss, total_weight, total_bytes = total_loss + loss_b, total_weight + weight_b, (
        total_bytes + len(data))
  return {"step": step, "seq_len": seq_len, "training_seq_len": config.data.seq_len,
          "files": results,
          "total": _summary("(all files)", total_loss, total_weight, total_bytes, bucket_size)}


def _summary(name: str, loss_b, weight_b, num_bytes: int, bucket_size: int) -> dict:
  nats = float(loss_b.sum())
  return {"file": name, "tokens": int(weight_b.sum()), "bytes": num_bytes,
          "loss": nats / float(weight_b.sum()), "bits_per_byte": nats / math.log(2) / num_bytes,
          "bucket_size": bucket_size,
          "loss_by_position": [float(l / w) if w else None for l, w in zip(loss_b, weight_b)]}


def table(result: dict) -> str:
  """The result as a Markdown table, then the loss by position bucket of all files."""
  lines = [f"step {result['step']}, seq_len {result['seq_len']} (trained at "
           f"{result['training_seq_len']})", "",
           "| file | tokens | bytes | loss / token | bits / byte |", "|---|---|---|---|---|"]
  for r in result["files"] + [result["total"]]:
    lines.append(f"| {r['file']} | {r['tokens']} | {r['bytes']} | {r['loss']:.4f} | "
                 f"{r['bits_per_byte']:.4f} |")
  total = result["total"]
  lines += ["", f"loss by position (buckets of {total['bucket_size']}): " + " ".join(
      "-" if l is None else f"{l:.3f}" for l in total["loss_by_position"])]
  return "\n".join(lines)
