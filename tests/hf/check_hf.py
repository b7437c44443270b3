"""The export against transformers itself: `make check-hf` (needs torch + transformers, .venv-hf).

Trains tiny demo-shaped runs with launch/train.py, exports each with launch/export_hf.py, loads
the export with transformers' AutoModelForCausalLM in float32 (SmolLM3ForCausalLM for S/G
patterns; with L or D layers the export's own modeling_hybrid_nope.py, trust_remote_code) and
compares its logits with ours on sequences longer than the window (and than training):

  forward    2 rows of random tokens, eager and sdpa attention
  packed     4 documents in one row (one of 2 tokens, under D's convolution width): our
             positions + segment_ids vs HF position_ids that restart
  decode     HF with its cache (sliding layers keep w - 1 keys; L and D layers their recurrent
             state, D the last inputs of its convolutions), one token at a time
  generate   HF's greedy model.generate on two left-padded prompts of different lengths vs our
             own greedy generation (hybrid_nope.model.decode.generate): the same tokens
  window±1   the same export with sliding_window w - 1 and w + 1: must NOT match
  recurrence the export's chunked L and D recurrence (modeling_hybrid_nope.chunked_recurrence)
             against a float64 token-by-token loop of the published formulas, with strong
             decays, document starts, padding, a carried state and chunks that do not divide T
  import     the other way: tiny random SmolLM3ForCausalLM models made in transformers
             (IMPORT_VARIANTS: NoPE layers, GQA, sliding windows, SmolLM3-3B's layout, bfloat16),
             save_pretrained, read by launch/import_hf.py into a workdir; our logits from it
             against HF's (eager and sdpa)

Prints one table; exits 1 if an exact comparison exceeds TOLERANCE, a generation differs or a
w ± 1 one matches.

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

from hybrid_nope.run.reader import open_readonly  # noqa: E402
from hybrid_nope.model import checkpointed  # noqa: E402
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer  # noqa: E402
from hybrid_nope.model import decode, layer_kinds  # noqa: E402

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
    "gla (LG) gqa tied": {"model.pattern": "LG"},
    "gated delta (DG) untied": {"model.pattern": "DG", "model.tie_embeddings": False},
    "kda (DDDG) channel gate": {"model.pattern": "DDDG", "model.delta_gate": "channel"},
}
TEXTS = ["def f(x):\n    return x + 1\n", "héllo wörld ✓ 😀", "  two  spaces\tand a tab"]
PROMPTS = ["def main(", "import os\nimport sys\n\n"]  # Different lengths: left padding in HF.
NEW_TOKENS = 24
PACKED = (50, 2, 68, 40)  # Document lengths of the packed row.
# transformers-made models to import (SmolLM3Config arguments beside IMPORT_SHAPE).
IMPORT_SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
                    bos_token_id=None, eos_token_id=None)
IMPORT_VARIANTS = {
    "swa rope / global nope, gqa, tied": dict(
        use_sliding_window=True, sliding_window=8, no_rope_layers=[1, 0, 1, 0],
        layer_types=["sliding_attention", "full_attention"] * 2),
    "SmolLM3-3B layout (nope every 4th), untied": dict(
        no_rope_layer_interval=4, max_position_embeddings=512, rope_theta=5e6,
        tie_word_embeddings=False),
    "the same in bfloat16": dict(
        no_rope_layer_interval=4, max_position_embeddings=512, rope_theta=5e6, dtype="bf16"),
    "derived types (nope slides), mqa, head_dim 24": dict(
        use_sliding_window=True, sliding_window=6, num_key_value_heads=1, head_dim=24),
}


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


def load_ours(workdir):
  run = open_readonly(workdir)
  _, model_def, params = checkpointed.restore_params(run)
  return model_def.bind(params), run.config


def our_logits(model, tokens_BT, positions_BT=None, segment_ids_BT=None):
  kwargs = {}
  if positions_BT is not None:
    kwargs = dict(positions_BT=jnp.asarray(positions_BT),
                  segment_ids_BT=jnp.asarray(segment_ids_BT))
  return np.asarray(model(jnp.asarray(tokens_BT), **kwargs))


def our_generation(model, prompts, eos_id):
  """Each prompt's greedy new tokens up to eos_id included, by our cached decoder."""
  return decode.generate(model, prompts, NEW_TOKENS, eos_id=eos_id)


def load_hf(out, attn="eager"):
  """The export as AutoModelForCausalLM loads it: the class config.json names (SmolLM3's own, or
  the export's modeling_hybrid_nope.py through auto_map)."""
  model = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32, attn_implementation=attn, trust_remote_code=True).eval()
  assert [type(model).__name__] == model.config.architectures, type(model)
  return model


