"""Training throughput on this machine: step time, tokens/s, model FLOPs/token and MFU.

  python benchmarks/train_step.py                       # the table in docs/performance.md
  python benchmarks/train_step.py --sizes=120m --seq_lens=2048 --patterns=SG

MFU counts model FLOPs honestly (hybrid_nope.train.flops.flops_per_token: 6 × matmul params
incl. the output head, plus attention over the query-key pairs actually attended) against
the measured float32 matmul rate of this machine (the roofline). Vocabulary 32000 for the
named sizes (the Llama-3 table of 128256 would dominate a CPU step), batch 1, float32.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs import base, demo  # noqa: E402
from hybrid_nope.train.flops import flops_per_token, measure_matmul_flops  # noqa: E402
from hybrid_nope.train.optimizer import learning_rate_schedule, make_optimizer  # noqa: E402
from hybrid_nope.train.state import init_train_state  # noqa: E402
from hybrid_nope.train.step import make_train_step  # noqa: E402


def config_for(size: str, pattern: str, seq_len: int, vocab: int, remat: bool):
  c = demo.get_config() if size == "demo" else base.experiment(size, 256)
  c.model.pattern = pattern
  if size != "demo":
    c.model.vocab_size = vocab
  c.model.remat = remat
  c.model.dtype = "float32"
  c.data.seq_len = seq_len
  return c


def time_steps(config, batch_size: int, steps: int) -> float:
  """Median seconds per train step after one compile step."""
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)),
                 donate_argnums=0)
  T = config.data.seq_len
  rng = np.random.default_rng(0)
  batch = {"inputs": jnp.asarray(rng.integers(0, 256, (batch_size, T)), jnp.int32),
           "targets": jnp.asarray(rng.integers(0, 256, (batch_size, T)), jnp.int32),
           "segment_ids": jnp.ones((batch_size, T), jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (batch_size, T)),
           "weights": jnp.ones((batch_size, T), jnp.float32)}
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", default="demo,120m,350m")
  p.add_argument("--seq_lens", default="2048,8192")
  p.add_argument("--patterns", default="SG,G", help="SG = hybrid (window 256), G = baseline")
  p.add_argument("--batch_size", type=int, default=1)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--remat_from", type=int, default=8192,
                 help="rematerialise blocks at this seq_len and above (memory)")
  args = p.parse_args()
  roofline = measure_matmul_flops()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; float32 matmul roofline "
        f"{roofline / 1e9:.1f} GFLOP/s (2048² matmul)\n")
  print("| size | pattern | seq_len | remat | step s | tokens/s | GFLOP/token | MFU |")
  print("|---|---|---|---|---|---|---|---|")
  rates = {}
  for size in args.sizes.split(","):
    for seq_len in map(int, args.seq_lens.split(",")):
      for pattern in args.patterns.split(","):
        config = config_for(size, pattern, seq_len, args.vocab, seq_len >= args.remat_from)
        seconds = time_steps(config, args.batch_size, args.steps)
        tokens_per_second = args.batch_size * seq_len / seconds
        fpt = flops_per_token(config.model, seq_len)
        mfu = tokens_per_second * fpt / roofline
        rates[(size, seq_len, pattern)] = tokens_per_second
        print(f"| {size} | {pattern} | {seq_len} | {config.model.remat} | {seconds:.3f} | "
              f"{tokens_per_second:.0f} | {fpt / 1e9:.3f} | {100 * mfu:.1f}% |", flush=True)
  print()
  for (size, seq_len, pattern), rate in rates.items():
    if pattern == "SG" and (size, seq_len, "G") in rates:
      print(f"{size} seq_len {seq_len}: hybrid / global-NoPE tokens/s = "
            f"{rate / rates[(size, seq_len, 'G')]:.2f}x")


if __name__ == "__main__":
  main()
