"""The paper's own far lag on one GPU: seq_len 8192, metrics.far_lag 4096 (L = 4096, as DESIGN.md
and the 120m/350m configs), stdlib bytes (no download), the experiments of configs/small.py at
a shape a lent H100 trains in minutes: 8 layers, d_model 512, 8 heads × 64, SwiGLU 1536, byte
vocabulary (258, tied), 640 steps of 8 rows × 8192 tokens, recency every 64 steps (11
measurements), eval every 128.

  python launch/train.py --config=configs/lag4096.py:swa256 --config.train.seed=0 \\
      --workdir=workdirs/lag4096/swa256/seed0
  python launch/sweep.py --config_file=configs/lag4096.py \\
      --experiments=swa64,swa256,swa1024,swa4096,nope,nopeswa4096 --seeds=0 --parallel=1 \\
      --root=workdirs/lag4096 --records_dir=docs/results/runs_lag4096
  bash benchmarks/lag4096_lease.sh 1     # the sweep of seed 1 on a lent GPU, a timeout per run

Experiments (EXPERIMENTS, the sweep): swa{64,256,1024,4096} (RoPE in SWA), nope (global NoPE
only) and nopeswa4096 (NoPE in SWA). The NoPE-in-SWA window is 4096 because the claim it reaches
is about large windows ("NoPE-in-SWA with large windows makes the logit gap swing in sign and the
loss collapse"): 4096 is the largest window, equal to the far lag, and pairs with swa4096 (the
same window with RoPE); configs/small.py already holds the small NoPE windows (64, 256). Any
other name configs/small.py parses works here too (rope, swa64_globalrope, gla, ...: the
shape, data and schedule below replace small.py's).

The arithmetic (FLOPs: hybrid_nope/train/flops.py; gpu_seconds below). Per run 640 × 8 × 8192
= 41.9 M tokens (1.4 passes over the ~30 MB stdlib train split). Training FLOPs per token at
seq_len 8192: swa64 267 M, swa256 271 M, swa1024 289 M, swa4096 341 M, nope 366 M, nopeswa4096
341 M; 1.87 GFLOP/token over the six, 7.9e16 FLOPs for the sweep. Rate: docs/performance.md "GPU:
one H200" measured the 120m SG step (d_model 768, 128K vocabulary) at 232,370 tokens/s × 1.553
GFLOP/token = 3.6e14 FLOP/s, 36.5% MFU; this model's narrower matmuls are assumed to reach
ASSUMED_MFU = 20% of an H100's 989 TFLOP/s (same bf16 peak as the H200; not yet measured at this
shape: the lease script's metrics.jsonl gives the real tokens/s), 1.98e14 FLOP/s. So the runs
train in swa64 56.5 s, swa256 57.5, swa1024 61.2, swa4096 72.2, nope 77.6, nopeswa4096 72.2: the
six in 397 s; with the recency measurements (11 × two forwards of 32 rows: ~0.5 s each), the
evals and the checkpoints, ~8 min of one H100 after compiles (at the measured 36.5%: ~4 min).
Compiles come on top (train step, eval, hook; the 120m init took 3 min to compile on the H200).

Cost (lag4096.py:swa256): 271 MFLOP/token × 41.9 M tokens (640 steps × 8 × 8192) = 1.1e16 FLOPs.
"""
from configs import small
from hybrid_nope.train import flops

EXPERIMENTS = ("swa64", "swa256", "swa1024", "swa4096", "nope", "nopeswa4096")
STEPS = 640
SHAPE = dict(num_layers=8, d_model=512, num_heads=8, num_kv_heads=8, head_dim=64, mlp_dim=1536)
# The throughput the GPU estimate assumes (see the docstring): a fraction of the H100's peak.
ASSUMED_MFU = 0.20
GPU = "H100"


def get_config(experiment: str = "swa256"):
  c = small.get_config(experiment)  # The pattern, window and positions the name says.
  c.model.update(SHAPE)
  if experiment.endswith("_deep"):  # The pattern repeated to twice the layers, as in small.py.
    c.model.num_layers *= 2
  c.data.update(dict(seq_len=8192, batch_size=8))
  c.train.update(dict(steps=STEPS, warmup_steps=STEPS // 10, learning_rate=1e-3,
                      schedule_offset=1))
  c.checkpoint.update(dict(every_steps=STEPS // 2, keep=2))
  c.eval.update(dict(batch_size=8, num_batches=4, every_steps=128, bucket_size=1024))
  # The probe: 32 of the first 128 eval rows (the stdlib eval split packs into ~177 rows of 8192).
  c.metrics.update(dict(far_lag=4096, every_steps=64, probe_batch_size=32, probe_pool_rows=128,
                        query_positions=1024))
  return c


def gpu_seconds(experiment: str, mfu: float = ASSUMED_MFU) -> float:
  """Estimated training seconds of one run on one GPU at `mfu` of its bf16 peak (no compiles,
  measurements or checkpoints): FLOPs per token × tokens / (peak × mfu)."""
  c = get_config(experiment)
  tokens = c.train.steps * c.data.batch_size * c.data.seq_len
  return (flops.flops_per_token(c.model, c.data.seq_len) * tokens
          / (flops.PEAK_FLOPS[GPU] * mfu))