@torch.no_grad()
def hf_generation(model, prompts, eos_id):
  """Greedy model.generate on the prompts as one left-padded batch; each row's new tokens up to
  its first eos_id, included."""
  width = max(len(p) for p in prompts)
  ids = torch.tensor([[eos_id] * (width - len(p)) + list(p) for p in prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
  out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                       eos_token_id=eos_id, pad_token_id=eos_id)[:, width:].numpy()
  rows = []
  for row in out:
    ends = np.flatnonzero(row == eos_id)
    rows.append(row[:ends[0] + 1] if len(ends) else row)
  return rows


def compare_generation(model, hf_model, failures, name):
  prompts = [ByteTokenizer().encode(text, add_eos=False) for text in PROMPTS]
  eos_id = ByteTokenizer.EOS_ID
  ours = our_generation(model, prompts, eos_id)
  theirs = hf_generation(hf_model, prompts, eos_id)
  same = sum(int(np.array_equal(a, b)) for a, b in zip(ours, theirs))
  if same != len(prompts):
    failures.append(f"{name}: HF generate gave {[t.tolist() for t in theirs]}, decode.generate "
                    f"{[t.tolist() for t in ours]}")
  return f"{same}/{len(prompts)} same ({sum(len(t) for t in ours)} tokens)"


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


def packed_row(vocab, rng, lengths=PACKED):
  tokens = rng.integers(0, vocab, (1, sum(lengths)))
  positions = np.concatenate([np.arange(n) for n in lengths])[None]
  segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])[None]
  return tokens, positions, segments


def check_config(out, config):
  hf_config = transformers.AutoConfig.from_pretrained(out, trust_remote_code=True)
  m = config.model
  kinds = layer_kinds(m.pattern, m.num_layers)
  types = {"S": "sliding_attention", "G": "full_attention", "L": "linear_attention",
           "D": "linear_attention"}
  assert hf_config.layer_types == [types[k] for k in kinds], hf_config.layer_types
  assert hf_config.no_rope_layers == [
      int(k in "SG" and (m.swa_pos if k == "S" else m.global_pos) == "rope") for k in kinds
  ], hf_config.no_rope_layers
  recurrent = bool(set(kinds) & set("LD"))
  assert type(hf_config).__name__ == ("HybridNopeConfig" if recurrent else "SmolLM3Config")
  if recurrent:
    assert hf_config.layer_kinds == kinds, hf_config.layer_kinds
  assert hf_config.rope_parameters["rope_theta"] == m.rope_theta
  assert hf_config.head_dim == m.head_dim and hf_config.tie_word_embeddings == m.tie_embeddings


def check_tokenizer(out):
  # AutoTokenizer reads config.json first: an L/D export's auto_map needs the trust too.
  tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
  ours = ByteTokenizer()
  for text in TEXTS:
    ids = tok(text)["input_ids"]
    assert ids == ours.encode(text, add_eos=False).tolist(), (text, ids)
    assert tok.decode(ids, skip_special_tokens=True) == text
  return "tokenizer matches"


def token_loop(q, k, v, g, beta, state):
  """The recurrence one token at a time in float64, from its formulas (L: beta None): S_t =
  diag(α_t) S_{t−1} + k_t v_tᵀ; D: S' = S_{t−1} diag(α_t), S_t = S' + β_t (v_t − S' k_t) k_tᵀ,
  both o_t = S_t q_t; states [key, value]."""
  q, k, v, g, state = (x.double() for x in (q, k, v, g, state))
  outs = []
  for t in range(q.shape[1]):
    state = state * g[:, t].exp()[..., :, None]
    write = v[:, t] if beta is None else beta[:, t].double()[..., None] * (
        v[:, t] - torch.einsum("bkd,bkde->bke", k[:, t], state))
    state = state + k[:, t, :, :, None] * write[..., None, :]
    outs.append(torch.einsum("bkgd,bkde->bkge", q[:, t], state))
  return torch.stack(outs, 1), state


def check_recurrence(failures):
  """chunked_recurrence against token_loop; returns the table line."""
  from hybrid_nope.export.modeling_hybrid_nope import LOG_ZERO, chunked_recurrence, l2norm
  gen = torch.Generator().manual_seed(0)
  rand = lambda *shape: torch.rand(*shape, generator=gen)
  randn = lambda *shape: torch.randn(*shape, generator=gen)
  B, K, G, H, worst, cases = 2, 2, 2, 16, 0.0, 0
  for mixer, X in (("L", H), ("D", 1), ("D", H)):
    for T, chunk in ((75, 32), (40, 8), (33, 16), (1, 32)):
      q, k, v = randn(B, T, K, G, H), randn(B, T, K, H), randn(B, T, K, H)
      if mixer == "D":
        q, k = l2norm(q), l2norm(k)
      # One gate in five near e^-30 (strong decay), documents starting at random, 10% padding
      # (as recur folds them: the start's gate LOG_ZERO; padding g = 0, k = v = β = 0).
      g = -rand(B, T, K, X) * torch.where(rand(B, T, K, X) < 0.2, 30.0, 0.5)
      g = torch.where((rand(B, T) < 0.08)[..., None, None], LOG_ZERO, g)
      valid = (rand(B, T) > 0.1)[..., None, None]
      g, k, v = torch.where(valid, g, 0.0), k * valid, v * valid
      beta = rand(B, T, K) * valid[..., 0] if mixer == "D" else None
      state = randn(B, K, H, H)
      got = chunked_recurrence(q, k, v, g, beta, state, chunk=chunk)
      want = token_loop(q, k, v, g, beta, state)
      for a, b in zip(got, want):
        worst = max(worst, ((a.double() - b).abs().max() / b.abs().max()).item())
      cases += 1
  if not worst <= 1e-5:
    failures.append(f"chunked recurrence: {worst:.2e} relative to the float64 token loop")
  return (f"chunked recurrence vs float64 token loop ({cases} cases: L, D scalar and channel "
          f"gates): max relative error {worst:.2e}")


