"""Compile time of the train state's initialisation and of the train step, as the trainer builds
them (hybrid_nope.train.state.sharded_train_state, benchmarks/train_step.py's sharded step), on
the default backend.

  python benchmarks/compile_time.py                                  # 120m and 350m, seq 2048
  python benchmarks/compile_time.py --sizes=120m --patterns=SG,G,LG,DG --seq_len=8192

Two measures, each as an init / step ratio (issue 48: at most a quarter on CPU):
  CPU-seconds (time.process_time: every compiler thread of this process). The step: lowering
    and compiling it once. The init: the trainer's own call, which compiles a program per
    distinct parameter shape as it goes; its first call less the fastest of three later ones
    (every program cached, so they only run): tracing and running cancel, and a noisy run
    overstates the compile rather than hiding it.
  compiling seconds: what jax.monitoring reports for tracing, lowering and XLA compiling
    (wall time of those stages only), summed over the same calls: no run time in it at all.
The init does not depend on seq_len; the step does.
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


def cpu_seconds(fn) -> float:
  """CPU-seconds of fn(), its results ready."""
  start = time.process_time()
  jax.block_until_ready(fn())
  return time.process_time() - start


# jax.monitoring's durations of the three stages of every compile: trace, lower, XLA compile.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_events: list[tuple[str, float]] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, duration, **_: _events.append((name, duration)))


def measured(fn) -> tuple[float, float]:
  """(CPU-seconds of fn(), seconds jax reports tracing, lowering and compiling during it)."""
  start = len(_events)
  cpu = cpu_seconds(fn)
  return cpu, sum(d for name, d in _events[start:] if name in COMPILE_EVENTS)


def init_compile_seconds(config, calls: int = 4) -> tuple[float, float]:
  """(CPU-seconds, compiling seconds) of the trainer's init. CPU: its first call less the
  fastest of the later ones, which only run (every program cached), so a noisy run overstates
  the compile, never hides it. Compiling: jax.monitoring's sum over the first call."""
  tx = make_optimizer(config.train)
  mesh = sharding.make_mesh(config)
  init = lambda: sharded_train_state(config.model, tx, config.train.seed, mesh)[1]
  first_cpu, compiling = measured(init)
  return first_cpu - min(cpu_seconds(init) for _ in range(calls - 1)), compiling


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
  print("| size | pattern | init CPU s | step CPU s | init / step | init compiling s | "
        "step compiling s | init / step |")
  print("|---|---|---|---|---|---|---|---|")
  for size in args.sizes.split(","):
    for pattern in args.patterns.split(","):
      config = config_for(size, pattern, args.seq_len, args.vocab, remat=False, tensor=1,
                          dtype=args.dtype)
      init_cpu, init_compiling = init_compile_seconds(config)
      step, state, batch, mesh = step_and_batch(config, config.data.batch_size)
      with sharding.activation_rules(mesh):
        step_cpu, step_compiling = measured(step.lower(state, batch).compile)
      print(f"| {size} | {pattern} | {init_cpu:.2f} | {step_cpu:.2f} | "
            f"{init_cpu / step_cpu:.2f} | {init_compiling:.2f} | {step_compiling:.2f} | "
            f"{init_compiling / step_compiling:.2f} |", flush=True)


if __name__ == "__main__":
  main()
