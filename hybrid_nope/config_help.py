"""What each config key means, read from the comments beside it in configs/base.py.

configs/base.py is the one home of every default and of its meaning: the comment on a key's line
(and the comment lines below it, indented past the key), or the comment lines just above a key at
its own indentation. `launch/train.py --help_config` prints them; tests/test_config_help.py
fails when a key has none.
"""
from __future__ import annotations

import ast
import io
import tokenize

from ml_collections import ConfigDict


def _comments(source: str) -> tuple[dict[int, tuple[int, str]], set[int]]:
  """({row: (column, text)} of every comment, the rows that hold code)."""
  comments, code_rows = {}, set()
  skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
          tokenize.COMMENT}
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    elif tok.type not in skip:
      code_rows.update(range(tok.start[0], tok.end[0] + 1))
  return comments, code_rows


def _dotted(node: ast.AST) -> str | None:
  """"data.seed" for the target `c.data.seed`; None for anything else."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return ".".join(reversed(parts)) if isinstance(node, ast.Name) and parts else None


def _dict_call(node: ast.AST) -> ast.Call | None:
  """The `dict(...)` in `dict(...)` or `ConfigDict(dict(...))`."""
  if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
    return node
  if isinstance(node, ast.Call) and node.args:
    return _dict_call(node.args[0])
  return None


def _key_sites(tree: ast.Module, function: str) -> list[tuple[str, int, int, int]]:
  """(key, first row, last row, column) of every key `function` sets, in source order."""
  body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
  sites = []
  for stmt in body.body:
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
      continue
    name = _dotted(stmt.targets[0])
    if name is None:
      continue
    call = _dict_call(stmt.value)
    if call is not None:
      sites += [(f"{name}.{kw.arg}", kw.lineno, kw.value.end_lineno, kw.col_offset)
                for kw in call.keywords]
    elif "." in name:
      sites.append((name, stmt.lineno, stmt.end_lineno, stmt.col_offset))
  return sites


def key_help(source: str, function: str = "get_config") -> dict[str, str]:
  """{dotted key: its comment as one line} for every key `function` in `source` sets ("" where
  a key has no comment)."""
  comments, code_rows = _comments(source)
  sites = _key_sites(ast.parse(source), function)
  claimed, parts = set(), {}
  for key, first, last, column in sites:
    rows = [r for r in range(first, last + 1) if r in comments]
    row = last
    # Comment lines below the key, indented past it, continue its comment.
    while row + 1 in comments and row + 1 not in code_rows and comments[row + 1][0] > column:
      row += 1
      rows.append(row)
    claimed.update(rows)
    parts[key] = rows
  for key, first, _, column in sites:
    above, row = [], first - 1
    while (row in comments and row not in code_rows and row not in claimed
           and comments[row][0] == column):
      above.insert(0, row)
      row -= 1
    parts[key] = above + parts[key]
  return {key: " ".join(comments[r][1] for r in rows) for key, rows in parts.items()}


def base_help() -> dict[str, str]:
  """key_help of configs/base.py (its get_config)."""
  from configs import base  # pylint: disable=g-import-not-at-top  (configs/ is on sys.path)
  with open(base.__file__, encoding="utf-8") as f:
    return key_help(f.read())


def leaves(config: ConfigDict, prefix: str = "") -> dict[str, object]:
  """{dotted key: value} of every leaf of `config`."""
  out = {}
  for name, value in config.items():
    if isinstance(value, ConfigDict):
      out.update(leaves(value, f"{prefix}{name}."))
    else:
      out[f"{prefix}{name}"] = value
  return out


def help_text(config: ConfigDict, meanings: dict[str, str] | None = None) -> str:
  """Every key of `config` with its value and meaning, a line each, grouped by section."""
  meanings = base_help() if meanings is None else meanings
  lines, section = [], None
  for key, value in leaves(config).items():
    head = key.split(".")[0]
    if head != section:
      lines.append(f"\n[{head}]" if lines else f"[{head}]")
      section = head
    meaning = meanings.get(key) or "(not in configs/base.py: set by this config)"
    lines.append(f"  {key} = {value!r}\n      {meaning}")
  return "\n".join(lines)