def check_import(root, rng, failures):
  """IMPORT_VARIANTS made in transformers, imported with launch/import_hf.py; table lines."""
  lines = ["| imported from transformers | pattern | max logit | eager | sdpa |",
           "|---|---|---|---|---|"]
  for name, kwargs in IMPORT_VARIANTS.items():
    slug = "".join(c if c.isalnum() else "_" for c in name)
    hf_dir, workdir = os.path.join(root, "made", slug), os.path.join(root, "imported", slug)
    kwargs = dict(kwargs)
    dtype = torch.bfloat16 if kwargs.pop("dtype", None) == "bf16" else torch.float32
    torch.manual_seed(len(lines))
    config = transformers.SmolLM3Config(**{**IMPORT_SHAPE, **kwargs})
    transformers.SmolLM3ForCausalLM(config).to(dtype).save_pretrained(hf_dir)
    run("import_hf.py", f"--hf={hf_dir}", f"--out={workdir}")
    model, ours_config = load_ours(workdir)
    tokens = rng.integers(0, IMPORT_SHAPE["vocab_size"], (2, LENGTH))
    ours = our_logits(model, tokens)
    errors = [np.abs(hf_logits(load_hf(hf_dir, attn), tokens) - ours).max()
              for attn in ("eager", "sdpa")]
    failures += [f"import {name}: {attn} differs by {e:.2e} > {TOLERANCE}"
                 for attn, e in zip(("eager", "sdpa"), errors) if not e <= TOLERANCE]
    lines.append(f"| {name} | {ours_config.model.pattern} (window {ours_config.model.window}) | "
                 f"{np.abs(ours).max():.2e} | {errors[0]:.2e} | {errors[1]:.2e} |")
  return lines


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
  recurrence = check_recurrence(failures)
  for name, overrides in VARIANTS.items():
    workdir, out = train_and_export(root, name, overrides)
    tokens = rng.integers(0, 258, (2, LENGTH))
    model, config = load_ours(workdir)
    ours = our_logits(model, tokens)
    check_config(out, config)
    note = check_tokenizer(out)
    eager = load_hf(out)
    row = {"variant": name, "max logit": np.abs(ours).max(),
           "eager": np.abs(hf_logits(eager, tokens) - ours).max(),
           "sdpa": np.abs(hf_logits(load_hf(out, "sdpa"), tokens) - ours).max(),
           "decode": np.abs(hf_decode_logits(eager, tokens, prefill=5) - ours).max()}
    p_tokens, p_positions, p_segments = packed_row(258, rng)
    p_ours = our_logits(model, p_tokens, p_positions, p_segments)
    row["packed"] = np.abs(hf_logits(eager, p_tokens, p_positions) - p_ours).max()
    row["generate"] = compare_generation(model, eager, failures, name)
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
  columns = ["variant", "max logit", "eager", "sdpa", "decode", "packed", "w-1", "w+1",
             "generate"]
  print(f"\nmax abs logit difference, float32, length {LENGTH} (window 8, trained at 64); "
        f"tolerance {TOLERANCE:g}; {note}")
  print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
  for row in rows:
    cells = [row["variant"]] + [row[c] if isinstance(row.get(c), str) else
                                f"{row[c]:.2e}" if c in row else "-" for c in columns[1:]]
    print("| " + " | ".join(cells) + " |")
  print(recurrence)
  print("\n" + "\n".join(check_import(root, rng, failures)))
  finish(root, args.keep, failures, "OK: every export matches ours within tolerance and "
         "generates our tokens; w - 1 and w + 1 do not match; every import matches HF.")


def finish(root: str, keep: bool, failures: list[str], ok: str) -> None:
  """Removes the scratch runs (unless kept), then exits 1 naming the failures, or prints `ok`."""
  if not keep:
    shutil.rmtree(root)
  if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
  print(ok)


if __name__ == "__main__":
  main()
