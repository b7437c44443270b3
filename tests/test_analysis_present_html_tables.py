"""The report's tables: escaped, numbers right-aligned, split into column groups that fit the
page, and the markdown subset compare.py writes."""
import html.parser

import pytest

from hybrid_nope.analysis.present import html_tables


class Tables(html.parser.HTMLParser):
  """Each <table> as (class, rows of cell texts)."""

  def __init__(self, text):
    super().__init__()
    self.tables, self._cell = [], None
    self.feed(text)

  def handle_starttag(self, tag, attrs):
    if tag == "table":
      self.tables.append((dict(attrs).get("class"), []))
    elif tag == "tr":
      self.tables[-1][1].append([])
    elif tag in ("td", "th"):
      self._cell = ""

  def handle_endtag(self, tag):
    if tag in ("td", "th"):
      self.tables[-1][1][-1].append(self._cell)
      self._cell = None

  def handle_data(self, data):
    if self._cell is not None:
      self._cell += data


def _sweep_table(columns=28, rows=4):
  header = ["run"] + [f"statistic number {i}" for i in range(1, columns)]
  body = [[f"swa{2 ** (r + 4)} (5 seeds)"] + [f"+0.{r}{i:03d} ± 0.0042" for i in range(1, columns)]
          for r in range(rows)]
  return header, body


def test_a_wide_table_splits_into_groups_that_fit_and_keep_every_cell_once():
  header, rows = _sweep_table()
  parsed = Tables(html_tables.table(header, rows)).tables
  assert len(parsed) > 1
  assert [kind for kind, _ in parsed] == [None] + [html_tables.CONTINUED] * (len(parsed) - 1)
  joined = [list(r) for r in parsed[0][1]]
  for _, part in parsed:
    assert [row[0] for row in part] == ["run"] + [row[0] for row in rows]  # Names repeated.
    width = sum(html_tables.column_px(column[0], column[1:]) for column in zip(*part))
    assert width <= html_tables.PAGE_WIDTH_PX
  for _, part in parsed[1:]:
    for row, more in zip(joined, part):
      row.extend(more[1:])
  assert joined == [header] + rows  # Every column once, in order.


def test_groups_are_as_few_as_fit_and_balanced_and_repeat_the_key_columns():
  header, rows = _sweep_table(columns=30)
  rows = [[f"layer {r}", "global", "pre_mixer_norm"] + row[3:] for r, row in enumerate(rows)]
  widths = [html_tables.column_px(h, [row[i] for row in rows]) for i, h in enumerate(header)]
  groups = html_tables.column_groups(header, rows, key_columns=3)
  keys = sum(widths[:3])
  assert all(g[:3] == [0, 1, 2] for g in groups)
  assert sorted(i for g in groups for i in g[3:]) == list(range(3, len(header)))
  # Fewer groups cannot fit: together the columns are wider than that many pages.
  assert sum(widths[3:]) > (len(groups) - 1) * (html_tables.PAGE_WIDTH_PX - keys)
  used = [sum(widths[i] for i in g) for g in groups]
  assert max(used) <= html_tables.PAGE_WIDTH_PX
  assert max(used) - min(used) <= max(widths[3:])  # Balanced to within one column.
  parsed = Tables(html_tables.table(header, rows, key_columns=3)).tables
  assert all(part[0][:3] == header[:3] for _, part in parsed)


def test_a_table_that_fits_stays_whole_and_a_too_wide_column_still_shows():
  header, rows = _sweep_table(columns=5)
  assert len(Tables(html_tables.table(header, rows)).tables) == 1
  huge = html_tables.column_groups(["run", "x" * 400, "y"], [["a", "b", "c"]])
  assert huge == [[0, 1], [0, 2]]  # Alone in its group (the container scrolls).


def test_estimates_count_the_header_by_its_longest_word():
  assert html_tables.column_px("gap z (init null)", ["+3.5"]) == pytest.approx(
      len("(init") * html_tables.CHAR_PX + html_tables.CELL_PADDING_PX)
  assert html_tables.column_px("gap", ["0.1084 ± 0.0064"]) == pytest.approx(
      15 * html_tables.CHAR_PX + html_tables.CELL_PADDING_PX)


def test_cells_are_escaped_and_numbers_right_aligned():
  text = html_tables.table(["run", "value"], [["<b>", "−0.5"], ["a", "—"], ["b", "rope"]])
  assert "&lt;b&gt;" in text and "<b>" not in text
  assert text.count('<td class="num">') == 2  # −0.5 and the dash of a missing value.


def test_markdown_tables_bullets_headings_and_code():
  text = html_tables.markdown_html("# Title\n\n- a `x<y` b\n\n| run | v |\n|---|---|\n"
                                   "| nope | 1 |\n\nend")
  assert "<h2>Title</h2>" in text and "<li>a <code>x&lt;y</code> b</li>" in text
  assert Tables(text).tables == [(None, [["run", "v"], ["nope", "1"]])]
  assert text.endswith("<p>end</p>")
