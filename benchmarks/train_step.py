"""Training throughput on this machine: step time, tokens/s, model FLOPs/token and MFU.

  python benchmarks/train_step.py                       # the table in docs/performance.md
  python benchmarks/train_step.py --sizes=120m --seq_lens=2048 --patterns=SG
  python benchmarks/train_step.py --sizes=120m --seq_lens=8192 --patterns=SG,LG,G
  python benchmarks/train_step.py --sizes=120m --seq_lens=8192 --patterns=DDDG --delta_gate=channel

MFU counts model FLOPs honestly (hybrid_nope.train.flops.flops_per_token: 6 × matmul params
incl. the output head, plus attention over the query-key pairs actually attended) against
the measured float32 matmul rate of this machine (the roofline). Vocabulary 32000 for the
named sizes (the Llama-3 table of 128256 would dominate a CPU step), batch 1, float32.

--tensor=N splits the host into N devices and runs the trainer's sharded step on a mesh with
tensor=N (heads, MLP and vocabulary split, Megatron-style; attention per shard): at batch 1
that is the only way a CPU step uses more than one thread for its loops and elementwise work.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.host_devices import split_host_from_argv  # noqa: E402

if __name__ == "__main__":
  split_host_from_argv("--tensor", 1)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import base, demo  # noqa: E402
from hybrid_nope.train.flops import (flops_per_token, measure_matmul_flops,  # noqa: E402
                                     peak_flops_per_device)
from hybrid_nope.train.optimizer import make_optimizer  # noqa: E402
from hybrid_nope.train import sharding  # noqa: E402
from hybrid_nope.train.state import sharded_train_state  # noqa: E402
from hybrid_nope.train.step import train_step_for  # noqa: E402


def config_for(size: str, pattern: str, seq_len: int, vocab: int, remat: bool, tensor: int,
               dtype: str = "float32", delta_gate: str = "head"):
  c = demo.get_config() if size == "demo" else base.experiment(size, 256)
  c.model.pattern = pattern
  if size != "demo":
    c.model.vocab_size = vocab
  c.model.remat = remat
  c.model.dtype = dtype
  c.model.delta_gate = delta_gate
  c.data.seq_len = seq_len
  c.data.batch_size = 1
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, tensor
  return c


def available_memory_bytes() -> int:
  with open("/proc/meminfo") as f:
    fields = dict(line.split(":", 1) for line in f)
  return int(fields["MemAvailable"].split()[0]) * 1024


def synthetic_batch(batch_size: int, seq_len: int, vocab: int) -> dict:
  """Random tokens as one packed document: the trainer's batch keys, host arrays."""
  rng = np.random.default_rng(0)
  return {"inputs": rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32),
          "targets": rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32),
          "segment_ids": np.ones((batch_size, seq_len), np.int32),
          "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32),
                                       (batch_size, seq_len)),
          "weights": np.ones((batch_size, seq_len), np.float32)}


def step_and_batch(config, batch_size: int):
  """(jitted sharded train step, state, batch, mesh) as the trainer builds them, on random
  tokens; call or lower the step under sharding.activation_rules(mesh)."""
  config.data.batch_size = batch_size
  tx = make_optimizer(config.train)
  mesh = sharding.make_mesh(config)
  batch = synthetic_batch(batch_size, config.data.seq_len, 256)
  with sharding.activation_rules(mesh):
    model_def, state, shardings = sharded_train_state(config.model, tx, 0, mesh)
    batch = sharding.global_batch(batch, mesh)
    step = jax.jit(train_step_for(config, model_def, tx),
                   in_shardings=(shardings, {k: sharding.batch_sharding(mesh) for k in batch}),
                   out_shardings=(shardings, sharding.replicated(mesh)), donate_argnums=0)
  return step, state, batch, mesh


