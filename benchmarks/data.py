"""Tokens/s of the full ProLong data pipeline on one CPU core vs what one accelerator consumes.

  python benchmarks/data.py                      # synthetic ProLong-like data, written first
  python benchmarks/data.py --data_path=$PROLONG # real data, the ProLong 64K mixture

Measures `loader.train_iterator` (read memory-mapped MDS shards, mix domains, cut 64K
samples into seq_len rows, segment ids / positions / weights, batch) on one core
(sched_setaffinity), after warm-up batches (zstd shards decompressed once into the cache, files
in the page cache: a cold network disk is not measured).

The synthetic data mirrors ProLong 64K: 65536-token packed samples (input_ids uint32 +
indices) with long documents (books, code repos, one zstd-compressed) and short ones
(fineweb-edu style), plus a raw domain of short documents packed on the fly; token ids are
uniform in the Llama-3 vocabulary (128256).

Consumption: tokens/s = MFU x peak FLOP/s / (training FLOPs per token), FLOPs per token from
hybrid_nope.train.flops.flops_per_token for configs/swa256_350m.py at the same seq_len, peak
from the dense bf16 datasheet numbers in hybrid_nope.train.flops.PEAK_FLOPS (H100 SXM
989 TFLOP/s, TPU v5p 459 TFLOP/s). The target compares with 100% MFU, an upper bound on
what a chip can consume: pipeline >= 10x that.

Hash verification (data.verify_hashes): an uncompressed domain of --hash_tokens tokens is
written with md5 and sha1 in index.json and opened four ways: unchecked, first open (every
shard hashed), again (stamped in the cache, not hashed), and with verify_hashes='always'
(hashed at every start); printed as seconds per GB.
"""
import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from configs import base  # noqa: E402
from hybrid_nope.data.formats import mds
from hybrid_nope.data.pipeline import loader  # noqa: E402
from hybrid_nope.train.flops import PEAK_FLOPS, flops_per_token  # noqa: E402

VOCAB = 128256
SAMPLE_LEN = 65536
# name -> (mean document length, packed?, compression, proportion)
SYNTHETIC = {
    "book-65536": (40000, True, None, 0.4),
    "thestackv1_concat_by_repo-65536": (20000, True, "zstd", 0.3),
    "fineweb-edu": (1000, True, None, 0.2),
    "tuluv2": (600, False, None, 0.1),
}


def synthetic_samples(rng, mean_doc, packed, num_tokens):
  """Documents of exponential length (>= 2) with BOS 128000 first; packed into 64K samples."""
  made = 0
  pending_ids, pending_idx, length = [], [], 0
  while made < num_tokens:
    n = int(min(max(2, rng.exponential(mean_doc)), SAMPLE_LEN))
    doc = rng.integers(0, VOCAB, n, dtype=np.uint32)
    doc[0] = 128000
    made += n
    if not packed:
      yield {"input_ids": doc, "length": n, "domain": "raw"}
      continue
    doc = doc[:SAMPLE_LEN - length]
    pending_ids.append(doc)
    pending_idx.append((length, length + doc.size))
    length += doc.size
    if length == SAMPLE_LEN:
      yield {"input_ids": np.concatenate(pending_ids),
             "indices": np.array(pending_idx, np.uint32), "domain": "packed"}
      pending_ids, pending_idx, length = [], [], 0


def write_synthetic(root, tokens_per_domain):
  rng = np.random.default_rng(0)
  domains = []
  for name, (mean_doc, packed, compression, proportion) in SYNTHETIC.items():
    columns = ({"input_ids": "ndarray:uint32", "indices": "ndarray:uint32", "domain": "str"}
               if packed else {"input_ids": "ndarray:uint32", "length": "int32", "domain": "str"})
    mds.write_mds(os.path.join(root, name), columns,
                  synthetic_samples(rng, mean_doc, packed, tokens_per_domain),
                  compression=compression)
    domains.append(f"{name}@{proportion}")
  return tuple(domains)


