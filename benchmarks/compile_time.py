"""Compile time of the train state's initialisation and of the train step, as the trainer builds
them (hybrid_nope.train.state.sharded_train_state, benchmarks/train_step.py's sharded step), on
the default backend.

  python benchmarks/compile_time.py                                  # 120m and 350m, seq 2048
  python benchmarks/compile_time.py --sizes=120m --patterns=SG,G,LG,DG --seq_len=8192

CPU-seconds (time.process_time: every compiler thread of this process) and wall seconds. The
step is lowered, then compiled once. The init is the trainer's own call, which compiles a draw
per distinct parameter shape as it goes: its compile time is its first call less a second one
(every program then cached), so tracing and running the draws cancel. The init does not depend
on seq_len; the step does. "init / step" is the ratio of CPU-seconds (issue 48: at most a
quarter on CPU).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from benchmarks.train_step import config_for, step_and_batch  # noqa: E402
from hybrid_nope.train import sharding  # noqa: E402
from hybrid_nope.train.optimizer import make_optimizer  # noqa: E402
from hybrid_nope.train.state import sharded_train_state  # noqa: E402


def seconds(fn) -> tuple[float, float]:
  """(CPU-seconds, wall seconds) of fn(), its results ready."""
  cpu, wall = time.process_time(), time.perf_counter()
  jax.block_until_ready(fn())
  return time.process_time() - cpu, time.perf_counter() - wall


def init_compile_seconds(config) -> tuple[float, float]:
  """(CPU-seconds, wall seconds) the trainer's init spends compiling: first call less second."""
  tx = make_optimizer(config.train)
  mesh = sharding.make_mesh(config)
  calls = [seconds(lambda: sharded_train_state(config.model, tx, config.train.seed, mesh)[1])
           for _ in range(2)]
  return calls[0][0] - calls[1][0], calls[0][1] - calls[1][1]


def main():
  p = argparse.ArgumentParser()
  for flag, default, help_ in (("sizes", "120m,350m", "named sizes (configs/base.py)"),
                               ("patterns", "SG", "model.pattern values"),
                               ("dtype", "float32", "model.dtype (auto: bfloat16 off CPU)")):
    p.add_argument(f"--{flag}", default=default, help=help_)
  p.add_argument("--seq_len", type=int, default=2048)
  p.add_argument("--vocab", type=int, default=32000)
  args = p.parse_args()
  print(f"jax {jax.__version__} on {jax.device_count()} x {jax.devices()[0].device_kind}, "
        f"seq_len {args.seq_len}, vocab {args.vocab}, {args.dtype}\n")
  print("| size | pattern | init CPU s | init wall s | step CPU s | step wall s | init / step |")
  print("|---|---|---|---|---|---|---|")
  for size in args.sizes.split(","):
    for pattern in args.patterns.split(","):
      config = config_for(size, pattern, args.seq_len, args.vocab, remat=False, tensor=1,
                          dtype=args.dtype)
      init_cpu, init_wall = init_compile_seconds(config)
      step, state, batch, mesh = step_and_batch(config, config.data.batch_size)
      with sharding.activation_rules(mesh):
        step_cpu, step_wall = seconds(step.lower(state, batch).compile)
      print(f"| {size} | {pattern} | {init_cpu:.2f} | {init_wall:.2f} | {step_cpu:.2f} | "
            f"{step_wall:.2f} | {init_cpu / step_cpu:.2f} |", flush=True)


if __name__ == "__main__":
  main()
