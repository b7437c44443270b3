"""Cost of the in-loop recency hook against one interval between measurements, on this machine.

  python benchmarks/recency_hook.py                 # demo and 120m at seq_len 8192
  python benchmarks/recency_hook.py --configs=demo

The interval is metrics.every_steps × the measured train step time. For configs whose full
batch is too slow to step on a CPU, one sequence is timed and scaled linearly to
data.batch_size (stated in the table).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.train_step import synthetic_batch  # noqa: E402
from configs import base, demo  # noqa: E402
from hybrid_nope.analysis.measure.hook import RecencyHook  # noqa: E402
from hybrid_nope.train.optimizer import make_optimizer  # noqa: E402
from hybrid_nope.train.state import init_train_state  # noqa: E402
from hybrid_nope.run.metrics_writer import MetricsWriter  # noqa: E402
from hybrid_nope.train.step import train_step_for  # noqa: E402


def _timed(hook, step, params):
  start = time.perf_counter()
  hook(step, params)
  return time.perf_counter() - start


def device_batch(batch_size, seq_len, vocab):
  return jax.tree.map(jnp.asarray, synthetic_batch(batch_size, seq_len, vocab))


def measure(name, config, step_batch):
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  T, V = config.data.seq_len, config.model.vocab_size
  probe = synthetic_batch(config.metrics.probe_batch_size, T, V)
  # A real writer in a scratch directory: the hook's records, TensorBoard scalars and
  # per-document sums are written as in a run, and their cost is the hook's.
  writer = MetricsWriter(tempfile.mkdtemp(prefix="recency_hook_"))
  hook = RecencyHook(config, model_def, probe, writer, place=lambda t: jax.tree.map(
      jnp.asarray, t))
  first = _timed(hook, 0, state.params)
  hook_seconds = _timed(hook, 1, state.params)
  step = jax.jit(train_step_for(config, model_def, tx),
                 donate_argnums=0)
  batch = device_batch(step_batch, T, V)
  state, m = step(state, batch)
  jax.block_until_ready(m)
  start = time.perf_counter()
  state, m = step(state, batch)
  jax.block_until_ready(m)
  step_seconds = (time.perf_counter() - start) * config.data.batch_size / step_batch
  interval = step_seconds * config.metrics.every_steps
  print(f"| {name} | {config.data.seq_len} | {config.metrics.probe_batch_size} × "
        f"{config.metrics.query_positions or 'all'} | {first:.2f} | {hook_seconds:.2f} | "
        f"{step_seconds:.2f}{'' if step_batch == config.data.batch_size else f' (from batch {step_batch})'}"
        f" | {config.metrics.every_steps} | {100 * hook_seconds / interval:.3f}% |", flush=True)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--configs", default="demo,120m")
  args = p.parse_args()
  print("| config | seq_len | probe (sequences × query positions) | hook s (with compile) | "
        "hook s | train step s | recency every | hook / interval |")
  print("|---|---|---|---|---|---|---|---|")
  for name in args.configs.split(","):
    if name == "demo":
      c = demo.get_config()
      measure("demo", c, c.data.batch_size)
    else:
      c = base.experiment(name, 256)
      c.model.vocab_size = 32000  # CPU memory; the hook never touches the output head.
      c.model.remat = True
      c.model.dtype = "float32"
      measure(f"swa256_{name} (vocab 32000)", c, 1)


if __name__ == "__main__":
  main()
