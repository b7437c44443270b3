"""Everything a lent GPU should measure, in one run sized for one lease; one table.

  python benchmarks/device_check.py                  # on the GPU (benchmarks/device_check.sh)
  python benchmarks/device_check.py --dry            # here: tiny shapes, Pallas in interpret mode

Sections, fastest first, so that a lease cut short still returns the numerics:
  numerics  every Pallas GPU kernel (SWA and global attention, GLA, the delta rule with a gate
            per head and per key channel) against its XLA path at HIGHEST precision in float32,
            output and every input gradient, in float32 (bar 1e-4) and bfloat16 (bar 2e-2),
            with packed segments; the worst relative error of out and the gradients.
  kernels   forward+backward ms of each mixer per implementation at T = 8192 and 32768 (bf16,
            B = 1, 12 heads x 64: the 120m model's): attention w = 64 / 256 / 1024 / global by
            pallas and cudnn, and what "auto" picks; GLA and the delta rule by xla and pallas.
  fla       fla's chunk_gla and chunk_gated_delta_rule at the same shapes, where a wheel of
            fla-core is importable (device_check.sh installs a carried one); else one line why.
  train     the 120m and 350m train steps at T = 8192 (bf16, Llama-3's 128,256 vocabulary,
            batch 8, 350m rematerialised) for SG, G, LG and DG: the train state's init (its
            compile and run), the step's compile, the median step, tokens/s and MFU.

Each row is printed as it is measured (a markdown table row), and a case that fails or would
pass --budget_s is a row that says so; the table is written whole to --out at the end. --dry
runs the same code on this CPU at shapes that take a minute: it checks the script, not the
hardware (its timings and MFU mean nothing).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import attention as attention_bench  # noqa: E402
from benchmarks import fla_reference, train_step  # noqa: E402
from hybrid_nope import kernels  # noqa: E402
from hybrid_nope.kernels import (delta_pallas_gpu, delta_xla, linear_pallas_gpu,  # noqa: E402
                                 linear_xla, pallas_gpu, xla)
from hybrid_nope.train import sharding  # noqa: E402
from hybrid_nope.train.flops import flops_per_token, peak_flops_per_device  # noqa: E402

TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
HEADER = "| section | case | impl | dtype | value | status |\n|---|---|---|---|---|---|"


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The shapes of one mode: the GPU's (the 120m model's heads) or --dry's."""
  check_T: int
  kernel_Ts: tuple
  windows: tuple
  heads: int
  head_dim: int
  train_sizes: tuple
  train_T: int
  dtype: str
  vocab: int
  batch: dict
  reps: int


GPU = Shapes(check_T=2048, kernel_Ts=(8192, 32768), windows=(64, 256, 1024, None), heads=12,
             head_dim=64, train_sizes=("120m", "350m"), train_T=8192, dtype="bfloat16",
             vocab=128256, batch={"120m": 8, "350m": 8}, reps=3)
DRY = Shapes(check_T=64, kernel_Ts=(256,), windows=(16, None), heads=2, head_dim=16,
             train_sizes=("demo",), train_T=128, dtype="float32", vocab=256,
             batch={"demo": 1}, reps=1)
PATTERNS = ("SG", "G", "LG", "DG")
MIXER_FAMILIES = ("gla", "gdn", "kda")  # GLA; the delta rule with a gate per head, per channel


class Table:
  def __init__(self, budget_s: float):
    self.rows, self.deadline = [], time.monotonic() + budget_s

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def add(self, section, case, impl, dtype, value, status=""):
    row = f"| {section} | {case} | {impl} | {dtype} | {value} | {status} |"
    self.rows.append(row)
    print(row, flush=True)

  def run(self, section, case, impl, dtype, needs_s, measure):
    """One case: measure() -> (value, status), or a row saying why not."""
    if self.left() < needs_s:
      return self.add(section, case, impl, dtype, "—", f"skipped: {self.left():.0f} s left")
    try:
      self.add(section, case, impl, dtype, *measure())
    except Exception as e:  # noqa: BLE001 - one failed case must not end the lease's table
      first_line = (str(e).splitlines() or [""])[0][:160]
      self.add(section, case, impl, dtype, "—", f"FAILED {type(e).__name__}: {first_line}")


# -- numerics ---------------------------------------------------------------------------------

