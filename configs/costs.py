"""What a config costs, in the words of its docstring, and the rewrite that keeps them in sync.

  python -m configs.costs            # lists the configs/*.py whose docstring is stale
  python -m configs.costs --write    # rewrites those docstrings in place

Every config's docstring ends with a generated `Cost:` paragraph: model FLOPs per token
(flops.flops_per_token, train steps only) × tokens per run (train.steps × data.batch_size ×
data.seq_len). A paper config (configs/<kind>[<window>]_<size>.py) also gets the exact command
that runs it, and the time its FLOPs take on DOCSTRING_TPU at DOCSTRING_MFU. The rest of a
docstring is hand-written and kept. tests/test_configs.py fails when a docstring drifts.
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib
import inspect
import os
import re
import sys
import textwrap

from hybrid_nope.train.flops import PEAK_FLOPS, flops_per_token, si

# An assumption, not a measurement: no TPU run of this code has been timed. Replace it with the
# MFU that `python benchmarks/train_step.py --sizes=120m,350m --seq_lens=8192 --vocab=128256
# --dtype=bfloat16` prints on the TPU, then run `python -m configs.costs --write`.
DOCSTRING_MFU = 0.4
# The slice the docstrings price: a v5p-N slice has N TensorCores, two per chip, and jax sees
# one device per chip (megacore), so v5p-64 is 32 chips of PEAK_FLOPS["TPU v5p"] each.
DOCSTRING_TPU, DOCSTRING_CHIPS, DOCSTRING_PEAK = "v5p-64", 32, PEAK_FLOPS["TPU v5p"]
# configs/<kind>[<window>]_<size>.py: swa256_350m, nopeswa64_120m, nope_350m, gla_120m, ...
PAPER_NAME = re.compile(r"[a-z]+\d*_\d+m")
COMMAND = "  python launch/train.py"
WIDTH = 100


def scientific(value: float) -> str:
  """3.675e19 -> "3.7e19"."""
  mantissa, exponent = f"{value:.1e}".split("e")
  return f"{mantissa}e{int(exponent)}"


def duration(seconds: float) -> str:
  if seconds < 3600:
    return f"~{seconds / 60:.0f} min"
  return f"~{seconds / 3600:.1f} h" if seconds < 36000 else f"~{seconds / 3600:.0f} h"


def command(name: str) -> str:
  """The paper command of configs/NAME.py: a gs:// workdir (a multi-host slice needs one)."""
  head = f"{COMMAND} --config=configs/{name}.py"
  workdir = f"--workdir=gs://BUCKET/{name}"
  data = ("      --config.data.path=/path/to/prolong-data-64K "
          "--config.eval.path=/path/to/textbook_chapters")
  if len(f"{head} {workdir} \\") <= WIDTH:
    return f"{head} {workdir} \\\n{data}"
  return f"{head} \\\n      {workdir} \\\n{data}"


def cost_summary(config, name: str, experiment: str = "") -> str:
  """The `Cost:` paragraph of configs/NAME.py's docstring, for its `config` (that of
  configs/NAME.py:EXPERIMENT where the file takes one)."""
  d = config.data
  per_token = flops_per_token(config.model, d.seq_len)
  tokens = config.train.steps * d.batch_size * d.seq_len
  total = per_token * tokens
  label = f" ({name}.py:{experiment})" if experiment else ""
  text = (f"Cost{label}: {si(per_token, 'FLOP/token')} × {si(tokens, 'tokens', 'kMBT', ' ')} "
          f"({config.train.steps} steps × {d.batch_size} × {d.seq_len}) = {scientific(total)} "
          "FLOPs")
  if PAPER_NAME.fullmatch(name):
    seconds = total / (DOCSTRING_CHIPS * DOCSTRING_PEAK * DOCSTRING_MFU)
    text += (f"; {duration(seconds)} on {DOCSTRING_TPU} ({DOCSTRING_CHIPS} chips, "
             f"{DOCSTRING_PEAK / 1e12:.0f} TFLOP/s each) at an assumed {DOCSTRING_MFU:.0%} MFU")
  return textwrap.fill(text + ".", WIDTH, break_on_hyphens=False)


