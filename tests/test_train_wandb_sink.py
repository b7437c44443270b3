"""WandbSink in W&B's offline mode: what it logs is read back from the run's .wandb transaction
log (LevelDB-style records of wandb.proto Record messages) and its media files. The tests
without the `offline` fixture run without wandb installed."""
import glob
import io
import json
import os
import subprocess
import sys
import time
import types

import jax
import ml_collections
import numpy as np
import pytest

from hybrid_nope.errors import UserError
from hybrid_nope.run import wandb_sink
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.wandb_sink import WandbSink
from tests.helpers import REPO, tiny_config

BLOCK, HEADER = 32768, 7  # The log's block size, and both its file and record header lengths.


def config_with(project: str, entity: str = "") -> ml_collections.ConfigDict:
  c = tiny_config()
  c.logging = ml_collections.ConfigDict(dict(wandb_project=project, wandb_entity=entity))
  return c


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """W&B's offline mode in tmp_path; skips the test where wandb is not installed."""
  pytest.importorskip("wandb")
  root = tmp_path / "wandb_dir"
  for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
                     "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
                     "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"),
                     "WANDB_DATA_DIR": str(tmp_path / "wandb_data")}.items():
    monkeypatch.setenv(key, value)
  return root


def log_records(path: str) -> list:
  """The Record messages of a .wandb file: 7-byte headers (crc32c, length, type) in 32 KiB
  blocks; type 1 is a whole record, 2/3/4 its first/middle/last piece."""
  from wandb.proto import wandb_internal_pb2
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  pos, out, pending = HEADER, [], b""
  while pos + HEADER <= len(data):
    left = BLOCK - pos % BLOCK
    if left < HEADER:  # The writer pads a block's tail too short for a header.
      pos += left
      continue
    length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
    if pos + HEADER + length > len(data):  # A record still being written.
      break
    pending += data[pos + HEADER:pos + HEADER + length]
    pos += HEADER + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      out.append(record)
      pending = b""
  return out


def offline_run(root, run_id: str, index: int = -1):
  """(run directory, its Record messages) of the `index`-th offline run with `run_id`."""
  pattern = os.path.join(root, "wandb", f"offline-run-*-{run_id}*", f"run-{run_id}.wandb")
  logs = sorted(glob.glob(pattern), key=lambda p: os.path.basename(os.path.dirname(p)))
  # wandb-core (its own process) may still be writing the log when finish() returns: wait for
  # its closing "exit" record.
  deadline = time.monotonic() + 60
  while True:
    records = log_records(logs[index])
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      return os.path.dirname(logs[index]), records
    assert time.monotonic() < deadline, f"{logs[index]} has no exit record"
    time.sleep(0.1)


def history(records) -> dict[int, dict]:
  """Step -> the logged row; a media value is a dict (nested keys: "recency" -> "path")."""
  rows = {}
  for r in records:
    if r.WhichOneof("record_type") == "history":
      row = {}
      for item in r.history.item:
        *outer, last = list(item.nested_key) or [item.key]
        inner = row
        for key in outer:
          inner = inner.setdefault(key, {})
        inner[last] = json.loads(item.value_json)
      rows.setdefault(row["_step"], {}).update(row)
  return rows


def recency_like() -> list[dict]:
  common = dict(step=3, lags=[1, 2, 32], far_lag=32, pairs=[10, 9, 4])
  return [dict(common, layer=-1, layer_type="data", module="tokens", profile=[0.2, 0.1, 0.05],
               floor=0.05, gap=0.15, stderr=[0.01, 0.01, 0.02]),
          dict(common, layer=0, layer_type="swa", module="input", profile=[0.9, 0.7, 0.3],
               floor=0.3, gap=0.6, stderr=[0.02, 0.02, 0.03]),
          dict(common, layer=1, layer_type="global", module="pre_mixer_norm",
               profile=[0.8, 0.6, 0.4], floor=0.4, gap=float("nan"), stderr=[0.02, 0.03, None],
               logit_profile=[[0.1, 0.0, -0.1], [0.2, 0.1, 0.0]], logit_gap=[0.2, 0.2],
               logit_gap_stderr=[0.05, 0.06], alignment=[0.01, -0.02],
               alignment_null=[1 / 32, 1 / 32])]


