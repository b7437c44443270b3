# Tiers (pytest.ini): one test trains end to end twice, so it is integration; test-all only: a
# full disk under the recency hook stops the run in one line and the rerun resumes
# (test_a_full_disk_under_the_recency_hook_stops_the_run_and_the_rerun_resumes).
import json
import logging
import math
import os
import shutil

import pytest

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.metrics_writer import MetricsWriter


def test_records_and_truncation_on_resume(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.close()
  # A run restored from step 3 drops what the lost run wrote after it.
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  writer.write(4, {"loss": 0.5})
  writer.close()
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.5)]


def test_latest_is_the_newest_value_up_to_the_resume_step(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  assert math.isnan(writer.latest("loss"))
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step, **({"eval_loss": 9.0 + step} if step < 4 else {})})
  writer.write(5, {"tokens_per_second": 7.0})  # A later record of the step without the key.
  writer.close()
  assert MetricsWriter(str(tmp_path), resume_step=5).latest("loss") == 1 / 5
  assert MetricsWriter(str(tmp_path), resume_step=5).latest("eval_loss") == 12.0
  assert MetricsWriter(str(tmp_path), resume_step=2).latest("loss") == 1 / 2
  assert math.isnan(MetricsWriter(str(tmp_path), resume_step=5).latest("missing"))


def write_steps(workdir, steps):
  writer = MetricsWriter(str(workdir))
  for step in steps:
    writer.write(step, {"loss": float(step)})
  writer.close()


def steps_in(path):
  return [json.loads(l)["step"] for l in open(path)]


def test_a_kill_during_the_resume_rewrite_leaves_the_history_whole(tmp_path, monkeypatch):
  write_steps(tmp_path, range(1, 6))
  before = (tmp_path / "metrics.jsonl").read_text()

  def killed(*args):  # The process dies after writing the new file, before renaming it.
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", killed)
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with pytest.raises(KeyboardInterrupt):
    writer.write(4, {"loss": 0.5})
  assert (tmp_path / "metrics.jsonl").read_text() == before
  monkeypatch.undo()
  writer = MetricsWriter(str(tmp_path), resume_step=3)  # The rerun then truncates as usual.
  writer.write(4, {"loss": 0.5})
  writer.close()
  assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]


def test_a_torn_last_line_is_dropped_with_a_warning_naming_the_file(tmp_path, caplog):
  write_steps(tmp_path, range(1, 4))
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "lo')  # killed mid-write
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with caplog.at_level(logging.WARNING):
    writer.write(4, {"loss": 0.25})
  writer.close()
  assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]
  assert f"{tmp_path / 'metrics.jsonl'}: dropped its torn last line 4" in caplog.text


def test_a_corrupt_line_before_the_last_fails_naming_the_file_and_line(tmp_path):
  write_steps(tmp_path, range(1, 4))
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines[1] = "garbage\n"
  (tmp_path / "metrics.jsonl").write_text("".join(lines))
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with pytest.raises(ValueError, match="metrics.jsonl line 2 is not JSON"):
    writer.write(4, {"loss": 0.25})
  writer.close()


def test_a_missing_file_on_resume_is_a_warning(tmp_path, caplog):
  writer = MetricsWriter(str(tmp_path), resume_step=7)
  with caplog.at_level(logging.WARNING):
    writer.write(8, {"loss": 0.25})
  writer.close()
  assert "metrics.jsonl is missing although the run resumes at step 7" in caplog.text
  assert f"only the event files under {tmp_path / 'tensorboard'}, where they survive" in caplog.text
  assert steps_in(tmp_path / "metrics.jsonl") == [8]


def test_a_url_workdir_gets_whole_files_at_each_flush_and_resumes_from_them():
  import uuid
  from hybrid_nope.run import storage
  url = f"memory://runs/{uuid.uuid4().hex}"
  writer = MetricsWriter(url)
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.write_record("recency.jsonl", {"step": 4, "gap": 0.1})
  assert not storage.exists(storage.join(url, "metrics.jsonl"))  # Nothing before a flush.
  writer.flush()
  assert steps_in_text(storage.read_text(storage.join(url, "metrics.jsonl"))) == [1, 2, 3, 4, 5]
  writer.close()
  assert any(name.startswith("events.out.tfevents")
             for name in storage.listdir(storage.join(url, "tensorboard")))
  resumed = MetricsWriter(url, resume_step=3)
  resumed.write(4, {"loss": 0.3})
  resumed.close()
  assert steps_in_text(storage.read_text(storage.join(url, "metrics.jsonl"))) == [1, 2, 3, 4]
  assert storage.read_text(storage.join(url, "recency.jsonl")).count("\n") == 1  # Untouched.


def steps_in_text(text):
  return [json.loads(line)["step"] for line in text.splitlines()]


