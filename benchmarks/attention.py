"""Time every attention implementation against dense masked attention; print one table.

  python benchmarks/attention.py                       # the full CPU grid, float32
  python benchmarks/attention.py --T 8192 --windows 256 --impls xla   # one row, ~1 min
  python benchmarks/attention.py --preset gpu --check  # Pallas vs cuDNN vs dense, bf16, T<=32k

On CPU the host is split into --host-devices devices (default: one per core) and each impl is
also timed with its heads split over all of them (rows "IMPL/Nd"): XLA:CPU runs one device's
kernel loop on one thread, so this is how the kernel uses every core, as the model does under a
mesh with a tensor axis (kernels/per_shard.py). Unsplit rows and dense run on one device.

Columns: forward and forward+backward wall time (best of --reps after a compile run), useful
GFLOP/s counting only the (query, key) pairs inside the causal window, that rate as a fraction
of the machine's matmul rate (a large jnp matmul in the same dtype, measured first), and the
speedup over dense masked attention: jax.nn.dot_product_attention(implementation="xla",
is_causal=True, local_window_size=(w-1, 0)), which scores all T² pairs.

Useful FLOPs per in-window pair and head: forward 4·H (QKᵀ and PV), forward+backward 12·H
(adds dV, dP, dQ, dK); recomputing scores in the backward is not counted as useful. Dense cases
over --dense-budget-gb (estimated from its T² score tensors) or predicted to exceed
--case-budget-s are printed as skipped, not estimated.

Rows "linear-IMPL" (w column "gla") time the gated linear attention mixer
(kernels.linear_attention, log decays uniform in [-1, 0]) at the same T, heads and dtype. Its
useful FLOPs are the chunked algorithm's at the kernel's chunk C, counted as the model counts
them (model/mixer_costs.linear_attention_flops_per_token): within a chunk q·k and A·v over the causal
pairs only (as the attention rows count in-window pairs only), across chunks q·S per query head
and kᵀv per kv head; three times that forward+backward; masked and recomputed work is not
counted. --linear-impls none leaves them out.

Rows "delta-IMPL" time the gated delta rule (kernels.delta_attention) the same way: w column
"gdn" for one gate per head (Gated DeltaNet; log decays uniform in [-1, 0], β uniform in
[0, 1]), "kda" for one per key channel (--delta-gates head,channel). Useful FLOPs are the
model's count, model/mixer_costs.delta_attention_flops_per_token (linear attention's plus the delta
rule's own: k·kᵀ, the triangular inverse, the transformed keys and values, S k), at the kernel's
chunk. --delta-impls none leaves them out. Summary lines compare each mixer with the attention
windows timed and the delta rule with linear attention, and give time(16384)/time(4096).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.host_devices import split_host_from_argv  # noqa: E402

if __name__ == "__main__":
  split_host_from_argv("--host-devices", os.cpu_count() or 1)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hybrid_nope import kernels  # noqa: E402
from hybrid_nope.kernels import delta_xla, linear_xla  # noqa: E402
from hybrid_nope.model.mixer_costs import (  # noqa: E402
    delta_attention_flops_per_token, linear_attention_flops_per_token)
from hybrid_nope.train.flops import peak_flops_per_device  # noqa: E402

PRESETS = {
    "cpu": dict(T="2048,4096,8192,16384", windows="64,256,1024", impls="available",
                dtype="float32", heads=4, kv_heads=4, dense_budget_gb=6.0),
    # For a lent GPU (e.g. one H200, ~140 GB): bf16, long sequences, global attention too,
    # the 120M model's 12 heads. "xla" is left out: on GPU it is the slow portable fallback.
    "gpu": dict(T="2048,4096,8192,16384,32768", windows="64,256,1024,global",
                impls="pallas,cudnn", dtype="bfloat16", heads=12, kv_heads=12,
                dense_budget_gb=60.0),
}


def best_time(fn, args, reps):
  jax.block_until_ready(fn(*args))  # Compile and warm up.
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def matmul_rate(dtype, reps, n=4096):
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  seconds = best_time(jax.jit(lambda a, b: a @ b), (a, a), reps)
  return 2 * n**3 / seconds / 1e9


def in_window_pairs(T, w):
  w = T if w is None else min(w, T)
  return T * w - w * (w - 1) // 2  # Row i sees min(i + 1, w) keys.


# Mixer rows: prefix -> (kernel, useful forward FLOPs per token (N, K, H), gate label ->
# gates(rng, B, T, K, H, dtype)). Gates are the operands after q, k, v.
def _gla_gates(rng, B, T, K, H, dtype):
  return (jnp.asarray(-rng.uniform(0.0, 1.0, (B, T, K, H)), dtype),)


def _delta_gates(per_channel):
  def gates(rng, B, T, K, H, dtype):
    g = -rng.uniform(0.0, 1.0, (B, T, K, H) if per_channel else (B, T, K))
    return jnp.asarray(g, dtype), jnp.asarray(rng.uniform(0.0, 1.0, (B, T, K)), dtype)
  return gates


MIXERS = {
    "linear": (kernels.linear_attention,
               lambda N, K, H: linear_attention_flops_per_token(N, K, H, linear_xla.CHUNK),
               {"gla": _gla_gates}),
    "delta": (kernels.delta_attention,
              lambda N, K, H: delta_attention_flops_per_token(N, K, H, delta_xla.CHUNK),
              {"gdn": _delta_gates(False), "kda": _delta_gates(True)}),
}


def timed_mixer(kernel, impl, q, k, v, gates, reps):
  """(forward seconds, forward+backward seconds) of kernel(q, k, v, *gates)."""
  q, k, v, *gates = impl.place(q, k, v, *gates)
  head_axes = None if impl.mesh is None else "heads"
  fn = lambda q, k, v, *gates: kernel(q, k, v, *gates, impl=impl.impl, head_axes=head_axes)

  @jax.jit
  def fwd_bwd(*args):
    out, vjp = jax.vjp(fn, *args)
    return vjp(out)

  args = (q, k, v, *gates)
  with impl.context():
    return best_time(jax.jit(fn), args, reps), best_time(fwd_bwd, args, reps)


def dense(q, k, v, *, window, segment_ids=None):
  del segment_ids
  T = q.shape[1]
  local = None if window is None or window >= T else (window - 1, 0)
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                      implementation="xla")


def timed(attn, q, k, v, window, reps):
  """(forward seconds, forward+backward seconds) of attn at this window (inputs placed as the
  impl wants them)."""
  q, k, v = attn.place(q, k, v)
  with attn.context():
    return _timed(attn, q, k, v, window, reps)


def _timed(attn, q, k, v, window, reps):
  fwd = jax.jit(lambda q, k, v: attn(q, k, v, window=window))

  @jax.jit
  def fwd_bwd(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: attn(q, k, v, window=window), q, k, v)
    return vjp(out)  # Any cotangent of the right shape; out is at hand.

  return best_time(fwd, (q, k, v), reps), best_time(fwd_bwd, (q, k, v), reps)


class Impl:
  """An impl by name: 'dense', a kernels impl, or 'IMPL/Nd' for IMPL with heads split over N
  devices (shard_map through kernels.attention's head_axes)."""

  def __init__(self, name):
    self.name = name
    impl, _, devices = name.partition("/")
    self.impl, self.devices = impl, int(devices.rstrip("d") or 1)
    self.mesh = None
    if self.devices > 1:
      self.mesh = jax.make_mesh((self.devices,), ("heads",), devices=jax.devices()[:self.devices],
                                axis_types=(jax.sharding.AxisType.Auto,))

  def place(self, *arrays):
    if self.mesh is None:
      return arrays
    split = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(None, None, "heads"))
    return tuple(jax.device_put(a, split) for a in arrays)

  def context(self):
    """The mesh kernels.attention shards over; set outside jit, as the trainer does."""
    return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

  def __call__(self, q, k, v, window):
    if self.impl == "dense":
      return dense(q, k, v, window=window)
    head_axes = None if self.mesh is None else "heads"
    return kernels.attention(q, k, v, window=window, impl=self.impl, head_axes=head_axes)