def test_losses_table_and_images_reach_the_offline_run(tmp_path, offline):
  from PIL import Image
  workdir = str(tmp_path / "run")
  sink = WandbSink(config_with("hybrid-nope-test"), workdir)
  losses = {1: 5.5, 2: 5.25, 3: 4.75}
  for step, loss in losses.items():
    sink.scalars(step, {"loss": np.float32(loss)})
    sink.scalars(step, {"learning_rate": step * 1e-3})  # Same step: the same row.
  records = recency_like()
  sink.table("recency", 3, records)
  png = io.BytesIO()
  Image.fromarray(np.full((20, 30, 3), (200, 10, 10), np.uint8)).save(png, format="png")
  sink.images(3, {"recency/gap": png.getvalue(),
                  "recency/floor": np.zeros((12, 16, 3), np.uint8)})
  samples = [{"prompt": "def f(", "text": "x):\n  return"}, {"prompt": "import", "text": " os"}]
  sink.samples(3, samples)
  sink.finish()
  assert not sink.active

  run_id = open(RunDir(workdir).wandb_id).read().strip()
  run_dir, log = offline_run(offline, run_id)
  (run,) = [r.run for r in log if r.WhichOneof("record_type") == "run"]
  assert (run.run_id, run.project) == (run_id, "hybrid-nope-test")
  config = {u.key: json.loads(u.value_json) for u in run.config.update}
  assert config["model"]["d_model"] == 32 and config["metrics"]["every_steps"] == 4
  rows = history(log)
  assert {s: rows[s]["loss"] for s in losses} == losses
  assert [rows[s]["learning_rate"] for s in losses] == [1e-3, 2e-3, 3e-3]

  table = json.load(open(os.path.join(run_dir, "files", rows[3]["recency"]["path"])))
  assert table["columns"][:4] == ["step", "layer", "layer_type", "module"]
  got = [dict(zip(table["columns"], row)) for row in table["data"]]
  assert [(r["layer"], r["module"]) for r in got] == [(-1, "tokens"), (0, "input"),
                                                     (1, "pre_mixer_norm")]
  for want, row in zip(records, got):
    assert row["gap"] == want["gap"] or (np.isnan(row["gap"]) and np.isnan(want["gap"]))
    assert row["floor"] == want["floor"]
    assert json.loads(row["profile"]) == want["profile"]
    assert json.loads(row["stderr"]) == want["stderr"]
    for key in ("logit_profile", "logit_gap", "logit_gap_stderr", "alignment", "alignment_null"):
      assert (row[key] is None) == (key not in want)
      if key in want:
        assert json.loads(row[key]) == want[key]

  samples_table = json.load(open(os.path.join(run_dir, "files", rows[3]["samples"]["path"])))
  assert samples_table["columns"] == ["prompt", "text"]
  assert samples_table["data"] == [[s["prompt"], s["text"]] for s in samples]

  red = Image.open(os.path.join(run_dir, "files", rows[3]["recency/gap"]["path"]))
  assert red.size == (30, 20) and red.convert("RGB").getpixel((5, 5)) == (200, 10, 10)
  assert rows[3]["recency/floor"]["width"] == 16 and rows[3]["recency/floor"]["height"] == 12


def test_a_resumed_workdir_continues_the_same_run(tmp_path, offline):
  workdir = str(tmp_path / "run")
  first = WandbSink(config_with("p"), workdir)
  first.scalars(1, {"loss": 2.0})
  first.finish()
  second = WandbSink(config_with("p"), workdir)
  second.scalars(2, {"loss": 1.5})
  second.finish()
  assert second.run_id == first.run_id
  runs = glob.glob(os.path.join(offline, "wandb", "offline-run-*"))
  assert len(runs) == 2
  assert all(os.path.exists(os.path.join(r, f"run-{first.run_id}.wandb")) for r in runs)
  _, log = offline_run(offline, first.run_id, index=-1)
  assert [r.run.run_id for r in log if r.WhichOneof("record_type") == "run"] == [first.run_id], [r.WhichOneof("record_type") for r in log]
  assert history(log)[2]["loss"] == 1.5
  other = WandbSink(config_with("p"), str(tmp_path / "other"))
  other.finish()
  assert other.run_id != first.run_id


def test_a_gcs_like_workdir_keeps_the_run_id_through_storage(tmp_path):
  url = "memory://wandb_sink_test/run"
  made = wandb_sink.run_id(url)
  assert len(made) == 8 and made.isalnum() and made == wandb_sink.run_id(url)
  from hybrid_nope.run import storage
  assert storage.read_text(RunDir(url).wandb_id).strip() == made


