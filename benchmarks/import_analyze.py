"""Time and peak memory of launch/import_hf.py and launch/analyze.py on random models of the
SmolLM3-3B layout (full attention, NoPE in every fourth layer, GQA, tied, bfloat16 weights),
each command in its own process; docs/analysis.md scales them to SmolLM3-3B.

  python benchmarks/import_analyze.py [--sizes=tiny,mid,large] [--seq_len=1024] [--probe_rows=8]

The probe is docs/analysis.md's for SmolLM3-3B at a shorter length: metrics.probe_batch_size
rows of seq_len tokens, metrics.query_positions 1024, far lag seq_len / 2, eval 2 x 4 rows,
--lengths=1 (no extrapolation), --rows_per_call=1. Prints one row per size: parameters, the
weights' bytes, each command's wall time and peak RSS (the process's own, from wait4), and the
tokens the analysis runs through the model (the probe twice, clean and shuffled, for the
checkpoint and for its fresh initialisation, then the eval rows); `base` is a process that
imports the same libraries, runs one jax op and exits.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from configs import base  # noqa: E402
from hybrid_nope.export import hf  # noqa: E402
from hybrid_nope.export import tokenizer as export_tokenizer  # noqa: E402
from hybrid_nope.model.definition import init_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SmolLM3-3B: d 2048, 36 layers, 16 heads / 4 kv of 128, MLP 11008, vocab 128256 (docs/analysis.md).
SIZES = {"tiny": dict(d_model=64, num_layers=4, num_heads=4, num_kv_heads=1, head_dim=16,
                      mlp_dim=192, vocab_size=2048),
         "mid": dict(d_model=512, num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
                     mlp_dim=1376, vocab_size=32768),
         "large": dict(d_model=1024, num_layers=8, num_heads=16, num_kv_heads=4, head_dim=64,
                       mlp_dim=2752, vocab_size=128256)}


def model_config(size: str, seq_len: int) -> ml_collections.ConfigDict:
  config = base.get_config()
  # SmolLM3-3B's layout in our letters: RoPE full attention = S with a window past any length.
  config.model.update(SIZES[size], pattern="SSSG", window=4 * seq_len, tie_embeddings=True,
                      rope_theta=5e6, norm_eps=1e-6)
  config.data.source = "stdlib"
  return config


def write_hf(out: str, config) -> int:
  """A random model of `config` as transformers would ship it (bfloat16, no metadata of ours)
  with our byte tokenizer; returns its parameter count."""
  _, params = init_model(config.model, seed=0)
  tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in hf.hf_state_dict(
      params, config.model).items()}
  os.makedirs(out)
  hf.write_safetensors(os.path.join(out, hf.WEIGHTS_FILE), tensors, {"format": "pt"})
  with open(os.path.join(out, hf.CONFIG_FILE), "w") as f:
    json.dump(hf.hf_config(config), f)
  export_tokenizer.plan(config, None).write(out)  # Ours: the stdlib corpus is the text set.
  return sum(x.size for x in tensors.values())


def measured(*args) -> tuple[float, float]:
  """(seconds, peak RSS GiB) of `python args` in its own process."""
  begin = time.perf_counter()
  proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=REPO))
  output = proc.stdout.read()
  _, status, usage = os.wait4(proc.pid, 0)
  if status:
    sys.exit(f"{' '.join(args)} failed:\n{output.decode()[-3000:]}")
  return time.perf_counter() - begin, usage.ru_maxrss * 1024 / 2**30  # ru_maxrss: KiB (Linux)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", default="tiny,mid,large")
  p.add_argument("--seq_len", type=int, default=1024)
  p.add_argument("--probe_rows", type=int, default=8)
  p.add_argument("--keep", default=None, help="keep the models and workdirs here")
  args = p.parse_args()
  T, B = args.seq_len, args.probe_rows
  root = args.keep or tempfile.mkdtemp(prefix="import_analyze_")
  probe = {"data.seq_len": T, "metrics.far_lag": T // 2, "metrics.probe_batch_size": B,
           "metrics.query_positions": 1024, "eval.batch_size": 2, "eval.num_batches": 4,
           "eval.bucket_size": T // 4}
  eval_rows = probe["eval.batch_size"] * probe["eval.num_batches"]
  print(f"seq_len {T}, probe {B} rows, eval {eval_rows} rows, query positions 1024, "
        f"{os.cpu_count()} CPUs; JAX on {os.environ.get('JAX_PLATFORMS') or 'default'}")
  seconds, rss = measured("-c", "import jax; jax.numpy.zeros(1).block_until_ready(); "
                          "import hybrid_nope.analysis.checkpoint.report")
  print(f"base process (imports, one jax op): {seconds:.1f} s, {rss:.2f} GiB peak RSS\n")
  print("| size | parameters | bf16 weights | import s | import peak RSS | analyze s | "
        "analyze peak RSS | tokens forwarded |\n|---|---|---|---|---|---|---|---|")
  for size in args.sizes.split(","):
    config = model_config(size, T)
    hf_dir, workdir = os.path.join(root, size, "hf"), os.path.join(root, size, "workdir")
    count = write_hf(hf_dir, config)
    flags = [f"--config.{k}={v}" for k, v in probe.items()]
    t_import, m_import = measured("launch/import_hf.py", f"--hf={hf_dir}", f"--out={workdir}",
                                  *flags)
    t_analyze, m_analyze = measured("launch/analyze.py", f"--workdir={workdir}", "--lengths=1",
                                    "--rows_per_call=1")
    tokens = (4 * B + eval_rows) * T
    print(f"| {size} | {count / 1e6:.1f}M | {2 * count / 2**30:.3f} GiB | {t_import:.1f} | "
          f"{m_import:.2f} GiB | {t_analyze:.1f} | {m_analyze:.2f} GiB | {tokens} |")
  if not args.keep:
    shutil.rmtree(root)


if __name__ == "__main__":
  main()
