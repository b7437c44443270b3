"""Compiled memory of one train step, per layer count, remat setting and gradient
accumulation: no step is run.

  python benchmarks/step_memory.py --size=350m --seq_len=8192 --layers=2,4 --remat=True,False
  python benchmarks/step_memory.py --size=350m --seq_len=8192 --layers=2 --remat=False \
      --batch=4 --accum=1,2,4

Prints XLA's memory analysis of the jitted step (arguments = the donated train state;
temporaries = everything else live at the peak under XLA's schedule). The difference between
two layer counts is what each block adds, which is what remat is meant to shrink.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from benchmarks.train_step import config_for, step_and_batch  # noqa: E402
from hybrid_nope.train import sharding  # noqa: E402


def compiled_memory(config, batch_size: int = 1) -> tuple[float, float]:
  """(argument GiB, temporary GiB) of the compiled train step."""
  step, state, batch, mesh = step_and_batch(config, batch_size=batch_size)
  with sharding.activation_rules(mesh):
    memory = step.lower(state, batch).compile().memory_analysis()
  return memory.argument_size_in_bytes / 2**30, memory.temp_size_in_bytes / 2**30


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--size", default="350m")
  p.add_argument("--pattern", default="SG")
  p.add_argument("--seq_len", type=int, default=8192)
  p.add_argument("--layers", default="2,4")
  p.add_argument("--remat", default="True,False")
  p.add_argument("--mlp_dim", type=int, default=0, help="override the size's MLP width")
  p.add_argument("--vocab", type=int, default=32000, help="named sizes only (demo keeps 258)")
  p.add_argument("--batch", type=int, default=1, help="global batch, in sequences")
  p.add_argument("--accum", default="1", help="train.grad_accum_steps values (microbatches)")
  args = p.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {args.size} {args.pattern} "
        f"seq_len {args.seq_len}, batch {args.batch}, float32")
  print("| layers | remat | accum | microbatch | mlp_dim | vocab | state GiB | temporaries GiB |")
  print("|---|---|---|---|---|---|---|---|")
  for remat in (r == "True" for r in args.remat.split(",")):
    for layers in map(int, args.layers.split(",")):
      for accum in map(int, args.accum.split(",")):
        config = config_for(args.size, args.pattern, args.seq_len, args.vocab, remat, tensor=1)
        config.model.num_layers = layers
        config.train.grad_accum_steps = accum
        if args.mlp_dim:
          config.model.mlp_dim = args.mlp_dim
        state_gib, temp_gib = compiled_memory(config, args.batch)
        print(f"| {layers} | {remat} | {accum} | {args.batch // accum} | {config.model.mlp_dim} "
              f"| {config.model.vocab_size} | {state_gib:.2f} | {temp_gib:.2f} |", flush=True)


if __name__ == "__main__":
  main()