def test_only_process_0_logs(tmp_path, offline, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  sink = WandbSink(config_with("p"), str(tmp_path / "run"))
  sink.scalars(1, {"loss": 1.0})
  sink.table("recency", 1, recency_like())
  sink.finish()
  assert not sink.active and not os.path.exists(tmp_path / "run") and not os.path.exists(offline)


def test_no_project_creates_nothing_and_never_imports_wandb(tmp_path):
  script = f"""
import sys
import ml_collections
from hybrid_nope.run.wandb_sink import WandbSink
c = ml_collections.ConfigDict(dict(logging=dict(wandb_project="", wandb_entity="")))
sink = WandbSink(c, {str(tmp_path / 'run')!r})
sink.scalars(1, {{"loss": 1.0}}); sink.table("recency", 1, [{{"step": 1}}])
sink.images(1, {{"x": b""}}); sink.finish()
print(sink.active, "wandb" in sys.modules, "PIL" in sys.modules)
"""
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["False", "False", "False"]
  assert not os.path.exists(tmp_path / "run")


def test_table_rows_keep_every_key_and_encode_lists():
  columns, rows = wandb_sink.table_rows([{"module": "mlp", "layer": 0, "profile": [1.0, 0.5]},
                                         {"layer": 1, "mean_decay": np.float32(0.5),
                                          "step": 2}])
  assert columns == ["step", "layer", "module", "profile", "mean_decay"]
  assert rows == [[None, 0, "mlp", "[1.0, 0.5]", None], [2, 1, None, None, 0.5]]
  assert type(rows[1][4]) is float


def fake_wandb(error_name: str, message: str) -> types.ModuleType:
  """A wandb module whose init raises wandb.errors.<error_name>(message), as the real one does
  when no API key is configured (UsageError, checked with wandb 0.31) or a key is refused."""
  errors = types.SimpleNamespace(**{name: type(name, (Exception,), {})
                                    for name in ("UsageError", "CommError")})
  module = types.ModuleType("wandb")
  module.errors = errors

  def init(**kwargs):
    raise getattr(errors, error_name)(message)
  module.init = init
  return module


@pytest.mark.parametrize("error_name, message", [
    ("UsageError", "No API key configured. Use `wandb login` to log in."),
    ("CommError", "invalid API key\n(HTTP 401)"),
])
def test_no_wandb_login_is_one_line_saying_how_to_log_in_or_go_offline(tmp_path, monkeypatch,
                                                                      error_name, message):
  monkeypatch.setitem(sys.modules, "wandb", fake_wandb(error_name, message))
  with pytest.raises(UserError) as e:
    WandbSink(config_with("hybrid-nope-test"), str(tmp_path / "run"))
  text = str(e.value)
  assert "\n" not in text and " ".join(message.split()) in text
  assert text.startswith("config.logging.wandb_project='hybrid-nope-test': W&B could not start")
  assert "`wandb login`" in text and "WANDB_MODE=offline" in text


@pytest.mark.integration
def test_a_training_run_with_samples_between_log_steps_keeps_every_training_scalar(tmp_path,
                                                                                  offline):
  """Samples and evals at steps off train.log_every_steps: W&B keeps a row only at a step not
  below the last it saw, so the loop writes the pending training steps before any side work."""
  from hybrid_nope.train import loop
  from hybrid_nope.run.storage import read_jsonl
  workdir = str(tmp_path / "run")
  config = tiny_config(train__log_every_steps=4, eval__every_steps=3, eval__sample_every_steps=3,
                       eval__sample_prompts=("def ",), eval__sample_max_new_tokens=2)
  config.logging.wandb_project = "hybrid-nope-test"
  loop.train(config, workdir)
  records = read_jsonl(RunDir(workdir).metrics)
  train = {r["step"]: r for r in records if "loss" in r}
  assert sorted(train) == list(range(1, 9))
  _, log = offline_run(offline, open(RunDir(workdir).wandb_id).read().strip())
  rows = history(log)
  for key in ("loss", "grad_norm", "learning_rate"):
    assert {s: rows[s][key] for s in train if key in rows.get(s, {})} == {
        s: pytest.approx(r[key]) for s, r in train.items()}, key
  assert {s for s in rows if "samples" in rows[s]} == {3, 6, 8}
  assert {s for s in rows if "eval_loss" in rows[s]} == {3, 6, 8}
  # metrics.jsonl is in step order too.
  assert [r["step"] for r in records] == sorted(r["step"] for r in records)
