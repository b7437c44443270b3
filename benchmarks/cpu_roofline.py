"""The CPU roofline that MFU is measured against on CPU (hybrid_nope/train/flops.py).

  python benchmarks/cpu_roofline.py             # the figure beside flops.CPU_PEAK_FLOPS_PER_CORE
  python benchmarks/cpu_roofline.py --repeats=50

jax's float32 n×n matmul on the one CPU device (XLA spreads it over every core this process may
use), best of --repeats per size after a compile run; the roofline is the best rate of any size,
per core. The machine's other load only lowers it, so the best of many repeats is the figure.
A CPU faster than the one stated in flops.py reads MFU above 100%: measure it here and pass the
printed --config.train.peak_flops to the trainer.
"""
import argparse
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from hybrid_nope.train import flops  # noqa: E402


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or "unknown CPU"


def git_commit() -> str:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="1024,2048,4096", help="matmul sizes n, comma-separated")
  parser.add_argument("--repeats", type=int, default=20, help="timed runs per size (best kept)")
  args = parser.parse_args()
  if jax.default_backend() != "cpu":
    parser.error(f"the default backend is {jax.default_backend()}: run with JAX_PLATFORMS=cpu")
  cores = flops.host_cores()
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"# {cpu_model()}, {cores} cores for this process, load average {load:.2f}; jax "
        f"{jax.__version__}, commit {git_commit()}")
  print("| n | GFLOP/s | GFLOP/s per core |")
  print("|---|---|---|")
  best = 0.0
  for n in map(int, args.sizes.split(",")):
    rate = flops.measure_matmul_flops(n, args.repeats)
    best = max(best, rate)
    print(f"| {n} | {rate / 1e9:.1f} | {rate / cores / 1e9:.1f} |", flush=True)
  print(f"roofline: {best / cores / 1e9:.1f} GFLOP/s per core ({best / 1e9:.1f} on {cores} "
        f"cores); flops.py states {flops.CPU_PEAK_FLOPS_PER_CORE / 1e9:.1f} per core; for this "
        f"machine: --config.train.peak_flops={best:.4g}")


if __name__ == "__main__":
  main()