def test_non_finite_values_are_written_as_null_and_read_back_as_nan(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  writer.write(1, {"loss": float("nan"), "grad_norm": float("inf")})
  writer.write_record("recency.jsonl", {"step": 1, "gap": float("nan"),
                                        "profile": [0.5, float("-inf")]})
  writer.close()
  for name in ("metrics.jsonl", "recency.jsonl"):
    text = (tmp_path / name).read_text()
    assert "NaN" not in text and "Infinity" not in text, text  # Not JSON.
  assert json.loads((tmp_path / "recency.jsonl").read_text())["profile"] == [0.5, None]
  (metrics,) = storage.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert math.isnan(metrics["loss"]) and math.isnan(metrics["grad_norm"])
  resumed = MetricsWriter(str(tmp_path), resume_step=1)  # The resume rewrite keeps them null.
  resumed.write(2, {"loss": 1.0})
  resumed.close()
  assert (tmp_path / "metrics.jsonl").read_text().splitlines()[0] == (
      '{"step": 1, "loss": null, "grad_norm": null}')


def test_a_record_without_a_step_fails_the_resume_naming_the_file_and_line(tmp_path):
  write_steps(tmp_path, range(1, 4))
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines[1] = '{"loss": 2.0}\n'  # Valid JSON: the resume's r["step"] raised a KeyError.
  (tmp_path / "metrics.jsonl").write_text("".join(lines))
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  with pytest.raises(UserError, match=r'metrics.jsonl line 2 is not a record with an integer'):
    writer.write(4, {"loss": 0.25})
  writer.close()


@pytest.mark.parametrize("name", ["metrics.jsonl", "recency.jsonl"])  # Open, and first written.
def test_a_workdir_deleted_mid_run_is_one_line_naming_it(tmp_path, name):
  workdir = tmp_path / "run"
  writer = MetricsWriter(str(workdir))
  writer.write(1, {"loss": 1.0})
  shutil.rmtree(workdir)
  with pytest.raises(UserError, match=f"workdir {workdir} was deleted or moved while the run "
                                      "wrote to it"):
    writer.write_record(name, {"step": 2, "loss": 0.5})
  assert not workdir.exists()  # Not recreated half-empty.
  writer.close()


def test_analysis_reads_the_null_records_as_it_read_the_nan_ones(tmp_path):
  """report.summarize averages fields that may be NaN (a lag without pairs, an SE of < 2
  documents): on the records read back it gives what it gives on the written ones."""
  from hybrid_nope.analysis.checkpoint import report
  from hybrid_nope.analysis.evidence import run_files
  written = [{"step": 4, "layer": layer, "layer_type": "global", "module": "pre_mixer_norm",
              "lags": [1, 32], "profile": [0.5, float("nan")], "floor": float("nan"),
              "gap": gap, "gap_stderr": float("nan"), "logit_gap": [0.2, float("nan")],
              "logit_gap_stderr": [0.01, 0.02]} for layer, gap in ((1, 0.3), (3, float("nan")))]
  writer = MetricsWriter(str(tmp_path))
  for r in written:
    writer.write_record("recency.jsonl", r)
  writer.close()
  read = run_files.read_jsonl(str(tmp_path / "recency.jsonl"))
  want, got = report.summarize(written), report.summarize(read)
  assert want.keys() == got.keys()
  for key in want:
    assert (got[key] == want[key] or (got[key] is not None and want[key] is not None
                                      and math.isnan(got[key]) and math.isnan(want[key]))), key


def _flat(tree, prefix=""):
  """An independent flattening of config.to_dict(): {"section.key": value}."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
  return out


def test_the_config_and_hparams_reach_tensorboard(tmp_path):
  """Read back from the event file: the Text plugin's config table (every key, the defining
  ones marked) and the HParams plugin's experiment and session, whose metric is the eval loss
  the same run writes as a scalar."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
  from tests.helpers import tiny_config
  from tests.test_analysis_measure_live_figures import read_events
  config = tiny_config(model__pattern="SG", data__batch_size=4)
  writer = MetricsWriter(str(tmp_path))
  writer.write_config(0, config)
  writer.write_scalars(8, {"eval_loss": 2.5})
  writer.close()
  (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  values = {v.tag: v for e in read_events(path) for v in e.summary.value}

  text = values["config/text_summary"]
  assert text.metadata.plugin_data.plugin_name == "text"
  rows = [line.split(" | ") for line in text.tensor.string_val[0].decode().splitlines()[2:]]
  table = {key.lstrip("| "): (value, mark.rstrip("| ")) for key, value, mark in rows}
  expected = _flat(config.to_dict())
  assert {k: json.loads(v) for k, (v, _) in table.items()} == expected
  defining = {k for k, (_, mark) in table.items() if mark == "yes"}
  assert {"model.pattern", "model.window", "data.batch_size", "train.seed",
          "train.learning_rate"} <= defining
  assert not defining & {"model.attention_impl", "model.remat", "eval.every_steps",
                         "checkpoint.every_steps", "train.log_every_steps"}

  def plugin(tag):
    value = values[f"_hparams_/{tag}"]
    assert value.metadata.plugin_data.plugin_name == "hparams"
    return HParamsPluginData.FromString(value.metadata.plugin_data.content)

  experiment = plugin("experiment").experiment
  assert [m.name.tag for m in experiment.metric_infos] == ["eval_loss"]
  assert {h.name for h in experiment.hparam_infos} == defining
  session = plugin("session_start_info").session_start_info.hparams
  assert set(session) == defining
  assert session["model.pattern"].string_value == "SG"
  assert session["data.batch_size"].number_value == 4
  assert session["train.learning_rate"].number_value == config.train.learning_rate
  assert values["eval_loss"].simple_value == 2.5  # The metric's scalar, in the same run.


def test_samples_reach_metrics_jsonl_and_tensorboard_text(tmp_path):
  from tests.test_analysis_measure_live_figures import read_events
  samples = [{"prompt": "def f(", "text": "x):\n  return x"}, {"prompt": "import", "text": " os"}]
  writer = MetricsWriter(str(tmp_path))
  writer.write(6, {"loss": 1.5})
  writer.write_samples(6, samples)
  writer.close()
  records = storage.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert records == [{"step": 6, "loss": 1.5}, {"step": 6, "samples": samples}]
  (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  texts = {v.tag: v.tensor.string_val[0].decode() for e in read_events(path)
           for v in e.summary.value if v.metadata.plugin_data.plugin_name == "text"}
  assert texts == {f"samples/{i}/text_summary": f"```\n{s['prompt']}{s['text']}\n```"
                   for i, s in enumerate(samples)}


def test_a_full_disk_under_the_records_is_one_line_and_close_does_not_repeat_it(tmp_path):
  # Issue 38 case 5: an OSError traceback from the recency hook (exit 1), and another from
  # TensorBoard's flush in close. /dev/full refuses every write with ENOSPC, as a full disk.
  from hybrid_nope.run.metrics_writer import RecordsError
  writer = MetricsWriter(str(tmp_path))
  writer.write(1, {"loss": 1.0})
  os.remove(tmp_path / "metrics.jsonl")
  os.symlink("/dev/full", tmp_path / "metrics.jsonl")
  with pytest.raises(RecordsError) as refused:
    writer.write(2, {"loss": 0.5})
  message = str(refused.value)
  assert "\n" not in message and message.startswith(
      f"cannot write {tmp_path / 'metrics.jsonl'} (No space left on device): the run stops. "
      "Free space on that disk")
  assert "rerun the same command: it resumes from the newest checkpoint" in message
  assert isinstance(refused.value, UserError)  # cli.run: one line, exit code 2.
  writer.close()  # The same disk's refusal again is not raised over the first.


def test_a_side_file_the_disk_refuses_is_one_line_naming_it(tmp_path, monkeypatch):
  import errno
  from hybrid_nope.run.run_dir import RunDir
  from hybrid_nope.run.metrics_writer import RecordsError

  def full(path, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  writer = MetricsWriter(str(tmp_path))
  monkeypatch.setattr(storage, "write_bytes", full)
  path = RunDir(str(tmp_path)).recency_sums_file(3)
  with pytest.raises(RecordsError, match=rf"^cannot write {path} \(No space left on device\)"):
    writer.write_file(path, b"sums")  # What the recency hook writes its sums with.
  monkeypatch.undo()
  writer.write_file(path, b"sums")  # Room again: written.
  assert open(path, "rb").read() == b"sums"
  writer.close()


@pytest.mark.integration
def test_a_full_disk_under_the_recency_hook_stops_the_run_and_the_rerun_resumes(tmp_path,
                                                                                monkeypatch):
  import errno
  from hybrid_nope.analysis.measure.hook import RecencyHook
  from hybrid_nope.train import loop
  from hybrid_nope.run.metrics_writer import RecordsError
  from tests.helpers import tiny_config
  config, real = tiny_config(metrics__every_steps=2), storage.write_bytes

  def full_at_step_6(path, data):
    if path.endswith("step_00000006.npz"):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real(path, data)
  monkeypatch.setattr(storage, "write_bytes", full_at_step_6)
  with pytest.raises(RecordsError, match=r"step_00000006.npz \(No space left on device\): the "
                     r"run stops.* rerun the same command: it resumes from the newest"):
    loop.train(config, str(tmp_path), hooks=[RecencyHook.for_run])
  monkeypatch.undo()  # Space freed; the advice, followed.
  summary = loop.train(config, str(tmp_path), hooks=[RecencyHook.for_run])
  assert summary["step"] == 8
  records = storage.read_jsonl(str(tmp_path / "recency.jsonl"))
  keys = [(r["step"], r["layer"], r["module"]) for r in records]
  assert sorted({k[0] for k in keys}) == [0, 2, 4, 6, 8] and len(keys) == len(set(keys))
