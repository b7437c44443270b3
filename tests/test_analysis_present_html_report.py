# Tiers (pytest.ini): test_the_command_writes_the_page_and_fails_in_one_line runs launch/report.py
# in a subprocess, and the three page tests marked integration draw every figure of a run or of
# four (10-20 s each cold on 2 cores), so they are `make test-all` only.
# test-all only: launch/report.py writes the page and fails in one line with exit code 2 on a
# missing workdir (test_the_command_writes_the_page_and_fails_in_one_line); a trained run's page
# has every section, table and figure (test_a_trained_run_gets_every_section); a sweep's page has
# the compare table with seeds in one row and a section per run
# (test_a_sweep_has_the_compare_table_and_a_section_per_run); a sweep on an object store gives
# the page, written there too (test_url_workdirs).
"""The HTML report: one self-contained page per run or sweep, from the run files only."""
import base64
import html.parser
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import uuid

import fsspec
import pytest
from PIL import Image

from hybrid_nope.analysis.present import html_report, html_tables
from hybrid_nope.analysis.measure.hook import DATA_LAYER
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.test_analysis_evidence_compare import fake_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Page(html.parser.HTMLParser):
  """Tags of a page: every <img> src, every table as rows of cell texts (a table split into
  column groups joined again), headings, notes."""

  def __init__(self, text):
    super().__init__()
    self.tags, self.images, self.tables, self.headings = [], [], [], []
    self.text, self._cell, self._heading, self._continued = text, None, None, False
    self.feed(text)

  def handle_starttag(self, tag, attrs):
    self.tags.append((tag, dict(attrs)))
    if tag == "img":
      self.images.append(dict(attrs)["src"])
    elif tag == "table":
      continued = dict(attrs).get("class") == html_tables.CONTINUED
      self._continued = continued and int(dict(attrs)[html_tables.KEY_COLUMNS_ATTRIBUTE])
      self.tables.append([])
    elif tag == "tr":
      self.tables[-1].append([])
    elif tag in ("td", "th"):
      self._cell = ""
    elif tag == "h3":
      self._heading = ""

  def handle_endtag(self, tag):
    if tag == "table" and self._continued:  # Its rows, less the repeated key columns.
      part, keys = self.tables.pop(), self._continued
      assert [row[:keys] for row in part] == [row[:keys] for row in self.tables[-1]]
      for row, more in zip(self.tables[-1], part, strict=True):
        row.extend(more[keys:])
    elif tag in ("td", "th"):
      self.tables[-1][-1].append(self._cell)
      self._cell = None
    elif tag == "h3":
      self.headings.append(self._heading)
      self._heading = None

  def handle_data(self, data):
    if self._cell is not None:
      self._cell += data
    if self._heading is not None:
      self._heading += data

  def table(self, first_header):
    """Rows (header -> cell) of each table whose first column is `first_header`."""
    return [[dict(zip(t[0], row)) for row in t[1:]] for t in self.tables
            if t and t[0][0] == first_header]


def _assert_self_contained(page: Page):
  assert not [t for t, _ in page.tags if t in ("script", "iframe", "object", "embed", "link")]
  assert not [a for _, attrs in page.tags for a in attrs if a.startswith("on")]
  assert page.images
  for src in page.images:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    image = Image.open(io.BytesIO(base64.b64decode(src[len(prefix):])))
    assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    image.load()  # Decodes every pixel: a truncated PNG fails here.


