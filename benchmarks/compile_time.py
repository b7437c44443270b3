"""Compile time of the train state's initialisation and of the train step, as the trainer builds
them (hybrid_nope.train.state.sharded_train_state, benchmarks/train_step.py's sharded step), on
the default backend.

  python benchmarks/compile_time.py                                  # 120m and 350m, seq 2048
  python benchmarks/compile_time.py --sizes=120m --patterns=SG,G,LG,DG --seq_len=8192

Two measures, each as an init / step ratio (issue 48: at most a quarter on CPU):
  XLA compile CPU-seconds (time.process_time: every compiler thread). Each of the init (the
    trainer's own call, which compiles its programs as it goes) and the step (lowered and
    compiled once) runs in a fresh process twice, over one persistent compilation cache: first
    empty, then holding every program the first compiled. Everything else is the same in both
    (tracing, lowering, drawing and placing the values, first touches of memory), so the
    difference is XLA's compiling alone. A first call less a later one in one process would
    count the allocator's first touches as compile time (glibc reuses the freed heap later).
  compiling seconds: what jax.monitoring reports for tracing, lowering and XLA compiling (wall
    time of those stages only) in the cold process: no run time in it at all.
The init does not depend on seq_len; the step does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# jax.monitoring's durations of the three stages of every compile: trace, lower, XLA compile.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def _measure_in_this_process(args) -> dict:
  """CPU-seconds and jax.monitoring compiling seconds of one init or one step compile."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks.train_step import config_for, step_and_batch  # pylint: disable=import-outside-toplevel
  from hybrid_nope.train import sharding  # pylint: disable=import-outside-toplevel
  from hybrid_nope.train.optimizer import make_optimizer  # pylint: disable=import-outside-toplevel
  from hybrid_nope.train.state import sharded_train_state  # pylint: disable=import-outside-toplevel

  events = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, duration, **_: events.append((name, duration)))
  config = config_for(args.size, args.pattern, args.seq_len, args.vocab, remat=False, tensor=1,
                      dtype=args.dtype)
  mesh = sharding.make_mesh(config)
  if args.measure == "init":
    tx = make_optimizer(config.train)
    work = lambda: sharded_train_state(config.model, tx, config.train.seed, mesh)[1]
  else:
    step, state, batch, mesh = step_and_batch(config, config.data.batch_size)
    events.clear()  # building the state for the step is not the step's compile

    def work():
      with sharding.activation_rules(mesh):
        return step.lower(state, batch).compile()
  start = time.process_time()
  jax.block_until_ready(work())
  return {"cpu": time.process_time() - start,
          "compiling": sum(d for name, d in events if name in COMPILE_EVENTS)}


def measured(args, measure: str) -> tuple[float, float]:
  """(XLA compile CPU-seconds, compiling seconds) of `measure` ("init" or "step"): a cold and a
  warm process over one persistent compilation cache."""
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    runs = []
    for _ in ("cold", "warm"):
      out = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--child={measure}", f"--size={args.size}",
           f"--pattern={args.pattern}", f"--seq_len={args.seq_len}", f"--vocab={args.vocab}",
           f"--dtype={args.dtype}"], env=env, capture_output=True, text=True, check=False)
      if out.returncode:
        raise SystemExit(f"compile_time: the {measure} process failed:\n{out.stderr[-3000:]}")
      runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  cold, warm = runs
  return cold["cpu"] - warm["cpu"], cold["compiling"]


def main():
  p = argparse.ArgumentParser()
  for flag, default, help_ in (("sizes", "120m,350m", "named sizes (configs/base.py)"),
                               ("patterns", "SG", "model.pattern values"),
                               ("dtype", "float32", "model.dtype (auto: bfloat16 off CPU)")):
    p.add_argument(f"--{flag}", default=default, help=help_)
  p.add_argument("--seq_len", type=int, default=2048)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--child", choices=("init", "step"), help=argparse.SUPPRESS)
  p.add_argument("--size", help=argparse.SUPPRESS)
  p.add_argument("--pattern", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    args.measure = args.child
    print(json.dumps(_measure_in_this_process(args)))
    return
  import jax  # pylint: disable=import-outside-toplevel
  print(f"jax {jax.__version__} on {jax.device_count()} x {jax.devices()[0].device_kind}, "
        f"seq_len {args.seq_len}, vocab {args.vocab}, {args.dtype}\n")
  print("| size | pattern | init XLA compile CPU s | step XLA compile CPU s | init / step | "
        "init compiling s | step compiling s | init / step |")
  print("|---|---|---|---|---|---|---|---|")
  for args.size in args.sizes.split(","):
    for args.pattern in args.patterns.split(","):
      init_cpu, init_compiling = measured(args, "init")
      step_cpu, step_compiling = measured(args, "step")
      print(f"| {args.size} | {args.pattern} | {init_cpu:.2f} | {step_cpu:.2f} | "
            f"{init_cpu / step_cpu:.2f} | {init_compiling:.2f} | {step_compiling:.2f} | "
            f"{init_compiling / step_compiling:.2f} |", flush=True)


if __name__ == "__main__":
  main()