CHECK_WINDOWS = (64, 256, 1024, None)
# Relative error of out, dq, dk, dv against xla in float32 that a check line must stay under.
CHECK_TOL = {"float32": 1e-4, "bfloat16": 2e-2}


def check(impls, B, N, K, H, T=2048):
  """Each impl's output and dq, dk, dv against 'xla' in float32 (dots at HIGHEST), in float32
  and bfloat16, windows 64 / 256 / 1024 / global, with and without packed segments. Prints one line per
  case with PASS / FAIL against CHECK_TOL; returns the number of failures."""
  rng = np.random.default_rng(1)
  q = rng.standard_normal((B, T, N, H))
  k, v = (rng.standard_normal((B, T, K, H)) for _ in range(2))
  packed = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.002, axis=1) + 1, jnp.int32)
  failures = 0
  for w in CHECK_WINDOWS:
    for seg in (None, packed):
      def grads(impl, dt):
        fn = lambda q, k, v: kernels.attention(q, k, v, window=w, segment_ids=seg, impl=impl)
        args = [jnp.asarray(a, dt) for a in (q, k, v)]
        out, vjp = jax.vjp(jax.jit(fn), *args)
        return [np.asarray(x, np.float32) for x in (out, *vjp(out))]
      # The reference in full float32: on GPUs jax's default float32 dots run at TF32
      # (unit roundoff 4.9e-4), which alone exceeds CHECK_TOL's float32 bar.
      with jax.default_matmul_precision("highest"):
        want = grads("xla", jnp.float32)
      for name in impls:
        for dt in (jnp.float32, jnp.bfloat16):
          label = (f"# check {name} w={'global' if w is None else w} "
                   f"seg={'packed' if seg is not None else 'none'} {jnp.dtype(dt).name}")
          try:
            got = grads(name, dt)
          except ValueError as e:  # e.g. cuDNN takes no float32: said, not hidden.
            print(f"{label}: not supported ({e})", flush=True)
            continue
          errs = [np.linalg.norm(g - r) / np.linalg.norm(r) for g, r in zip(got, want)]
          ok = max(errs) <= CHECK_TOL[jnp.dtype(dt).name]
          failures += not ok
          print(f"{label} vs xla float32: rel err out/dq/dk/dv "
                + " ".join(f"{e:.1e}" for e in errs) + (" PASS" if ok else " FAIL"), flush=True)
  print(f"# check: {failures} failures", flush=True)
  return failures


