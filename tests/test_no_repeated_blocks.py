"""No block of BLOCK or more significant lines is repeated inside hybrid_nope/ (issue 15).

A line is significant after stripping its indentation and comment; these lines are left out,
so that a block is real copy-paste and not what every module must say:
  - blank and comment-only lines, and docstrings (module, class and function ones);
  - import statements, whole (`from x import (a,\\n b)` included): every module starts alike;
  - lines of only brackets and separators (`)`, `]:`, `},`), which close any call alike.
Everything else counts verbatim, so two calls match only where their arguments are the same.
"""
from __future__ import annotations

import ast
import collections
import glob
import io
import os
import re
import tokenize

from tests.helpers import REPO

BLOCK = 6
PUNCTUATION = re.compile(r"[()\[\]{},:;]*")


def ignored_lines(tree: ast.AST) -> set[int]:
  """Line numbers of docstrings and import statements."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      out.update(range(node.lineno, node.end_lineno + 1))
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        out.update(range(first.lineno, first.end_lineno + 1))
  return out


def significant_lines(source: str) -> list[tuple[int, str]]:
  """(line number, normalised text) of the lines that count, in order."""
  lines = source.splitlines()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      row, col = tok.start
      lines[row - 1] = lines[row - 1][:col]
  skip = ignored_lines(ast.parse(source))
  out = []
  for number, line in enumerate(lines, 1):
    text = line.strip()
    if text and number not in skip and not PUNCTUATION.fullmatch(text):
      out.append((number, text))
  return out


def repeated_blocks(files: dict[str, str], block: int = BLOCK) -> list[str]:
  """One line per maximal repeated run of >= `block` significant lines: the places and its
  first line."""
  lines = {path: significant_lines(source) for path, source in files.items()}
  seen = collections.defaultdict(list)   # window text -> [(path, index of its first line)]
  for path, sig in lines.items():
    for i in range(len(sig) - block + 1):
      seen["\n".join(text for _, text in sig[i:i + block])].append((path, i))
  pairs = set()                           # (path a, i, path b, j): windows a[i:] == b[j:]
  for places in seen.values():
    for x in range(len(places)):
      for y in range(x + 1, len(places)):
        (a, i), (b, j) = places[x], places[y]
        if a != b or abs(i - j) >= block:  # a run overlapping itself is not a copy
          pairs.add((a, i, b, j))
  out = []
  for a, i, b, j in sorted(pairs):
    if (a, i - 1, b, j - 1) in pairs:     # inside a run already reported from its start
      continue
    n = block
    while (a, i + n - block + 1, b, j + n - block + 1) in pairs:
      n += 1
    sig_a, sig_b = lines[a], lines[b]
    out.append(f"{a}:{sig_a[i][0]}-{sig_a[i + n - 1][0]} == {b}:{sig_b[j][0]}-"
               f"{sig_b[j + n - 1][0]} ({n} lines): {sig_a[i][1]}")
  return out


def package_sources() -> dict[str, str]:
  paths = sorted(glob.glob(os.path.join(REPO, "hybrid_nope", "**", "*.py"), recursive=True))
  out = {}
  for path in paths:
    with open(path, encoding="utf-8") as f:
      out[os.path.relpath(path, REPO)] = f.read()
  return out


def test_no_block_of_six_significant_lines_is_repeated_in_the_package():
  blocks = repeated_blocks(package_sources())
  assert not blocks, (f"{len(blocks)} blocks of >= {BLOCK} significant lines appear twice "
                      "in hybrid_nope/ (move them into one function):\n" + "\n".join(blocks))


def test_the_scan_finds_a_copied_block_and_ignores_boilerplate():
  body = "".join(f"  x{k} = f(x{k - 1}, {k})\n" for k in range(1, 8))
  imports = "from m import (\n    a,\n    b,\n)\n" + "".join(f"import m{k}\n" for k in range(6))
  docstring = '"""' + "Doc.\n" * 7 + '"""\n'
  one = f"{docstring}{imports}\n\ndef a(x0):\n  {docstring}{body}  return (\n      x7\n  )\n"
  two = f"{imports}\ndef b(x0):\n  # a comment\n{body}  return x7\n"
  blocks = repeated_blocks({"one.py": one, "two.py": two})
  assert blocks == ["one.py:30-36 == two.py:14-20 (7 lines): x1 = f(x0, 1)"], blocks
  boilerplate = (docstring + imports + "# a comment\n" * 7
                 + "x = [\n" + "[\n" * 6 + "],\n" * 6 + "]\n")
  assert not repeated_blocks({"one.py": boilerplate, "two.py": boilerplate})
  changed = body.replace("x3, 4)", "x3, 5)")   # a similar block, with one argument changed
  assert not repeated_blocks({"one.py": f"def a(x0):\n{changed}", "two.py": f"def b(x0):\n{body}"})
