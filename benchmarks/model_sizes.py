"""Print the exact shapes, parameter counts and training FLOPs per token of every named size.

  python benchmarks/model_sizes.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402

from configs import base, demo  # noqa: E402
from hybrid_nope.model import LanguageModel, parameter_counts  # noqa: E402
from hybrid_nope.train.flops import flops_per_token  # noqa: E402


def row(name, config):
  m = config.model
  model = nnx.eval_shape(lambda: LanguageModel(m, rngs=nnx.Rngs(0)))
  counts = parameter_counts(model)
  gflops = flops_per_token(m, config.data.seq_len) / 1e9
  return (f"| {name} | {m.pattern} x{m.num_layers} | {m.d_model} | {m.num_heads}/{m.num_kv_heads}"
          f" x {m.head_dim} | {m.mlp_dim} | {m.vocab_size} | {'yes' if m.tie_embeddings else 'no'}"
          f" | {counts['non_embedding'] / 1e6:.1f}M | {counts['total'] / 1e6:.1f}M"
          f" | {config.data.seq_len} | {gflops:.3f} |")


def main():
  print("| config | layers | d_model | heads (q/kv) x head_dim | mlp_dim | vocab | tied"
        " | non-embedding | total | seq_len | train GFLOP/token |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  print(row("demo", demo.get_config()))
  for size in base.SIZES:
    print(row(f"swa256_{size}", base.experiment(size, 256)))
    print(row(f"nope_{size}", base.experiment(size, None)))


if __name__ == "__main__":
  main()
