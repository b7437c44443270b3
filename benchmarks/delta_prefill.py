"""A prompt's gated-delta-rule state: the chunked prefill (kernels.delta_prefill, what
generation uses) against the prompt replayed one token at a time through kernels.delta_step
(what it used before), on this machine.

  python benchmarks/delta_prefill.py                       # T = 512, 2048, 8192
  python benchmarks/delta_prefill.py --lengths=1024 --heads=16 --head_dim=64

Both are jitted and timed after a warm-up call; the table gives the median of --reps calls and
the largest difference between the two states relative to the largest entry.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hybrid_nope import kernels  # noqa: E402


@jax.jit
def replayed(q_BTNH, k_BTKH, v_BTKH, log_decay_BTK, beta_BTK):
  B, _, K, H = k_BTKH.shape

  def one_token(state, xs):
    return kernels.delta_step(state, *xs)[0], None

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  state, _ = jax.lax.scan(one_token, jnp.zeros((B, K, H, H), jnp.float32),
                          tuple(map(time_major, (q_BTNH, k_BTKH, v_BTKH, log_decay_BTK,
                                                 beta_BTK))))
  return state


chunked = jax.jit(kernels.delta_prefill)


def median_seconds(fn, args, reps):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default="512,2048,8192")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=32)
  parser.add_argument("--reps", type=int, default=3)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  B, N, H = args.batch, args.heads, args.head_dim
  print(f"B={B}, heads={N} (= kv heads), head_dim={H}, float32, {jax.default_backend()}")
  print("| prompt T | replayed token by token (s) | chunked prefill (s) | speed-up | "
        "state rel. diff |")
  print("|---|---|---|---|---|")
  for T in map(int, args.lengths.split(",")):
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32) for _ in range(3))
    log_decay = jnp.asarray(np.log(rng.uniform(0.9, 1.0, (B, T, N))), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.0, 1.0, (B, T, N)), jnp.float32)
    inputs = (q, k, v, log_decay, beta)
    slow, fast = median_seconds(replayed, inputs, args.reps), median_seconds(
        chunked, inputs, args.reps)
    a, b = np.asarray(replayed(*inputs)), np.asarray(chunked(*inputs))
    diff = np.max(np.abs(a - b)) / np.max(np.abs(a))
    print(f"| {T} | {slow:.4f} | {fast:.4f} | {slow / fast:.1f}x | {diff:.1e} |")


if __name__ == "__main__":
  main()