def time_steps(config, batch_size: int, steps: int) -> float | str:
  """Median seconds per train step after one compile step: the trainer's sharded step. A
  string saying why instead, when the compiled step needs more memory than the host has (a
  run the kernel would OOM-kill, taking the rest of the table with it)."""
  step, state, batch, mesh = step_and_batch(config, batch_size)
  with sharding.activation_rules(mesh):
    memory = step.lower(state, batch).compile().memory_analysis()
    # The state is already resident and donated (updated in place): what the step still needs
    # is its temporaries.
    available = available_memory_bytes()
    if memory is not None and memory.temp_size_in_bytes > 0.9 * available:
      return (f"skipped: the compiled step needs {memory.temp_size_in_bytes / 2**30:.1f} GiB of "
              f"temporaries beside its {memory.argument_size_in_bytes / 2**30:.1f} GiB state; "
              f"{available / 2**30:.1f} GiB available")
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
  p.add_argument("--patterns", default="SG,G", help="SG = SWA hybrid (window 256), LG = gated "
                 "linear attention hybrid, DG = gated delta rule hybrid, DDDG = 3:1 (Kimi Linear), "
                 "G = global-NoPE baseline")
  p.add_argument("--delta_gate", default="head", choices=("head", "channel"),
                 help="model.delta_gate of D layers: per head (Gated DeltaNet) or per key "
                 "channel (Kimi Delta Attention)")
  p.add_argument("--batch_size", type=int, default=1)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--dtype", default="float32", help="model.dtype: float32 (CPU), bfloat16 or "
                 "auto on accelerators")
  p.add_argument("--tensor", type=int, default=1,
                 help="split the host into this many devices, mesh tensor axis over them")
  p.add_argument("--remat", default="350m@8192",
                 help="SIZE@SEQ_LEN,...: rematerialise blocks for SIZE at SEQ_LEN and above, "
                 "where memory needs it (120m at 8192 peaks at 15.5 GB without remat)")
  args = p.parse_args()
  remat_from = {}
  for item in filter(None, args.remat.split(",")):
    size, _, seq_len = item.partition("@")
    if not seq_len.isdigit():
      p.error(f"--remat item {item!r}: expected SIZE@SEQ_LEN, e.g. 350m@8192")
    remat_from[size] = int(seq_len)
  if jax.default_backend() == "cpu":
    roofline = measure_matmul_flops()
    against = (f"float32 matmul roofline {roofline / 1e9:.1f} GFLOP/s (2048² matmul, one "
               "device: the whole host's cores)")
  else:  # MFU against the datasheet peak of every device, as the trainer reports it.
    roofline, source = peak_flops_per_device()
    roofline *= jax.device_count()
    against = f"{source}: {roofline / 1e12:.0f} TFLOP/s in all"
  print(f"jax {jax.__version__} on {jax.device_count()} x {jax.devices()[0].device_kind} "
        f"(mesh tensor={args.tensor}, {args.dtype}, vocab {args.vocab}); MFU against "
        f"{against}\n")
  print("| size | pattern | seq_len | remat | step s | tokens/s | GFLOP/token | MFU |")
  print("|---|---|---|---|---|---|---|---|")
  rates = {}
  for size in args.sizes.split(","):
    for seq_len in map(int, args.seq_lens.split(",")):
      for pattern in args.patterns.split(","):
        config = config_for(size, pattern, seq_len, args.vocab,
                            seq_len >= remat_from.get(size, float("inf")), args.tensor,
                            args.dtype, args.delta_gate)
        seconds = time_steps(config, args.batch_size, args.steps)
        if isinstance(seconds, str):
          print(f"| {size} | {pattern} | {seq_len} | {config.model.remat} | {seconds} | | | |",
                flush=True)
          continue
        tokens_per_second = args.batch_size * seq_len / seconds
        fpt = flops_per_token(config.model, seq_len)
        mfu = tokens_per_second * fpt / roofline
        rates[(size, seq_len, pattern)] = tokens_per_second
        print(f"| {size} | {pattern} | {seq_len} | {config.model.remat} | {seconds:.3f} | "
              f"{tokens_per_second:.0f} | {fpt / 1e9:.3f} | {100 * mfu:.1f}% |", flush=True)
  print()
  for (size, seq_len, pattern), rate in rates.items():
    if pattern != "G" and (size, seq_len, "G") in rates:
      print(f"{size} seq_len {seq_len}: {pattern} hybrid / global-NoPE tokens/s = "
            f"{rate / rates[(size, seq_len, 'G')]:.2f}x")


if __name__ == "__main__":
  main()