def hash_verification_cost(root, num_tokens):
  """Seconds per GB of shards to open an uncompressed domain, by how it is verified."""
  path = os.path.join(root, "hashed")
  rng = np.random.default_rng(1)
  mds.write_mds(path, {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32",
                       "domain": "str"},
                synthetic_samples(rng, 2000, True, num_tokens), hashes=("md5", "sha1"))
  shard_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                    if f.startswith("shard."))
  gb = shard_bytes / 1e9
  cache = os.path.join(root, "hash_cache")

  def open_seconds(verify):
    t = time.perf_counter()
    mds.MDSDataset(path, cache_dir=cache, verify_hashes=verify).array_lengths("input_ids")
    return time.perf_counter() - t

  open_seconds(False)  # Page cache warm: the disk is not what is measured.
  rows = [("verify_hashes=False", open_seconds(False)),
          ("verify_hashes=True, first open (sha1 of every shard)", open_seconds(True)),
          ("verify_hashes=True, stamped (later starts)", open_seconds(True)),
          ("verify_hashes='always' (every start, past the stamps)", open_seconds("always"))]
  with open(os.path.join(path, sorted(f for f in os.listdir(path) if f.startswith("shard."))[0]),
            "rb") as f:
    sample = f.read()
  print(f"\nhash verification: {shard_bytes / 1e6:.0f} MB of uncompressed shards "
        f"({num_tokens / 1e6:.0f}M tokens), files in the page cache, 1 core\n")
  print("| open | seconds | seconds per GB |")
  print("|---|---|---|")
  for name, seconds in rows:
    print(f"| {name} | {seconds:.3f} | {seconds / gb:.2f} |")
  print("\n| hashlib algorithm, one shard already in memory | seconds per GB |")
  print("|---|---|")
  for algo in ("sha1", "md5", "sha256"):
    best = float("inf")
    for _ in range(3):
      t = time.perf_counter()
      h, view = hashlib.new(algo), memoryview(sample)
      for start in range(0, len(sample), 1 << 22):  # 4 MiB chunks, as the reader hashes
        h.update(view[start:start + (1 << 22)])
      h.hexdigest()
      best = min(best, time.perf_counter() - t)
    print(f"| {algo} | {best / (len(sample) / 1e9):.2f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_path", default="", help="a ProLong directory (default: synthetic)")
  parser.add_argument("--domains", default=",".join(base.PROLONG_DOMAINS))
  parser.add_argument("--seq_len", type=int, default=8192)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--batches", type=int, default=100)
  parser.add_argument("--warmup", type=int, default=10)
  parser.add_argument("--tokens_per_domain", type=int, default=4 * 10**6)
  parser.add_argument("--core", type=int, default=0, help="the CPU core to run on")
  parser.add_argument("--hash_tokens", type=int, default=64 * 10**6,
                      help="tokens in the domain timed for hash verification; 0 to skip")
  args = parser.parse_args()
  os.sched_setaffinity(0, {args.core})

  tmp = tempfile.mkdtemp(prefix="bench_data_")
  try:
    if args.data_path:
      path, domains = args.data_path, tuple(args.domains.split(","))
    else:
      path = os.path.join(tmp, "prolong")
      t = time.perf_counter()
      domains = write_synthetic(path, args.tokens_per_domain)
      print(f"wrote synthetic data ({len(domains)} domains x {args.tokens_per_domain} tokens) "
            f"in {time.perf_counter() - t:.1f}s")
    config = ml_collections.ConfigDict({
        "data": {"source": "mds", "path": path, "domains": domains, "seq_len": args.seq_len,
                 "batch_size": args.batch_size, "seed": 0, "document_masking": True,
                 "cache_dir": os.path.join(tmp, "cache"), "verify_hashes": True,
                 "exclude_samples": ()},
        "model": {"vocab_size": VOCAB}})
    t = time.perf_counter()
    iterator = loader.train_iterator(config)
    print(f"pipeline built in {time.perf_counter() - t:.2f}s")
    for _ in range(args.warmup):
      next(iterator)
    t = time.perf_counter()
    for _ in range(args.batches):
      batch = next(iterator)
    seconds = time.perf_counter() - t
    tokens = args.batches * args.batch_size * args.seq_len
    rate = tokens / seconds
    assert batch["inputs"].shape == (args.batch_size, args.seq_len)

    model = base.experiment("350m", 256).model
    fpt = flops_per_token(model, args.seq_len)
    print(f"\npipeline on 1 CPU core (affinity {{{args.core}}}): {rate / 1e6:.2f}M tokens/s "
          f"({args.batches} batches of {args.batch_size} x {args.seq_len} in {seconds:.2f}s, "
          f"{seconds / (args.batches * args.batch_size) * 1e6:.0f} us per row)")
    print(f"350M swa256 training step: {fpt / 1e9:.3f} GFLOP/token at seq_len {args.seq_len}\n")
    print("| chip | bf16 peak | MFU | consumes tokens/s | pipeline / consumption |")
    print("|---|---|---|---|---|")
    for chip in ("H100", "TPU v5p"):
      for mfu in (1.0, 0.4):
        consumed = mfu * PEAK_FLOPS[chip] / fpt
        print(f"| {chip} | {PEAK_FLOPS[chip] / 1e12:.0f} TFLOP/s | {mfu:.0%} | "
              f"{consumed / 1e3:.0f}K | {rate / consumed:.1f}x |")
    worst = rate / (PEAK_FLOPS["H100"] / fpt)
    print(f"\ntarget >= 10x at 100% MFU on the faster chip: "
          f"{'met' if worst >= 10 else 'NOT met'} ({worst:.1f}x)")
    if args.hash_tokens:
      hash_verification_cost(tmp, args.hash_tokens)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
