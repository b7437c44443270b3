"""The HF export's L and D mixers (modeling_hybrid_nope.py): the forward of one mixer, this
tree's chunked recurrence against the file at `--baseline` (a commit; the token-by-token loop
before 2026-12-03), at 350m's shapes (d_model 1024, 16 heads of 64), batch 1, float32, CPU.

  .venv-hf/bin/python benchmarks/hf_recurrence.py [--lengths=256,1024,4096] [--baseline=7af5dba]
      [--chunk=16]

Prints a table of milliseconds per forward (median of --reps) and the largest difference of the
two outputs relative to the largest output. Needs torch and transformers (`make install-hf`).
"""
import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("configuration_hybrid_nope.py", "modeling_hybrid_nope.py")
MIXERS = {"L": ("GatedLinearAttention", {}), "D": ("GatedDeltaNet", {"delta_gate": "head"}),
          "D channel": ("GatedDeltaNet", {"delta_gate": "channel"})}


def load(directory: str, name: str):
  """modeling_hybrid_nope from `directory` as package `name` (it imports its config relatively)."""
  init = os.path.join(directory, "__init__.py")
  open(init, "a").close()
  spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[directory])
  sys.modules[name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(sys.modules[name])
  return importlib.import_module(f"{name}.modeling_hybrid_nope")


def at_commit(commit: str, into: str) -> str:
  for f in FILES:
    text = subprocess.run(["git", "show", f"{commit}:hybrid_nope/export/{f}"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout
    with open(os.path.join(into, f), "w") as out:
      out.write(text)
  return into


def mixer(module, kind: str):
  cls, gate = MIXERS[kind]
  config = module.HybridNopeConfig(hidden_size=1024, num_attention_heads=16,
                                   num_key_value_heads=16, head_dim=64, num_hidden_layers=1,
                                   layer_kinds=kind[0], **gate)
  torch.manual_seed(0)
  return getattr(module, cls)(config, 0).eval()


@torch.no_grad()
def timed(layer, x, reps: int):
  starts = torch.zeros(x.shape[:2], dtype=torch.bool)
  starts[:, 0] = True
  out, times = layer.mix(x, starts, None, None), []  # The first call pays one-time set-up.
  for _ in range(reps):
    begin = time.perf_counter()
    out = layer.mix(x, starts, None, None)
    times.append(time.perf_counter() - begin)
  return sorted(times)[len(times) // 2] * 1e3, out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--lengths", default="256,1024,4096")
  parser.add_argument("--baseline", default="7af5dba")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--chunk", type=int, default=None, help="Default: the file's CHUNK.")
  args = parser.parse_args()
  ours = load(os.path.join(REPO, "hybrid_nope", "export"), "export_here")
  ours.chunked_recurrence = functools.partial(ours.chunked_recurrence,
                                              chunk=args.chunk or ours.CHUNK)
  base = load(at_commit(args.baseline, tempfile.mkdtemp()), "export_baseline")
  print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; baseline "
        f"{args.baseline}; chunk {args.chunk or ours.CHUNK}; ms per forward of one mixer, B=1, "
        f"d_model 1024, 16 heads of 64")
  print("| mixer | T | baseline ms | chunked ms | speed-up | max rel. difference |")
  print("|---|---|---|---|---|---|")
  for kind in MIXERS:
    new, old = mixer(ours, kind), mixer(base, kind)
    old.load_state_dict(new.state_dict())
    for T in map(int, args.lengths.split(",")):
      x = torch.randn(1, T, 1024, generator=torch.Generator().manual_seed(T))
      t_old, y_old = timed(old, x, args.reps)
      t_new, y_new = timed(new, x, args.reps)
      err = ((y_new - y_old).abs().max() / y_old.abs().max()).item()
      print(f"| {kind} | {T} | {t_old:.1f} | {t_new:.1f} | {t_old / t_new:.1f}x | {err:.1e} |")


if __name__ == "__main__":
  main()