def generated(module, name: str) -> list[str]:
  """The generated paragraphs of configs/NAME.py's docstring (get_config() with its defaults)."""
  defaults = [p.default for p in inspect.signature(module.get_config).parameters.values()
              if p.default is not p.empty]  # e.g. "swa64", what configs/small.py picks alone
  summary = cost_summary(module.get_config(), name, str(defaults[0]) if defaults else "")
  return [command(name), summary] if PAPER_NAME.fullmatch(name) else [summary]


def is_generated(paragraph: str, name: str) -> bool:
  """A paragraph the rewrite owns: the `Cost` one, and a paper config's command."""
  return (re.match(r"Cost( \([^)]*\))?:", paragraph) is not None
          or PAPER_NAME.fullmatch(name) is not None and paragraph.startswith(COMMAND))


def rewritten(source: str, module, name: str) -> str:
  """`source` of configs/NAME.py with its docstring's generated paragraphs brought up to date:
  they replace the old ones where the first of those stood, else follow the hand-written text."""
  tree = ast.parse(source)
  first = tree.body[0] if tree.body else None
  if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
    raise ValueError(f"configs/{name}.py: expected a module docstring (a one-line summary)")
  lines = source.splitlines(keepends=True)
  literal = "".join(lines[first.lineno - 1:first.end_lineno])
  if not (literal.startswith('"""') and literal.rstrip().endswith('"""')):
    raise ValueError(f'configs/{name}.py: expected the docstring delimited by """ lines')
  paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", literal.rstrip()[3:-3])]
  kept = [p for p in paragraphs if p and not is_generated(p, name)]
  old = [i for i, p in enumerate(paragraphs) if p and is_generated(p, name)]
  at = sum(1 for p in paragraphs[:old[0]] if p) if old else len(kept)
  new = kept[:at] + generated(module, name) + kept[at:]
  docstring = '"""' + "\n\n".join(new) + '\n"""\n'
  return "".join(lines[:first.lineno - 1]) + docstring + "".join(lines[first.end_lineno:])


def config_files(configs_dir: str = "configs") -> list[str]:
  """configs/*.py that define an experiment (not base.py, this tool or private helpers)."""
  return sorted(p for p in glob.glob(os.path.join(configs_dir, "*.py"))
                if not os.path.basename(p).startswith(("_", "base", "costs")))


def stale_configs(configs_dir: str = "configs", write: bool = False) -> list[str]:
  """The config files whose docstring differs from the generated text; rewritten if `write`."""
  root = os.path.dirname(os.path.abspath(configs_dir))
  if root not in sys.path:
    sys.path.insert(0, root)
  out = []
  for path in config_files(configs_dir):
    name = os.path.basename(path)[:-3]
    module = importlib.import_module(f"{os.path.basename(os.path.abspath(configs_dir))}.{name}")
    with open(path, encoding="utf-8") as f:
      source = f.read()
    new = rewritten(source, module, name)
    if new != source:
      out.append(path)
      if write:
        with open(path, "w", encoding="utf-8") as f:
          f.write(new)
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--write", action="store_true", help="rewrite the stale docstrings in place")
  p.add_argument("--configs_dir", default="configs")
  args = p.parse_args(argv)
  if not os.path.isdir(args.configs_dir):
    print(f"costs: --configs_dir={args.configs_dir}: no such directory (run from the repository "
          "root)", file=sys.stderr)
    return 2
  paths = stale_configs(args.configs_dir, write=args.write)
  for path in paths:
    print(f"{'rewrote' if args.write else 'stale'}: {path}")
  return 0 if args.write or not paths else 1


if __name__ == "__main__":
  sys.exit(main())