def _inputs(rng, family, B, T, N, H):
  """(floating args, segment ids) in the kernels' module layouts (GQA, kv heads N / 2)."""
  K = max(N // 2, 1)
  normal = lambda *shape: rng.standard_normal(shape)
  seg = np.cumsum(rng.random((B, T)) < 4.0 / T, axis=1) + 1
  seg[:, -3:] = 0  # trailing padding: outputs 0, gradients 0
  q, k = normal(B, T, N, H), normal(B, T, K, H)
  if family == "attention":
    return (q, k, normal(B, T, K, H)), seg
  if family == "gla":
    return (q, k, normal(B, T, K, H), -rng.uniform(0, 1, (B, T, K, H))), seg
  channels = H if family == "kda" else 1
  return (q, k, normal(B, T, K, 2 * H), -rng.uniform(0, 1, (B, T, K, channels)),
          rng.uniform(0, 2, (B, T, K, 1))), seg


def _kernel_pair(family, window, interpret):
  """(Pallas GPU kernel, its XLA reference) as functions of (*args, segment_ids)."""
  if family == "attention":
    return (lambda *a, segment_ids: pallas_gpu.attention(
                *a, window=window, segment_ids=segment_ids, interpret=interpret),
            lambda *a, segment_ids: xla.attention(*a, window=window, segment_ids=segment_ids))
  if family == "gla":
    return (lambda *a, segment_ids: linear_pallas_gpu.linear_attention(
                *a, segment_ids=segment_ids, interpret=interpret),
            linear_xla.linear_attention)
  return (lambda *a, segment_ids: delta_pallas_gpu.delta_attention(
              *a, segment_ids=segment_ids, interpret=interpret),
          delta_xla.delta_attention)


def _out_and_grads(fn, args, seg, dtype):
  args = [jnp.asarray(a, dtype) for a in args]
  out, vjp = jax.vjp(jax.jit(lambda *a: fn(*a, segment_ids=jnp.asarray(seg, jnp.int32))), *args)
  cotangent = jnp.asarray(np.random.default_rng(7).standard_normal(out.shape), out.dtype)
  return [np.asarray(x, np.float32) for x in (out, *vjp(cotangent))]


def numerics(table: Table, shapes: Shapes, interpret: bool):
  """Pallas in interpret mode where `interpret` (--dry)."""
  rng = np.random.default_rng(0)
  cases = [("attention", w) for w in shapes.windows] + [(f, None) for f in MIXER_FAMILIES]
  for family, window in cases:
    args, seg = _inputs(rng, family, 1, shapes.check_T, shapes.heads, shapes.head_dim)
    kernel, reference = _kernel_pair(family, window, interpret)
    case = family
    if family == "attention":
      case = f"attention {'global' if window is None else f'w={window}'}"
    with jax.default_matmul_precision("highest"):
      want = _out_and_grads(reference, args, seg, jnp.float32)
    for dtype in ("float32", "bfloat16"):
      def measure():
        got = _out_and_grads(kernel, args, seg, jnp.dtype(dtype))
        worst = max(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
                    for g, w in zip(got, want))
        return f"{worst:.1e}", "PASS" if worst <= TOLERANCE[dtype] else "FAIL"
      table.run("numerics", f"{case} T={shapes.check_T} packed", "pallas", dtype, 20, measure)


# -- kernel timings ---------------------------------------------------------------------------

def kernel_timings(table: Table, shapes: Shapes, dry: bool):
  dtype = jnp.dtype(shapes.dtype)
  N, H = shapes.heads, shapes.head_dim
  rng = np.random.default_rng(1)
  attention_impls = ("xla",) if dry else ("pallas", "cudnn", "auto")
  mixer_impls = ("xla",) if dry else ("xla", "pallas")
  for T in shapes.kernel_Ts:
    q, k, v = (jnp.asarray(rng.standard_normal((1, T, N, H)), dtype) for _ in range(3))
    for window in shapes.windows:
      for impl in attention_impls:
        label = impl
        if impl == "auto":
          label = f"auto={kernels.resolve('auto', q, window=window)}"

        def measure(impl=impl):
          _, fwd_bwd = attention_bench.timed(attention_bench.Impl(impl), q, k, v, window,
                                             shapes.reps)
          return f"{fwd_bwd * 1e3:.2f} ms", "fwd+bwd"
        case = f"attention w={'global' if window is None else window} T={T}"
        table.run("kernels", case, label, shapes.dtype, 15, measure)
    for mixer, gate in (("linear", "gla"), ("delta", "gdn"), ("delta", "kda")):
      kernel, _, gate_fns = attention_bench.MIXERS[mixer]
      gates = gate_fns[gate](rng, 1, T, N, H, dtype)
      for impl in mixer_impls:
        def measure(impl=impl, kernel=kernel, gates=gates):
          _, fwd_bwd = attention_bench.timed_mixer(kernel, attention_bench.Impl(impl), q, k, v,
                                                   gates, shapes.reps)
          return f"{fwd_bwd * 1e3:.2f} ms", "fwd+bwd"
        table.run("kernels", f"{gate} T={T}", impl, shapes.dtype, 15, measure)


def fla_timings(table: Table, shapes: Shapes, dry: bool):
  del dry  # fla needs CUDA torch: skipped with its reason where there is none.
  reason = fla_reference.unavailable_reason()
  if reason is not None:
    return table.add("fla", "chunk_gla, chunk_gated_delta_rule", "fla", shapes.dtype, "—",
                     f"skipped: {reason}")
  for T in shapes.kernel_Ts:
    for op in fla_reference.OPS:
      def measure(op=op, T=T):
        ms = fla_reference.fwd_bwd_ms(op, T, shapes.heads, shapes.head_dim, shapes.reps)
        return f"{ms:.2f} ms", "fwd+bwd"
      table.run("fla", f"{op} T={T}", f"fla {fla_reference.version()}", shapes.dtype, 15,
                measure)


# -- train steps ------------------------------------------------------------------------------

def train_row(size, pattern, shapes: Shapes):
  config = train_step.config_for(size, pattern, shapes.train_T, shapes.vocab,
                                 remat=size == "350m", tensor=1, dtype=shapes.dtype)
  batch_size = shapes.batch[size]
  start = time.perf_counter()
  step, state, batch, mesh = train_step.step_and_batch(config, batch_size)
  jax.block_until_ready(state)
  init_s = time.perf_counter() - start
  with sharding.activation_rules(mesh):
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(shapes.reps + 1):  # the first call warms up
      start = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
  step_s = float(np.median(times[1:]))
  tokens_per_s = batch_size * shapes.train_T / step_s
  peak, _ = peak_flops_per_device()
  mfu = tokens_per_s * flops_per_token(config.model, shapes.train_T) / peak
  return (f"{tokens_per_s:,.0f} tok/s, MFU {mfu:.1%}",
          f"init {init_s:.1f} s, step compile {compile_s:.1f} s, step {step_s:.3f} s")


def train_steps(table: Table, shapes: Shapes, dry: bool):
  del dry  # the shapes say it all
  for size in shapes.train_sizes:
    for pattern in PATTERNS:
      table.run("train", f"{size} {pattern} T={shapes.train_T} batch {shapes.batch[size]}",
                "auto", shapes.dtype, 45, lambda size=size, pattern=pattern:
                train_row(size, pattern, shapes))


# Fastest first: a lease cut short still returns the numerics.
SECTIONS = {"numerics": numerics, "kernels": kernel_timings, "fla": fla_timings,
            "train": train_steps}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--dry", action="store_true",
                      help="this CPU: tiny shapes, the Pallas kernels in interpret mode")
  parser.add_argument("--budget_s", type=float,
                      help="start no case after this many seconds: default 450 on a GPU (one "
                      "600 s device call leaves the rest for start-up), 1800 with --dry "
                      "(interpret mode on a shared CPU)")
  parser.add_argument("--out", help="also write the table here (markdown)")
  parser.add_argument("--sections", default=",".join(SECTIONS),
                      help=f"comma-separated, run in this order: {','.join(SECTIONS)}")
  args = parser.parse_args(argv)
  if not args.dry and jax.default_backend() != "gpu":
    sys.exit(f"device_check needs a GPU (the backend is {jax.default_backend()!r}); "
             "--dry checks the script on this machine")
  shapes = DRY if args.dry else GPU
  if args.budget_s is None:
    args.budget_s = 1800.0 if args.dry else 450.0
  table = Table(args.budget_s)
  print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, commit "
        f"{attention_bench.git_commit()}, budget {args.budget_s:.0f} s", flush=True)
  print(HEADER, flush=True)
  for section in args.sections.split(","):
    if section not in SECTIONS:
      sys.exit(f"--sections: {section!r} is not one of {','.join(SECTIONS)}")
    SECTIONS[section](table, shapes, args.dry)
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join([HEADER, *table.rows]) + "\n")
  failures = sum("FAIL" in row for row in table.rows)
  print(f"# {len(table.rows)} rows, {failures} FAIL or FAILED", flush=True)


if __name__ == "__main__":
  main()
