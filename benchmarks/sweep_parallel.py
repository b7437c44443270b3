"""Two sweep runs at once with one core each, against one run after another on both cores.

  python benchmarks/sweep_parallel.py [--experiment=swa16] [--steps=96]

Prints the wall time of training two seeds each way and the runs per hour it implies; the sweep
(launch/sweep.py --parallel, --threads) should use the faster split.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(experiment, seed, steps, workdir, cores):
  command = [sys.executable, os.path.join(REPO, "launch/train.py"),
             f"--config=configs/small.py:{experiment}", f"--config.train.seed={seed}",
             f"--config.train.steps={steps}", f"--config.train.warmup_steps={steps // 10}",
             f"--workdir={workdir}"]
  return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--experiment", default="swa16")
  parser.add_argument("--steps", type=int, default=96)
  args = parser.parse_args()
  cores = sorted(os.sched_getaffinity(0))[:2]
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    start = time.time()
    for seed in (0, 1):
      train(args.experiment, seed, args.steps, f"{tmp}/serial{seed}", set(cores)).wait()
    rows.append(("one at a time, 2 cores each", time.time() - start))
    start = time.time()
    runs = [train(args.experiment, seed, args.steps, f"{tmp}/par{seed}", {cores[seed]})
            for seed in (0, 1)]
    for r in runs:
      r.wait()
    rows.append(("two at once, 1 core each", time.time() - start))
  print(f"| split ({args.experiment}, 2 runs x {args.steps} steps) | wall s | runs/hour |")
  print("|---|---|---|")
  for name, seconds in rows:
    print(f"| {name} | {seconds:.0f} | {2 * 3600 / seconds:.1f} |")


if __name__ == "__main__":
  main()