def _records(workdir, name="recency.jsonl"):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def _rewrite(workdir, name, records):
  with open(os.path.join(workdir, name), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


@pytest.mark.integration
def test_a_trained_run_gets_every_section(tmp_path_factory):
  # Without the analysis another module's analyzed_run may have added to the shared run.
  workdir = str(tmp_path_factory.mktemp("page") / "run")
  shutil.copytree(trained_run(tmp_path_factory), workdir,
                  ignore=shutil.ignore_patterns("analysis"))
  page = Page(html_report.page([open_readonly(workdir)]))
  _assert_self_contained(page)
  # Loss, eval by position, profiles, floor/gap over steps and by module, three read-out figures.
  assert len(page.images) == 8
  latest = [r for r in _records(workdir) if r["step"] == 8 and r["layer"] != DATA_LAYER]
  (rows,) = page.table("layer")
  assert len(rows) == len(latest) == 2 * 7 + 1  # Every (layer, module) and the final norm.
  for row, r in zip(rows, sorted(latest, key=lambda r: (r["layer"], r["module"] == "final_norm"))):
    assert (int(row["layer"]), row["type"], row["module"]) == (r["layer"], r["layer_type"],
                                                               r["module"])
    assert row["floor f(L)"].startswith(f"{r['floor']:.4f} ± ")
  readout = [row for row in rows if row["logit gap (head mean)"]]
  assert [(row["layer"], row["module"]) for row in readout] == [("1", "pre_mixer_norm")]
  # Each module's effect on what it receives, with its paired SE.
  by_module = {(int(row["layer"]), row["module"]): row for row in rows}
  for r in latest:
    if "gap_change" in r:
      assert by_module[(r["layer"], r["module"])][
          "effect on gap (vs what it receives)"].startswith(f"{r['gap_change']:+.4f} ± ")
  assert "not recorded: init null" in page.text
  assert "Per-layer cosine profiles (step 8)" in page.headings
  # Throughput: the median of metrics.jsonl's progress records; the config in force.
  progress = [r for r in _records(workdir, "metrics.jsonl") if "tokens_per_second" in r]
  (throughput,) = page.table("logged intervals")
  assert throughput[0]["logged intervals"] == f"median of {len(progress)}"
  median = statistics.median(r["tokens_per_second"] for r in progress)
  assert throughput[0]["tokens/s"] == f"{median:,.0f}"
  assert throughput[2]["MFU"] == f"{100 * progress[-1]['mfu']:.1f}%"
  (config,) = [t for t in page.tables if t[0][:2] == ["key", "value"]]
  pairs = {row[i]: row[i + 1] for row in config[1:] for i in range(0, len(row), 2) if row[i]}
  assert pairs["model.pattern"] == "SG" and pairs["data.seq_len"] == "64"
  assert "model.attention_impl" not in pairs and "eval.every_steps" not in pairs
  # The tiny run sets no eval.length_multiples: said, not left out.
  assert "not recorded: eval_loss@{k}x" in page.text


def _sweep(root):
  specs = [("swa4_seed0", dict(window=4, seed=0, losses=(3.0, 2.1))),
           ("swa4_seed1", dict(window=4, seed=1, losses=(3.0, 2.3))),
           ("swa8", dict(window=8)), ("nope", dict(window=4, pattern="G"))]
  return [fake_run(root, name, **kw) for name, kw in specs]


@pytest.mark.integration
def test_a_sweep_has_the_compare_table_and_a_section_per_run(tmp_path):
  workdirs = _sweep(str(tmp_path))
  page = Page(html_report.page([open_readonly(w) for w in workdirs]))
  _assert_self_contained(page)
  (rows,) = page.table("run")
  assert [r["run"] for r in rows] == ["swa4 (2 seeds)", "swa8", "nope"]  # Seeds: one row.
  assert rows[0]["final eval loss"] == "2.2000 ± 0.1000"  # mean ± std/sqrt(2) of 2.1, 2.3.
  assert rows[0]["train.seed"] == "0, 1"
  assert page.text.count("<details>") == len(workdirs)
  tables = page.table("layer")
  assert len(tables) == len(workdirs) and all(len(t) == 2 * 7 + 1 for t in tables)
  # The fake runs record neither per-bucket eval losses nor a probe file.
  assert page.text.count("not recorded: eval_loss_by_position") == len(workdirs)
  assert page.text.count("not recorded: recency_probe.json") == len(workdirs)


def test_length_multiples_and_linear_layers_are_shown(tmp_path):
  workdir = fake_run(str(tmp_path), "gla", window=4)
  buckets = [3.0, 2.5, 2.4, 2.3]
  evals = [{"step": s, "eval_loss": 2.5, "eval_loss_by_position": buckets,
            "eval_bucket_size": 16, "eval_loss@2x": 2.6 + s / 100,
            "eval_loss_by_position@2x": buckets + [2.6, 2.7, 2.8, 2.9]} for s in (4, 8)]
  _rewrite(workdir, "metrics.jsonl", [{"step": 4, "loss": 3.0}] + evals)
  records = _records(workdir)
  for r in records:
    if r["layer"] == 0:  # Gated linear attention layers carry their decay.
      r.update(layer_type="linear", mean_decay=0.9, recency_scale=[0.25, 0.75])
  _rewrite(workdir, "recency.jsonl", records)
  page = Page(html_report.page([open_readonly(workdir)]))
  _assert_self_contained(page)
  assert "not recorded: eval_loss" not in page.text
  (multiples,) = page.table("step")
  assert [(r["step"], r["eval loss @2×"]) for r in multiples] == [("4", "2.6400"),
                                                                  ("8", "2.6800")]
  (rows,) = page.table("layer")
  linear = [r for r in rows if r["type"] == "linear"]
  assert len(linear) == 7
  assert all(r["mean_decay"] == "0.9" and r["recency_scale"] == "0.5" for r in linear)
  assert all(r["mean_decay"] == "—" for r in rows if r["type"] == "global")
  # Loss, eval by position, the multiples' extrapolation figure, then the recency figures.
  assert len(page.images) == 9



def test_length_multiples_analyze_computed_are_shown(tmp_path):
  """launch/analyze.py --lengths=1,2 wrote extrapolation.json; training recorded no multiple.
  The page said "not recorded" for them."""
  workdir = fake_run(str(tmp_path), "swa", window=4)
  rows = [{"factor": k, "seq_len": 64 * k, "loss": 2.5 + k / 10, "loss_near": 2.4,
           "loss_beyond": None if k == 1 else 2.9, "ratio": None if k == 1 else 1.2,
           "gap": 0.1 / k, "logit_gap": 0.02, "bucket_size": 16,
           "loss_by_position": [3.0, 2.5, 2.4, 2.3] * k} for k in (1, 2)]
  analysis = RunDir(workdir).analysis_dir(8)
  os.makedirs(analysis)
  with open(os.path.join(analysis, "extrapolation.json"), "w") as f:
    json.dump({"workdir": workdir, "step": 8, "train_seq_len": 64, "lengths": rows}, f)
  page = Page(html_report.page([open_readonly(workdir)]))
  _assert_self_contained(page)
  assert "not recorded: eval_loss@" not in page.text
  (lengths,) = page.table("length")
  assert [(r["length"], r["seq_len"], r["eval loss"], r["ratio"]) for r in lengths] == [
      ("1×", "64", "2.6000", "—"), ("2×", "128", "2.7000", "1.2000")]
  assert "checkpoint analysis of step 8" in page.text

def test_a_live_run_shows_its_last_complete_step(tmp_path):
  workdir = fake_run(str(tmp_path), "live", window=4)
  partial = [dict(r, step=12) for r in _records(workdir) if r["step"] == 8][:3]
  with open(os.path.join(workdir, "recency.jsonl"), "a") as f:
    f.writelines(json.dumps(r) + "\n" for r in partial)
    f.write('{"step": 12, "lay')  # The hook is mid-line.
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 12, "lo')
  page = Page(html_report.page([open_readonly(workdir)]))
  assert "recency step 12 is still being written (3 of 15 records): showing step 8" in page.text
  assert "Per-layer cosine profiles (step 8)" in page.headings
  assert len(page.table("layer")[0]) == 15


@pytest.mark.integration
def test_url_workdirs(tmp_path):
  """A sweep on an object store (memory:// stands in for gs://), the page written there too."""
  fs = fsspec.filesystem("memory")
  root = f"memory://reports/{uuid.uuid4().hex}"
  urls = []
  for local in _sweep(str(tmp_path))[2:]:
    url = f"{root}/{os.path.basename(local)}"
    for name in os.listdir(local):
      fs.pipe_file(f"{url}/{name}", open(os.path.join(local, name), "rb").read())
    urls.append(url)
  html_report.write([open_readonly(w) for w in urls], f"{root}/report.html")
  page = Page(fs.cat_file(f"{root}/report.html").decode())
  _assert_self_contained(page)
  assert [r["run"] for r in page.table("run")[0]] == ["swa8", "nope"]
  assert page.text.count(f'<p class="meta">{root}/swa8</p>') == 1


@pytest.mark.parametrize("case", ["missing", "empty", "no_metrics"])
def test_no_run_there_is_one_line_naming_the_path(tmp_path, case):
  workdir = tmp_path / "run"
  if case != "missing":
    workdir.mkdir()
  if case == "no_metrics":
    (workdir / "config.json").write_text("{}")
  with pytest.raises(UserError) as error:
    html_report.page([open_readonly(str(workdir))])
  message = str(error.value)
  assert "\n" not in message
  expected = workdir / "metrics.jsonl" if case == "no_metrics" else workdir
  assert f"{expected} " in message


@pytest.mark.integration
def test_the_command_writes_the_page_and_fails_in_one_line(tmp_path):
  workdir = fake_run(str(tmp_path), "run", window=4)
  out = tmp_path / "report.html"
  script = os.path.join(REPO, "launch", "report.py")
  ok = subprocess.run([sys.executable, script, workdir, f"--out={out}"], capture_output=True,
                      text=True, timeout=300, cwd=REPO)
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "<table>" in out.read_text()
  bad = subprocess.run([sys.executable, script, str(tmp_path / "nothing"), f"--out={out}"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert bad.returncode == 2
  assert bad.stderr.strip() == (f"report.py: workdir {tmp_path / 'nothing'} does not exist or "
                                f"is not a directory")
