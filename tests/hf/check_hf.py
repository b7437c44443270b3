"""The export against transformers itself: `make check-hf` (needs torch + transformers, .venv-hf).

Trains tiny demo-shaped runs with launch/train.py, exports each with launch/export_hf.py, loads
the export with transformers' SmolLM3ForCausalLM in float32 and compares its logits with ours on
sequences longer than the window (and than training):

  forward    2 rows of random tokens, eager and sdpa attention
  packed     3 documents in one row: our positions + segment_ids vs HF position_ids that restart
  decode     HF with its KV cache (sliding layers keep w - 1 keys), one token at a time
  window±1   the same export with sliding_window w - 1 and w + 1: must NOT match

Prints one table; exits 1 if an exact comparison exceeds TOLERANCE or a w ± 1 one matches.

  .venv-hf/bin/python tests/hf/check_hf.py [--keep=DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from hybrid_nope.analysis import checkpoints  # noqa: E402
from hybrid_nope.data.tokenizer import ByteTokenizer  # noqa: E402
from hybrid_nope.model import layer_kinds  # noqa: E402

TOLERANCE = 1e-4  # float32 max abs logit difference
MISMATCH = 1e-2   # w ± 1 must differ by more than this somewhere
LENGTH = 160      # compared length: > 2.5x training (64), 20x the window (8)
SHAPE = {"model.num_layers": 4, "model.d_model": 64, "model.num_heads": 4, "model.num_kv_heads": 2,
         "model.head_dim": 16, "model.mlp_dim": 128, "model.window": 8, "data.seq_len": 64,
         "data.batch_size": 4, "train.steps": 12, "train.warmup_steps": 2,
         "train.log_every_steps": 4, "checkpoint.every_steps": 12,
         "eval.batch_size": 2, "eval.num_batches": 1, "eval.every_steps": 12,
         "eval.bucket_size": 16, "metrics.far_lag": 32, "metrics.probe_batch_size": 2,
         "metrics.every_steps": 12}
VARIANTS = {
    "rope-swa gqa tied": {},
    "nope-swa gqa untied": {"model.swa_pos": "nope", "model.tie_embeddings": False},
    "rope-global mha head_dim 8": {"model.global_pos": "rope", "model.num_kv_heads": 4,
                                   "model.head_dim": 8},
    "nope-only (G)": {"model.pattern": "G"},
}
TEXTS = ["def f(x):\n    return x + 1\n", "héllo wörld ✓ 😀", "  two  spaces\tand a tab"]


def run(script, *args):
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], cwd=REPO,
                        env=env, capture_output=True, text=True)
  if proc.returncode:
    sys.exit(f"{script} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
  return proc.stdout


def train_and_export(root, name, overrides):
  slug = "".join(c if c.isalnum() else "_" for c in name)
  workdir, out = os.path.join(root, slug), os.path.join(root, "hf", slug)
  flags = [f"--config.{k}={v}" for k, v in {**SHAPE, **overrides}.items()]
  run("train.py", "--config=configs/demo.py", f"--workdir={workdir}", *flags)
  print(f"{name}: " + run("export_hf.py", f"--workdir={workdir}", f"--out={out}").splitlines()[0])
  return workdir, out


def our_logits(workdir, tokens_BT, positions_BT=None, segment_ids_BT=None):
  config = checkpoints.load_config(workdir)
  _, model_def, params = checkpoints.restore_params(workdir, config)
  model = model_def.bind(params)
  kwargs = {}
  if positions_BT is not None:
    kwargs = dict(positions_BT=jnp.asarray(positions_BT),
                  segment_ids_BT=jnp.asarray(segment_ids_BT))
  return np.asarray(model(jnp.asarray(tokens_BT), **kwargs)), config


def load_hf(out, attn="eager"):
  return transformers.SmolLM3ForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                         attn_implementation=attn).eval()


@torch.no_grad()
def hf_logits(model, tokens_BT, position_ids=None):
  return model(torch.tensor(tokens_BT), position_ids=None if position_ids is None else
               torch.tensor(position_ids), use_cache=False).logits.numpy()


@torch.no_grad()
def hf_decode_logits(model, tokens_BT, prefill):
  """Logits from a prefill of `prefill` tokens, then one token per call through HF's cache."""
  cache = transformers.DynamicCache(config=model.config)
  ids = torch.tensor(tokens_BT)
  steps = [model(ids[:, :prefill], past_key_values=cache, use_cache=True).logits]
  for t in range(prefill, ids.shape[1]):
    steps.append(model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
  return torch.cat(steps, dim=1).numpy()


def with_window(out, window, root):
  """A copy of the export whose config says sliding_window=window."""
  copy = os.path.join(root, f"{os.path.basename(out)}_w{window}")
  shutil.copytree(out, copy)
  path = os.path.join(copy, "config.json")
  with open(path) as f:
    hf_config = json.load(f)
  hf_config["sliding_window"] = window
  with open(path, "w") as f:
    json.dump(hf_config, f)
  return copy


def packed_row(vocab, rng, lengths=(50, 70, 40)):
  tokens = rng.integers(0, vocab, (1, sum(lengths)))
  positions = np.concatenate([np.arange(n) for n in lengths])[None]
  segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])[None]
  return tokens, positions, segments


