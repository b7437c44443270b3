"""lm-evaluation-harness on an export against launch/score.py on the same files: `make check-lm-eval`.

Trains two tiny demo-shaped runs as tests/hf/check_hf.py does, the demo's SG hybrid (exported as
SmolLM3) and an LDG one (gated linear attention and the gated delta rule with a per-channel
gate: the export's own modeling_hybrid_nope.py, loaded with trust_remote_code=True), or takes
--workdir=DIR (a run on the byte tokenizer); exports each with launch/export_hf.py, writes
held-out stdlib files (the run's eval split) as .txt documents, then at 1x, 2x and 4x the
training length T scores them

  lm-eval    `lm_eval run --model hf` with the repo's local task eval/lm_eval_tasks/rolling_text
             (loglikelihood_rolling), max_length = L, exactly as docs/evaluation.md says
  score.py   `launch/score.py --seq_len=L` on the same files

and prints bits per byte from both. The two cut a document the same way (docs/evaluation.md,
"lm-eval's windows and score.py's rows"): each document is cut here to a multiple of 4T bytes,
so that lm-eval's last window is full like the others and both score the same targets from the
same contexts. Exits 1 if they differ by more than TOLERANCE, or if the control (lm-eval
without add_bos_token=False, which scores each document's BOS as a target) does not differ.

  .venv-hf/bin/python tests/hf/check_lm_eval.py [--workdir=DIR] [--keep=DIR]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_hf  # noqa: E402  (its tiny run, its subprocess runner; sets up sys.path and JAX)

from hybrid_nope.run import checkpoints  # noqa: E402
from hybrid_nope.data.sources import stdlib_corpus  # noqa: E402

REPO = check_hf.REPO
TASKS = os.path.join(REPO, "eval", "lm_eval_tasks")
MULTIPLES = (1, 2, 4)
NUM_DOCS = 8
# Float32 on both sides: per-token log-probs agree to ~1e-6 (check_hf's logits to 3e-6), so the
# bits per byte of 16k tokens agree to ~1e-6 relative or better (measured: 2e-8). One token per
# document scored wrongly (a BOS target, windows shifted by one) moved them by 1.4e-4 on this
# run and 7e-4 on check_hf's 12-step one. 1e-5 lies between; the control must exceed it.
TOLERANCE = 1e-5
STEPS = 60  # enough that the loss falls below uniform and context matters (12 barely trains)
RUNS = {"tiny demo": {}, "LDG, channel gate": {"model.pattern": "LDG", "model.num_layers": 3,
                                               "model.delta_gate": "channel"}}


def documents(config, root, num_bytes):
  """The first NUM_DOCS held-out stdlib files with `num_bytes` bytes, cut to that (a file whose
  cut would split a UTF-8 character is passed over), one .txt each; returns their paths."""
  os.makedirs(os.path.join(root, "docs"), exist_ok=True)
  paths = []
  for name, data in stdlib_corpus.documents("eval", config.data.eval_fraction):
    if len(paths) == NUM_DOCS:
      break
    try:
      data[:num_bytes].decode("utf-8")
    except UnicodeDecodeError:
      continue
    if len(data) >= num_bytes:
      paths.append(os.path.join(root, "docs", f"{len(paths):02d}_{os.path.basename(name)}.txt"))
      with open(paths[-1], "wb") as f:
        f.write(data[:num_bytes])
  if len(paths) < NUM_DOCS:
    sys.exit(f"only {len(paths)} held-out stdlib files have {num_bytes} bytes; need {NUM_DOCS}")
  return paths


def score_py(workdir, files, seq_len, root):
  out = os.path.join(root, f"score_{os.path.basename(workdir)}_{seq_len}.json")
  check_hf.run("score.py", f"--workdir={workdir}", f"--seq_len={seq_len}", f"--out={out}", *files)
  with open(out) as f:
    return json.load(f)["total"]


def lm_eval(export, files, max_length, root, add_bos_token=False):
  """(bits per byte, byte perplexity, the command) from `lm_eval run` as docs/evaluation.md
  gives it."""
  model_args = f"pretrained={export},dtype=float32,max_length={max_length}"
  if add_bos_token is not None:
    model_args += f",add_bos_token={add_bos_token}"
  with open(os.path.join(export, "config.json")) as f:
    if "auto_map" in json.load(f):  # L or D layers: the export's own modeling code.
      model_args += ",trust_remote_code=True"
  out = os.path.join(root, "lm_eval", os.path.basename(export), f"{max_length}_{add_bos_token}")
  command = [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", model_args,
             "--include_path", TASKS, "--tasks", "rolling_text",
             "--metadata", json.dumps({"files": files}), "--batch_size", "8", "--device", "cpu",
             "--output_path", out]
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
             TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=os.path.join(root, "datasets"))
  proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
  results = glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True)
  if proc.returncode or len(results) != 1:
    sys.exit(f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
  with open(results[0]) as f:
    task = json.load(f)["results"]["rolling_text"]
  return task["bits_per_byte,none"], task["byte_perplexity,none"], " ".join(command)


def check_run(name, workdir, export, root, failures, control):
  """Scores the run at every multiple with both tools; prints its table; `control`: also the
  BOS control at 1x."""
  config = checkpoints.load_config(workdir)
  if config.data.source != "stdlib":
    sys.exit(f"{workdir}: data.source={config.data.source}; this check compares on byte-"
             "tokenised text (data.source=stdlib). docs/evaluation.md shows the commands for "
             "other runs.")
  seq_len = config.data.seq_len
  longest = max(MULTIPLES) * seq_len
  files = documents(config, root, num_bytes=max(2048, 2 * longest) // longest * longest)
  rows = []
  for multiple in MULTIPLES:
    length = multiple * seq_len
    ours = score_py(workdir, files, length, root)
    bpb, byte_ppl, command = lm_eval(export, files, length, root)
    if multiple == 1:
      print(f"{name}: lm-eval at 1x: {command}")
    rel = abs(bpb - ours["bits_per_byte"]) / ours["bits_per_byte"]
    rows.append((f"{length} ({multiple}x)", bpb, ours["bits_per_byte"], rel, byte_ppl,
                 ours["tokens"], ours["bytes"]))
    if not rel <= TOLERANCE:
      failures.append(f"{name}, max_length {length}: lm-eval {bpb:.6f} vs score.py "
                      f"{ours['bits_per_byte']:.6f} bits/byte, relative {rel:.1e} > {TOLERANCE:g}")
  print(f"\n{name} ({config.model.pattern}): {NUM_DOCS} held-out stdlib files, "
        f"{rows[0][6] // NUM_DOCS} bytes each; trained at {seq_len}; float32; tolerance "
        f"{TOLERANCE:g} relative")
  print("| max_length = seq_len | lm-eval bits/byte | score.py bits/byte | relative difference |"
        " lm-eval byte perplexity | score.py 2^(bits/byte) | targets | bytes |\n|"
        + "---|" * 8)
  for length, bpb, ours, rel, byte_ppl, tokens, num_bytes in rows:
    print(f"| {length} | {bpb:.6f} | {ours:.6f} | {rel:.1e} | {byte_ppl:.6f} | {2 ** ours:.6f} | "
          f"{tokens} | {num_bytes} |")
  if control:
    bos, _, _ = lm_eval(export, files, seq_len, root, add_bos_token=None)
    bos_rel = abs(bos - rows[0][2]) / rows[0][2]
    print(f"| control: {seq_len}, add_bos_token unset | {bos:.6f} | {rows[0][2]:.6f} | "
          f"{bos_rel:.1e} (must exceed {TOLERANCE:g}) | | | | |")
    if not bos_rel > TOLERANCE:
      failures.append(f"{name}: control (BOS scored as a target) differs by only {bos_rel:.1e}: "
                      "the tolerance would not see a one-token error")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", default=None,
                      help="Use this run (byte tokenizer) instead of training the tiny ones.")
  parser.add_argument("--keep", default=None, help="Keep the runs, exports and outputs here.")
  args = parser.parse_args()
  root = args.keep or tempfile.mkdtemp(prefix="check_lm_eval_")
  os.makedirs(root, exist_ok=True)
  print(f"runs in {root}")
  failures = []
  if args.workdir:
    export = os.path.join(root, "hf")
    print(check_hf.run("export_hf.py", f"--workdir={args.workdir}",
                       f"--out={export}").splitlines()[0])
    check_run(args.workdir, args.workdir, export, root, failures, control=True)
  else:
    every = {k: STEPS for k in ("train.steps", "checkpoint.every_steps", "eval.every_steps",
                                "metrics.every_steps")}
    for i, (name, overrides) in enumerate(RUNS.items()):
      workdir, export = check_hf.train_and_export(root, name, {**every, **overrides})
      check_run(name, workdir, export, root, failures, control=i == 0)
  check_hf.finish(root, args.keep, failures, "OK: lm-eval's rolling loglikelihood equals "
                  "score.py's at every length; the BOS control does not.")


if __name__ == "__main__":
  main()
