"""HTML pieces of the report (`html_report.py`): escaped text, tables, and the subset of
markdown that compare.py writes.

A table wider than the page is split into as few column groups as fit PAGE_WIDTH_PX, of
balanced widths, each repeating the leading key columns (the row's name), so that a sweep table
of 28 columns reads as two tables at a 1280 px window instead of running off the page. Widths
are estimated from the text (CHAR_PX per character; a header wraps at its spaces, so its
longest word counts); the container still scrolls should an estimate fall short.
"""
from __future__ import annotations

import html
import re
from typing import Sequence

CHAR_PX, CELL_PADDING_PX = 7.0, 16  # 12 px system-ui: digits ~6.7 px; padding and borders.
PAGE_WIDTH_PX = 1180  # A 1280 px window less the scroll bar and the body's padding, with room.
CONTINUED = "continued"  # The class of a column group after the first.
KEY_COLUMNS_ATTRIBUTE = "data-key-columns"  # On a continued group: how many columns it repeats.
STYLE = """
th { white-space: normal; vertical-align: bottom; }
table.continued { margin-top: 4px; }
"""

NUMBER = re.compile(r"[+\-−]?(\d|—$)")


def esc(value) -> str:
  return html.escape(str(value))


def missing(what: str) -> str:
  return f'<p class="missing">not recorded: {esc(what)}</p>'


def _td(cell) -> str:
  """Numbers (and the dash of a missing one) right-aligned, words left."""
  kind = ' class="num"' if NUMBER.match(str(cell)) else ""
  return f"<td{kind}>{esc(cell)}</td>"


def column_px(header: str, cells: Sequence) -> float:
  """The estimated width of a column: its widest cell, or its header's longest word."""
  widest = max([len(str(c)) for c in cells] + [len(w) for w in str(header).split()] + [1])
  return widest * CHAR_PX + CELL_PADDING_PX


def _greedy(widths: Sequence[float], capacity: float) -> list[list[int]]:
  """Consecutive groups of column indices, each filled up to `capacity` (at least one each)."""
  groups, current, used = [], [], 0.0
  for i, width in enumerate(widths):
    if current and used + width > capacity:
      groups.append(current)
      current, used = [], 0.0
    current.append(i)
    used += width
  return groups + [current] if current else groups


def column_groups(header: Sequence[str], rows: Sequence[Sequence], key_columns: int = 1,
                  width_px: float = PAGE_WIDTH_PX) -> list[list[int]]:
  """Column indices of each group: the `key_columns` first in every group, then the others in
  order, in as few groups as fit `width_px` (a column too wide alone gets a group of its own),
  the widest group as narrow as that number of groups allows."""
  widths = [column_px(h, [row[i] for row in rows]) for i, h in enumerate(header)]
  keys, rest = list(range(key_columns)), widths[key_columns:]
  room = width_px - sum(widths[:key_columns])
  count = len(_greedy(rest, room))
  low, high = max(rest, default=0.0), max(room, max(rest, default=0.0))
  for _ in range(40):  # Bisect the capacity down to the narrowest that needs no more groups.
    middle = (low + high) / 2
    low, high = (low, middle) if len(_greedy(rest, middle)) <= count else (middle, high)
  return [keys + [key_columns + i for i in group] for group in _greedy(rest, high)]


def table(header: Sequence[str], rows: Sequence[Sequence],
          row_classes: Sequence[str] | None = None, key_columns: int = 1) -> str:
  """An HTML table, split into `column_groups` when wider than the page."""
  kinds = row_classes or [""] * len(rows)
  groups = (column_groups(header, rows, key_columns) if len(header) > key_columns
            else [list(range(len(header)))])
  parts = []
  for n, columns in enumerate(groups):
    head = "".join(f"<th>{esc(header[i])}</th>" for i in columns)
    body = "".join(f'<tr class="{kind}">' + "".join(_td(row[i]) for i in columns) + "</tr>"
                   for row, kind in zip(rows, kinds))
    attribute = (f' class="{CONTINUED}" {KEY_COLUMNS_ATTRIBUTE}="{key_columns}"' if n else "")
    parts.append(f"<table{attribute}><tr>{head}</tr>{body}</table>")
  return f'<div class="scroll">{"".join(parts)}</div>'


def inline(text: str) -> str:
  """Markdown's `code` spans as <code>, the rest escaped."""
  return re.sub(r"`([^`]*)`", r"<code>\1</code>", esc(text))


def markdown_html(markdown: str) -> str:
  """The subset of markdown compare.markdown writes: headings, bullets, pipe tables."""
  out, rows, items = [], [], []
  for line in markdown.splitlines() + [""]:
    if line.startswith("|"):
      rows.append([c.strip() for c in line.strip().strip("|").split("|")])
      continue
    if line.startswith("- "):
      items.append(f"<li>{inline(line[2:])}</li>")
      continue
    if rows:  # The second line is the header's |---| rule.
      out.append(table(rows[0], rows[2:]))
      rows = []
    if items:
      out.append(f"<ul>{''.join(items)}</ul>")
      items = []
    if line.startswith("#"):
      level = len(line) - len(line.lstrip("#"))
      out.append(f"<h{level + 1}>{inline(line.lstrip('# '))}</h{level + 1}>")
    elif line.strip():
      out.append(f"<p>{inline(line)}</p>")
  return "\n".join(out)