def check_config(out, config):
  hf_config = transformers.AutoConfig.from_pretrained(out)
  m = config.model
  kinds = layer_kinds(m.pattern, m.num_layers)
  assert hf_config.layer_types == [{"S": "sliding_attention", "G": "full_attention"}[k]
                                   for k in kinds], hf_config.layer_types
  assert hf_config.no_rope_layers == [int((m.swa_pos if k == "S" else m.global_pos) == "rope")
                                      for k in kinds], hf_config.no_rope_layers
  assert hf_config.rope_parameters["rope_theta"] == m.rope_theta
  assert hf_config.head_dim == m.head_dim and hf_config.tie_word_embeddings == m.tie_embeddings


def check_tokenizer(out):
  tok = transformers.AutoTokenizer.from_pretrained(out)
  ours = ByteTokenizer()
  for text in TEXTS:
    ids = tok(text)["input_ids"]
    assert ids == ours.encode(text, add_eos=False).tolist(), (text, ids)
    assert tok.decode(ids, skip_special_tokens=True) == text
  return "tokenizer matches"


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--keep", default=None, help="Keep runs and exports in this directory.")
  args = parser.parse_args()
  absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on every read-only restore
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  root = args.keep or tempfile.mkdtemp(prefix="check_hf_")
  print(f"torch {torch.__version__}, transformers {transformers.__version__}; runs in {root}")
  rng = np.random.default_rng(0)
  rows, failures = [], []
  for name, overrides in VARIANTS.items():
    workdir, out = train_and_export(root, name, overrides)
    tokens = rng.integers(0, 258, (2, LENGTH))
    ours, config = our_logits(workdir, tokens)
    check_config(out, config)
    note = check_tokenizer(out)
    eager = load_hf(out)
    row = {"variant": name, "max logit": np.abs(ours).max(),
           "eager": np.abs(hf_logits(eager, tokens) - ours).max(),
           "sdpa": np.abs(hf_logits(load_hf(out, "sdpa"), tokens) - ours).max(),
           "decode": np.abs(hf_decode_logits(eager, tokens, prefill=5) - ours).max()}
    p_tokens, p_positions, p_segments = packed_row(258, rng)
    p_ours, _ = our_logits(workdir, p_tokens, p_positions, p_segments)
    row["packed"] = np.abs(hf_logits(eager, p_tokens, p_positions) - p_ours).max()
    exact = ["eager", "sdpa", "decode", "packed"]
    if "S" in config.model.pattern:
      w = config.model.window
      for delta in (-1, 1):
        other = load_hf(with_window(out, w + delta, root))
        row[f"w{delta:+d}"] = np.abs(hf_logits(other, tokens) - ours).max()
        if not row[f"w{delta:+d}"] > MISMATCH:
          failures.append(f"{name}: sliding_window={w + delta} matches as well as {w}")
    failures += [f"{name}: {k} differs by {row[k]:.2e} > {TOLERANCE}" for k in exact
                 if not row[k] <= TOLERANCE]
    rows.append(row)
  columns = ["variant", "max logit", "eager", "sdpa", "decode", "packed", "w-1", "w+1"]
  print(f"\nmax abs logit difference, float32, length {LENGTH} (window 8, trained at 64); "
        f"tolerance {TOLERANCE:g}; {note}")
  print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
  for row in rows:
    cells = [row["variant"]] + [f"{row[c]:.2e}" if c in row else "-" for c in columns[1:]]
    print("| " + " | ".join(cells) + " |")
  if not args.keep:
    shutil.rmtree(root)
  if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
  print("OK: every export matches ours within tolerance; w - 1 and w + 1 do not.")


if __name__ == "__main__":
  main()