def git_commit():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "hybrid_nope/kernels",
                            "benchmarks/attention.py"], cwd=root, capture_output=True,
                           text=True).stdout.strip()
    return commit + (" + uncommitted kernel changes" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
  parser.add_argument("--T", help="comma-separated sequence lengths")
  parser.add_argument("--windows", help="comma-separated windows; 'global' for None")
  parser.add_argument("--impls", help="comma-separated impls, or 'available'")
  parser.add_argument("--dtype", choices=["float32", "bfloat16"])
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int)
  parser.add_argument("--kv-heads", type=int)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--dense-reps", type=int, default=1,
                      help="dense calls take seconds each; one timed call after compiling")
  parser.add_argument("--no-dense", action="store_true", help="skip the dense baseline")
  parser.add_argument("--dense-budget-gb", type=float,
                      help="skip dense cases whose score tensors would exceed this")
  parser.add_argument("--case-budget-s", type=float, default=300.0,
                      help="skip dense cases predicted (from the last T) to take longer")
  parser.add_argument("--host-devices", type=int, default=os.cpu_count() or 1,
                      help="CPU: split the host into this many devices (XLA_FLAGS, set before "
                      "jax starts) and add IMPL/Nd rows with heads split over them")
  parser.add_argument("--linear-impls", default="xla",
                      help="comma-separated kernels.linear_attention impls timed as "
                      "'linear-IMPL' rows, or 'none'")
  parser.add_argument("--delta-impls", default="xla",
                      help="comma-separated kernels.delta_attention impls timed as "
                      "'delta-IMPL' rows, or 'none'")
  parser.add_argument("--delta-gates", default="head",
                      help="comma-separated delta rule gates: head (w column gdn), channel "
                      "(kda)")
  parser.add_argument("--check", action="store_true",
                      help="first compare each impl's output and gradients with 'xla' in float32")
  args = parser.parse_args(argv)
  gate_labels = {"head": "gdn", "channel": "kda"}
  if set(args.delta_gates.split(",")) - set(gate_labels):
    sys.exit(f"--delta-gates {args.delta_gates}: expected a list of {sorted(gate_labels)}")
  preset = PRESETS[args.preset]
  Ts = [int(t) for t in (args.T or preset["T"]).split(",")]
  windows = [None if w == "global" else int(w)
             for w in (args.windows or preset["windows"]).split(",")]
  dtype = jnp.dtype(args.dtype or preset["dtype"])
  B, H = args.batch, args.head_dim
  N = args.heads or preset["heads"]
  K = args.kv_heads or (preset["kv_heads"] if args.heads is None else N)
  dense_budget_gb = args.dense_budget_gb or preset["dense_budget_gb"]

  probe = jnp.zeros((B, 8, N, H), dtype)
  impls = args.impls or preset["impls"]
  impls = list(kernels.available_impls(probe)) if impls == "available" else impls.split(",")
  unavailable = [i for i in impls if i not in kernels.available_impls(probe)]
  for name in unavailable:
    print(f"# impl {name!r} skipped: not available on backend {jax.default_backend()!r}")
  impls = [i for i in impls if i not in unavailable]
  devices = min(args.host_devices, jax.device_count()) if jax.default_backend() == "cpu" else 1
  if devices > 1:
    if N % devices or K % devices:
      sys.exit(f"--heads {N} / --kv-heads {K} must divide over --host-devices {devices}")
    impls += [f"{i}/{devices}d" for i in impls]
  impls += [] if args.no_dense else ["dense"]

  if args.check:
    check([i for i in impls if "/" not in i and i != "dense"], B, N, K, H)
  roofline_before = matmul_rate(dtype, max(args.reps, 5))

  rng = np.random.default_rng(0)
  results = {}  # (impl, T, w) -> (fwd s, fwd+bwd s), or a string saying why there is none
  for w in windows:
    last_dense = None  # (T, fwd+bwd seconds) to predict the next dense case.
    for T in Ts:
      q = jnp.asarray(rng.standard_normal((B, T, N, H)), dtype)
      k, v = (jnp.asarray(rng.standard_normal((B, T, K, H)), dtype) for _ in range(2))
      order = (["dense"] if "dense" in impls else []) + [i for i in impls if i != "dense"]
      for name in order:  # Dense first: the others' speedups are relative to it.
        if name == "dense":
          # Scores, probabilities and their cotangents: ~4 live [B, N, T, T] float32 tensors.
          gb = 4 * B * N * T * T * 4 / 1e9
          predicted = None if last_dense is None else last_dense[1] * (T / last_dense[0]) ** 2
          if gb > dense_budget_gb:
            results[(name, T, w)] = f"skipped (~{gb:.0f} GB > {dense_budget_gb:.0f} GB budget)"
            continue
          if predicted and predicted * 2 * (args.dense_reps + 1) > args.case_budget_s:
            results[(name, T, w)] = f"skipped (predicted ~{predicted:.0f} s per call)"
            continue
        reps = args.dense_reps if name == "dense" else args.reps
        try:
          results[(name, T, w)] = timed(Impl(name), q, k, v, w, reps)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: report it, keep going.
          results[(name, T, w)] = (f"failed ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:80]})")
          continue
        if name == "dense":
          last_dense = (T, results[(name, T, w)][1])
        print(f"# done {name} T={T} w={w}: {results[(name, T, w)]}", file=sys.stderr,
              flush=True)

  # Mixer rows: (row name, mixer, gate label), e.g. ("delta-xla/2d", "delta", "gdn").
  mixer_rows = []
  for mixer, names, labels in (("linear", args.linear_impls, ["gla"]),
                               ("delta", args.delta_impls,
                                [gate_labels[g] for g in args.delta_gates.split(",")])):
    names = [] if names == "none" else names.split(",")
    names += [f"{i}/{devices}d" for i in names] if devices > 1 else []
    mixer_rows += [(f"{mixer}-{name}", mixer, label) for name in names for label in labels]
  for T in Ts:
    q = jnp.asarray(rng.standard_normal((B, T, N, H)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((B, T, K, H)), dtype) for _ in range(2))
    for row, mixer, label in mixer_rows:
      kernel, _, gate_makers = MIXERS[mixer]
      gates = gate_makers[label](rng, B, T, K, H, dtype)
      try:
        results[(row, T, label)] = timed_mixer(kernel, Impl(row.split("-", 1)[1]), q, k, v,
                                               gates, args.reps)
      except Exception as e:  # noqa: BLE001 - report it, keep going.
        results[(row, T, label)] = (f"failed ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0][:80]})")
      print(f"# done {row} {label} T={T}: {results[(row, T, label)]}", file=sys.stderr,
            flush=True)

  # Measured before and after the cases; the fractions use the better of the two, so a busy
  # moment during one measurement cannot flatter them.
  roofline = max(roofline_before, matmul_rate(dtype, max(args.reps, 5)))
  print(f"# backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax "
        f"{jax.__version__}, commit {git_commit()}")
  print(f"# B={B} N={N} K={K} H={H} {dtype.name}; roofline (4096² matmul, best of before and "
        f"after the cases) {roofline:.1f} GFLOP/s; times are best of {args.reps} "
        f"({args.dense_reps} for dense) after a compile run")
  peak, peak_source = peak_flops_per_device()
  print(f"# peak {peak / 1e12:.2f} TFLOP/s ({peak_source}); useful FLOPs count only "
        "the query-key pairs attended: 4·H per pair forward, 12·H forward + backward")
  print("| impl | T | w | fwd ms | fwd+bwd ms | fwd GFLOP/s | fwd+bwd GFLOP/s "
        "| % roofline (fwd+bwd) | % peak (fwd+bwd) | speedup vs dense fwd "
        "| speedup vs dense fwd+bwd |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for w in windows:
    for T in Ts:
      pairs = in_window_pairs(T, w)
      base = results.get(("dense", T, w))
      for name in (["dense"] if "dense" in impls else []) + [i for i in impls if i != "dense"]:
        label = "global" if w is None else w
        r = results.get((name, T, w))
        if isinstance(r, str):
          print(f"| {name} | {T} | {label} | {r} | | | | | | | |")
          continue
        fwd_s, fb_s = r
        fwd_rate = 4 * B * N * H * pairs / fwd_s / 1e9
        fb_rate = 12 * B * N * H * pairs / fb_s / 1e9
        timed_base = isinstance(base, tuple) and name != "dense"
        speed_f = f"{base[0] / fwd_s:.1f}x" if timed_base else ""
        speed_fb = f"{base[1] / fb_s:.1f}x" if timed_base else ""
        print(f"| {name} | {T} | {label} | {fwd_s * 1e3:.1f} | {fb_s * 1e3:.1f} | {fwd_rate:.1f}"
              f" | {fb_rate:.1f} | {100 * fb_rate / roofline:.0f}% | "
              f"{100 * fb_rate * 1e9 / peak:.1f}% | {speed_f} | {speed_fb} |")

  for row, mixer, label in mixer_rows:
    for T in Ts:
      flops = B * T * MIXERS[mixer][1](N, K, H)
      r = results.get((row, T, label))
      if isinstance(r, str):
        print(f"| {row} | {T} | {label} | {r} | | | | | | | |")
        continue
      fwd_rate, fb_rate = flops / r[0] / 1e9, 3 * flops / r[1] / 1e9
      print(f"| {row} | {T} | {label} | {r[0] * 1e3:.1f} | {r[1] * 1e3:.1f} | {fwd_rate:.1f} "
            f"| {fb_rate:.1f} | {100 * fb_rate / roofline:.0f}% | "
            f"{100 * fb_rate * 1e9 / peak:.1f}% | | |")
  for row, mixer, label in mixer_rows:  # Each mixer against each timed attention window and,
    impl = row.split("-", 1)[1]          # for the delta rule, linear attention, same impl.
    base_impl = impl if impl in impls else None
    for T in Ts:
      r = results.get((row, T, label))
      if not isinstance(r, tuple):
        continue
      for w in windows:
        a = results.get((base_impl, T, w))
        if isinstance(a, tuple):
          print(f"# {row} {label} T={T}: fwd+bwd time / {impl} w={'global' if w is None else w}"
                f" {r[1] / a[1]:.2f} (fwd {r[0] / a[0]:.2f})")
      a = results.get((f"linear-{impl}", T, "gla"))
      if mixer == "delta" and isinstance(a, tuple):
        print(f"# {row} {label} T={T}: fwd+bwd time / linear-{impl} {r[1] / a[1]:.2f} "
              f"(fwd {r[0] / a[0]:.2f})")

  # Linear-in-T check for windowed layers: ideal time(4T)/time(T) is 4.
  for row, _, label in mixer_rows:
    lo, hi = results.get((row, 4096, label)), results.get((row, 16384, label))
    if isinstance(lo, tuple) and isinstance(hi, tuple):
      print(f"# {row} {label}: time(T=16384)/time(T=4096) fwd {hi[0] / lo[0]:.2f}, "
            f"fwd+bwd {hi[1] / lo[1]:.2f}")
  for name in impls:
    for w in windows:
      lo, hi = results.get((name, 4096, w)), results.get((name, 16384, w))
      if isinstance(lo, tuple) and isinstance(hi, tuple):
        print(f"# {name} w={'global' if w is None else w}: time(T=16384)/time(T=4096) "
              f"fwd {hi[0] / lo[0]:.2f}, fwd+bwd {hi[1] / lo[1]:.2f}")


if __name__ == "__main__":
  main()
