# Tiers (pytest.ini): the tests marked integration here restore a run that
# tests/analysis_runs.py trains end to end (8 steps, once per process), or run launch/analyze.py
# in a subprocess, so they are `make test-all` only; `make test` keeps the refusals of workdirs
# with no run, no checkpoints or a broken config.json.
# test-all only: config.json round-trips (test_config_round_trips_through_json); a missing step
# lists those there (test_missing_step_lists_available); the latest and a given step restore
# (test_restore_latest_and_given_step); an incompatible config names the parameter
# (test_incompatible_config_names_the_parameter); overrides are applied to a copy and unknown
# keys named (test_apply_overrides_copies_and_names_unknown_keys); a flipped byte is refused
# naming the step and leaf (test_a_flipped_byte_in_the_params_is_refused_naming_the_step_and_leaf);
# a truncated state is refused in one line (test_a_truncated_state_is_refused_in_one_line); a
# checkpoint without meta/ restores with one warning
# (test_a_checkpoint_without_meta_restores_with_one_warning); launch/analyze.py refuses a flipped
# checkpoint in one line and writes nothing (test_analyze_refuses_a_flipped_checkpoint_in_one_line),
# and says in one line that a checkpoint has no state item
# (test_analyze_without_the_state_item_says_so_in_one_line); reads beside a real trainer saving
# every step all succeed (test_readers_beside_a_real_trainer_saving_every_step); analyze of a
# flipped opt-state index byte prints no "Event loop is closed"
# (test_analyze_refuses_a_flipped_opt_state_index_byte_in_one_line_without_noise). Readers
# beside a fake trainer's unfinished steps (live_run, unfinished_copy) are `make test`.
"""Restoring a run for analysis, and the errors for unusable workdirs, steps, configs and
checkpoints (corrupt, truncated or missing state: refused in one line, as the trainer does)."""
import glob
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

from hybrid_nope.run import checkpoint_integrity as integrity
from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.errors import USAGE_EXIT_CODE
from hybrid_nope.model.definition import init_model
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import init_train_state
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.helpers import REPO, tiny_config, tiny_flags


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


def test_missing_and_empty_workdir(tmp_path):
  with pytest.raises(checkpoints.WorkdirError, match=f"workdir {tmp_path}/nope does not exist"):
    checkpoints.load_config(str(tmp_path / "nope"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(checkpoints.WorkdirError, match=f"workdir {empty} is empty"):
    checkpoints.load_config(str(empty))
  (empty / "metrics.jsonl").write_text("")
  with pytest.raises(checkpoints.WorkdirError, match=f"{empty}/config.json does not exist"):
    checkpoints.load_config(str(empty))


def test_no_checkpoints(tmp_path):
  (tmp_path / "config.json").write_text(tiny_config().to_json_best_effort())
  config = checkpoints.load_config(str(tmp_path))
  with pytest.raises(checkpoints.WorkdirError, match=f"no checkpoints in {tmp_path}/checkpoints"):
    checkpointed.restore_params(open_readonly(str(tmp_path), config))
  assert not (tmp_path / "checkpoints").exists()  # Analysis never creates directories there.


@pytest.mark.long
@pytest.mark.integration
def test_config_round_trips_through_json(run):
  config = checkpoints.load_config(run)
  assert config.model.to_dict() == tiny_config().model.to_dict()
  assert config.data.seq_len == 64 and config.metrics.far_lag == 32


@pytest.mark.integration
def test_missing_step_lists_available(run):
  config = checkpoints.load_config(run)
  assert checkpoints.available_steps(run, config) == [4, 8]
  with pytest.raises(checkpoints.StepNotFoundError,
                     match=r"step 5 has no checkpoint in .*checkpoints; available steps: \[4, 8\]"):
    checkpointed.restore_params(open_readonly(run, config), step=5)


@pytest.mark.integration
def test_restore_latest_and_given_step(run):
  config = checkpoints.load_config(run)
  step, model_def, params = checkpointed.restore_params(open_readonly(run, config))
  step4, _, params4 = checkpointed.restore_params(open_readonly(run, config), step=4)
  assert (step, step4) == (8, 4)
  _, init = init_model(config.model, config.train.seed)
  assert jax.tree.structure(params) == jax.tree.structure(init)
  for a, b, c in zip(jax.tree.leaves(params), jax.tree.leaves(params4), jax.tree.leaves(init)):
    assert a.shape == c.shape and a.dtype == c.dtype
    assert a.sharding.device_set == {jax.devices()[0]}
  # Training moved the weights, and step 8 is not step 4.
  wq = lambda p: np.asarray(p["blocks"][1]["attn"]["wq_DNH"])
  assert not np.allclose(wq(params), wq(init)) and not np.allclose(wq(params), wq(params4))
  assert model_def.bind(params).blocks[1].attn.wq_DNH[...].shape == (32, 4, 8)


@pytest.mark.integration
def test_incompatible_config_names_the_parameter(run):
  config = checkpoints.apply_overrides(checkpoints.load_config(run), {"model.d_model": 48})
  with pytest.raises(checkpoints.IncompatibleCheckpointError) as e:
    checkpointed.restore_params(open_readonly(run, config), step=8)
  message = str(e.value)
  assert "checkpoints/8" in message
  assert "params/blocks/0/attn/wk_DKH has shape (32, 2, 8) in the checkpoint but (48, 2, 8)" \
      in message

  deeper = checkpoints.apply_overrides(checkpoints.load_config(run), {"model.num_layers": 4})
  with pytest.raises(checkpoints.IncompatibleCheckpointError,
                     match=r"checkpoint lacks: \['blocks/2/attn/wk_DKH'"):
    checkpointed.restore_params(open_readonly(run, deeper))


@pytest.mark.integration
def test_apply_overrides_copies_and_names_unknown_keys(run):
  config = checkpoints.load_config(run)
  changed = checkpoints.apply_overrides(config, {"eval.path": "/x", "metrics.far_lag": 16})
  assert changed.eval.path == "/x" and changed.metrics.far_lag == 16
  assert config.eval.path == "" and config.metrics.far_lag == 32
  with pytest.raises(checkpoints.AnalysisError, match="no key eval.pth"):
    checkpoints.apply_overrides(config, {"eval.pth": "/x"})
  with pytest.raises(checkpoints.AnalysisError, match="no section evl"):
    checkpoints.apply_overrides(config, {"evl.path": "/x"})


def test_invalid_config_json(tmp_path):
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(checkpoints.WorkdirError, match="config.json is not valid JSON"):
    checkpoints.load_config(str(tmp_path))


def _stored_value(workdir: str, step: int, key: str) -> tuple[str, int, int]:
  """(file, offset, length) of the bytes that hold `key` (e.g. "params.embed.embedding_VD/0.0")
  in checkpoint `step`'s state, from the OCDBT index orbax writes it with."""
  root = os.path.join(workdir, "checkpoints", str(step), "state")
  base = ts.KvStore.open(f"file://{root}/").result()
  version = ts.ocdbt.dump(base).result()["versions"][-1]
  assert version["root_height"] == 0, f"{root}: expected a one-node OCDBT index"
  entries = ts.ocdbt.dump(base, version["root"]["location"]).result()["entries"]
  location = {e["key"]: e.get("indirect_value") for e in entries}[key.encode()]
  assert location, f"{root}: {key} is stored inline, not in a data file"
  # "value:ocdbt.process_0/:d/<file>:<offset>:<length>"
  prefix, name, offset, length = location[len("value:"):].rsplit(":", 3)
  return os.path.join(root, prefix.rstrip("/"), name), int(offset), int(length)


EMBEDDING = "params.embed.embedding_VD/0.0"  # The largest params leaf, a chunk of its own.


def _orbax_alone(workdir: str, step: int, like) -> dict:
  """state.params as orbax restores them by itself, checking nothing."""
  target = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)}
  with ocp.PyTreeCheckpointer() as checkpointer:
    return checkpointer.restore(
        os.path.join(workdir, "checkpoints", str(step), "state"),
        args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True))["params"]


def flipped_copy(run: str, directory: str, step: int = 8) -> str:
  """A copy of `run` with one byte of checkpoint `step`'s embedding flipped on disk, where
  orbax alone reads it back without a word and with values changed."""
  workdir = os.path.join(directory, "flipped")
  shutil.copytree(run, workdir)
  path, offset, length = _stored_value(workdir, step, EMBEDDING)
  original = open(path, "rb").read()
  _, _, clean = checkpointed.restore_params(open_readonly(run), step)
  for fraction in (0.5, 0.3, 0.7):  # A byte of zstd's framing would fail to decode instead.
    data = bytearray(original)
    data[offset + int(length * fraction)] ^= 0x01
    open(path, "wb").write(bytes(data))
    try:
      plain = _orbax_alone(workdir, step, clean)
    except Exception:
      continue
    if not np.array_equal(plain["embed"]["embedding_VD"], clean["embed"]["embedding_VD"]):
      return workdir
  raise AssertionError(f"no flipped byte of {EMBEDDING} in {path} changed it silently")


FLIPPED_LEAF = ".params['embed']['embedding_VD']"  # How meta's checksums name it.


@pytest.fixture(scope="module")
def flipped(run, tmp_path_factory):
  return flipped_copy(run, str(tmp_path_factory.mktemp("flipped")))


@pytest.mark.integration
def test_a_flipped_byte_in_the_params_is_refused_naming_the_step_and_leaf(flipped):
  with pytest.raises(checkpoints.CorruptCheckpointError) as e:
    checkpointed.restore_params(open_readonly(flipped), step=8)
  assert str(e.value) == (
      f"checkpoint step 8 is corrupt: 1 leaves of {flipped}/checkpoints/8/state differ from the "
      f"checksums saved with them (first: {FLIPPED_LEAF}); other steps with a checkpoint: [4] "
      f"(--step=N picks one)")
  # Step 4 is untouched and still restores.
  assert checkpointed.restore_params(open_readonly(flipped), step=4)[0] == 4


def _copy(run, tmp_path) -> str:
  workdir = str(tmp_path / "copy")
  shutil.copytree(run, workdir)
  return workdir


@pytest.mark.integration
def test_a_truncated_state_is_refused_in_one_line(run, tmp_path):
  workdir = _copy(run, tmp_path)
  path, offset, length = _stored_value(workdir, 8, EMBEDDING)
  with open(path, "r+b") as f:
    f.truncate(offset + length // 2)  # The file ends halfway through the embedding.
  with pytest.raises(checkpoints.CorruptCheckpointError) as e:
    checkpointed.restore_params(open_readonly(workdir), step=8)
  message = str(e.value)
  assert "\n" not in message and len(message) < 600, message
  # The embedding, or a leaf stored after it in the same file, is the first read to fail.
  assert message.startswith("checkpoint step 8 cannot be read (OUT_OF_RANGE: Error reading "
                            "\"params."), message
  assert message.endswith("; other steps with a checkpoint: [4] (--step=N picks one)")


@pytest.mark.integration
def test_a_checkpoint_without_meta_restores_with_one_warning(run, tmp_path, caplog):
  workdir = _copy(run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "8", "meta"))  # As written before meta.
  _, _, params = checkpointed.restore_params(open_readonly(workdir), step=8)
  _, _, clean = checkpointed.restore_params(open_readonly(run), step=8)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(clean)):
    np.testing.assert_array_equal(a, b)
  assert caplog.text.count("predates checksums") == 1, caplog.text
  assert f"{workdir}/checkpoints/8 has no meta/" in caplog.text


def _analyze(workdir: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "launch/analyze.py", f"--workdir={workdir}",
                         "--lengths="], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO), timeout=300)


def _files(root: str) -> dict[str, int]:
  return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.integration
def test_analyze_refuses_a_flipped_checkpoint_in_one_line(flipped):
  before = _files(flipped)
  proc = _analyze(flipped)
  assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"analyze.py: checkpoint step 8 is corrupt: 1 leaves of {flipped}/checkpoints/8/state "
      f"differ from the checksums saved with them (first: {FLIPPED_LEAF});"), proc.stderr[-2000:]
  assert _files(flipped) == before  # Nothing written from a corrupt checkpoint.


@pytest.mark.integration
def test_analyze_without_the_state_item_says_so_in_one_line(run, tmp_path):
  workdir = _copy(run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "8", "state"))
  with pytest.raises(checkpoints.CorruptCheckpointError,
                     match=r"checkpoint step 8 has no state/ in .*/checkpoints/8: expected"):
    checkpointed.restore_params(open_readonly(workdir))
  proc = _analyze(workdir)
  assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"analyze.py: checkpoint step 8 has no state/ in {workdir}/checkpoints/8: expected the "
      f"orbax item 'state' (TrainState: step, params, opt_state) that launch/train.py saves in "
      f"every checkpoint; other steps with a checkpoint: [4] (--step=N picks one)")


# ---- beside a live trainer -----------------------------------------------------------------

def live_run(directory: str, steps=(1, 2)) -> str:
  """A workdir as a trainer leaves it between saves: config.json and finished checkpoints
  `steps`, written by orbax as run/checkpoint.py writes them (items state and meta, meta
  holding the state's checksums)."""
  config = tiny_config()
  workdir = os.path.join(directory, "live")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort())
  _, state = init_train_state(config.model, make_optimizer(config.train), seed=0)
  sums = {k: int(v) for k, v in jax.device_get(jax.jit(integrity.state_checksums)(state)).items()}
  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                             item_names=("state", "meta")) as manager:
    for step in steps:
      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 meta=ocp.args.JsonSave({"checksums": sums})))
      manager.wait_until_finished()
  return workdir


def unfinished_copy(workdir: str, of: int, step: int, name: str | None = None) -> str:
  """Step `of` copied as step `step` the trainer has not finished: no commit marker and half
  its state (its OCDBT manifest not yet written), under `name` (default the step's own: a save
  in place, as on gs://; orbax's tmp name for a local save in flight)."""
  checkpoints_dir = os.path.join(workdir, "checkpoints")
  target = os.path.join(checkpoints_dir, name or str(step))
  shutil.copytree(os.path.join(checkpoints_dir, str(of)), target)
  for marker in glob.glob(os.path.join(target, "**", integrity.COMMIT_MARKER), recursive=True):
    os.remove(marker)
  os.remove(os.path.join(target, "state", "manifest.ocdbt"))
  return target


@pytest.fixture(scope="module")
def live(tmp_path_factory):
  return live_run(str(tmp_path_factory.mktemp("live")))


def _reader_copy(live, tmp_path) -> str:
  workdir = str(tmp_path / "reader")
  shutil.copytree(live, workdir)
  return workdir


TMP_NAME = f"3{ocp.path.atomicity_types.TMP_DIR_SUFFIX}-1733000000"  # orbax's, for step 3.


@pytest.mark.parametrize("name", [None, TMP_NAME])
def test_a_step_being_written_is_passed_over_for_the_newest_finished(live, tmp_path, caplog,
                                                                     name):
  workdir = _reader_copy(live, tmp_path)
  unfinished_copy(workdir, of=2, step=3, name=name)
  config = checkpoints.load_config(workdir)
  assert checkpoints.available_steps(workdir, config) == [1, 2]
  step, _, params = checkpointed.restore_params(open_readonly(workdir, config))
  assert step == 2 and jax.tree.leaves(params)
  assert caplog.text.count("step 3 is being written; reading step 2") == 1, caplog.text


def test_a_step_being_written_asked_for_by_number_is_refused_naming_the_finished_ones(
    live, tmp_path):
  workdir = _reader_copy(live, tmp_path)
  unfinished_copy(workdir, of=2, step=3)
  config = checkpoints.load_config(workdir)
  with pytest.raises(checkpoints.StepNotFoundError) as e:
    checkpointed.restore_params(open_readonly(workdir, config), step=3)
  assert str(e.value) == (
      f"step 3 is being written in {workdir}/checkpoints (it has no commit_success.txt yet); "
      f"rerun when it is finished, or pick a finished step: [1, 2]")
  # The advice, followed.
  assert checkpointed.restore_params(open_readonly(workdir, config), step=2)[0] == 2


def test_a_first_save_still_being_written_says_so(live, tmp_path):
  workdir = _reader_copy(live, tmp_path)
  unfinished_copy(workdir, of=2, step=3, name=TMP_NAME)
  for step in ("1", "2"):  # Step 3 is the run's first save.
    shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  with pytest.raises(checkpoints.WorkdirError, match=(
      r"no checkpoints in .*/checkpoints \(workdir .*\): step 3 is being written; rerun when it "
      r"is finished$")):
    checkpointed.restore_params(open_readonly(workdir))


def test_the_newest_step_removed_while_read_gives_way_to_the_newest_finished(live, tmp_path,
                                                                            monkeypatch, caplog):
  """The trainer commits step 3 and its checkpoint.keep deletes step 2 while step 2 is read."""
  workdir = _reader_copy(live, tmp_path)
  checkpoints_dir = os.path.join(workdir, "checkpoints")
  real, reads = checkpoints._restore_step, []

  def trainer_meanwhile(workdir_, config, wanted, step, others):
    reads.append(step)
    if len(reads) == 1:
      shutil.copytree(os.path.join(checkpoints_dir, "2"), os.path.join(checkpoints_dir, "3"))
      shutil.rmtree(os.path.join(checkpoints_dir, "2", "state"))  # Deleted file by file.
    return real(workdir_, config, wanted, step, others)

  monkeypatch.setattr(checkpoints, "_restore_step", trainer_meanwhile)
  step, _, _ = checkpointed.restore_params(open_readonly(workdir))
  assert (step, reads) == (3, [2, 3])
  assert "step 2 was removed or replaced by the trainer while being read; reading step 3" in \
      caplog.text



@pytest.mark.parametrize("asked", [None, 2])
def test_a_step_deleted_under_the_read_is_not_said_to_predate_checksums(live, tmp_path,
                                                                        monkeypatch, caplog,
                                                                        asked):
  """The trainer commits step 3 and deletes step 2 file by file, meta/ and the commit marker
  first, while step 2's state is read: no "predates checksums"; the newest step is read
  instead, or step 2, asked for by number, is said to have been deleted."""
  workdir = _reader_copy(live, tmp_path)
  checkpoints_dir = os.path.join(workdir, "checkpoints")
  real = checkpoints._saved_checksums

  def trainer_meanwhile(step, step_dir, where, others):
    if step == 2 and not os.path.exists(os.path.join(checkpoints_dir, "3")):
      shutil.copytree(os.path.join(checkpoints_dir, "2"), os.path.join(checkpoints_dir, "3"))
      shutil.rmtree(os.path.join(checkpoints_dir, "2", "meta"))
      os.remove(os.path.join(checkpoints_dir, "2", integrity.COMMIT_MARKER))
    return real(step, step_dir, where, others)

  monkeypatch.setattr(checkpoints, "_saved_checksums", trainer_meanwhile)
  config = checkpoints.load_config(workdir)
  if asked is None:
    assert checkpointed.restore_params(open_readonly(workdir, config))[0] == 3
    assert "step 2 was removed or replaced by the trainer while being read; reading step 3" in \
        caplog.text
  else:
    with pytest.raises(checkpoints.CorruptCheckpointError,
                       match=r"^checkpoint step 2 was deleted while being read \("):
      checkpointed.restore_params(open_readonly(workdir, config), step=asked)
  assert "predates checksums" not in caplog.text, caplog.text

def test_a_bad_newest_step_nothing_changed_under_is_refused(live, tmp_path):
  """No trainer is live: the newest step's own fault is reported, not read around."""
  workdir = _reader_copy(live, tmp_path)
  os.remove(os.path.join(workdir, "checkpoints", "2", "state", "manifest.ocdbt"))
  with pytest.raises(checkpoints.CorruptCheckpointError,
                     match=r"^checkpoint step 2 cannot be read \(.*other steps with a "
                           r"checkpoint: \[1\] \(--step=N picks one\)"):
    checkpointed.restore_params(open_readonly(workdir))


@pytest.mark.integration
def test_readers_beside_a_real_trainer_saving_every_step(tmp_path):
  """launch/train.py saving every step (checkpoint.keep=2), and restore_params reading its
  newest step again and again meanwhile: every read succeeds."""
  workdir = str(tmp_path / "run")
  trainer = subprocess.Popen(
      [sys.executable, "launch/train.py", "--config=configs/demo.py", f"--workdir={workdir}",
       *tiny_flags(train__steps=400, checkpoint__every_steps=1, checkpoint__keep=2,
                   eval__every_steps=10**6, metrics__every_steps=10**6)],
      cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  try:
    deadline, reads = time.time() + 240, []
    while time.time() < deadline and trainer.poll() is None and len(reads) < 30:
      if not integrity.list_steps(os.path.join(workdir, "checkpoints")).finished:
        time.sleep(0.5)  # Before the first save commits.
        continue
      reads.append(checkpointed.restore_params(open_readonly(workdir))[0])
  finally:
    trainer.kill()
    trainer.wait()
  assert len(reads) >= 10, (reads, trainer.stderr.read()[-2000:])


@pytest.mark.integration
def test_analyze_refuses_a_flipped_opt_state_index_byte_in_one_line_without_noise(live, tmp_path):
  """A byte flipped among the optimizer-state entries of the OCDBT index (state/d/<node>):
  the failing reads' callbacks print "Event loop is closed" tracebacks from tensorstore's
  threads in most fresh processes (4 of 5 before they were held back); the refusal is the
  one line, with the noise in the file it names."""
  workdir = _reader_copy(live, tmp_path)
  nodes = glob.glob(os.path.join(workdir, "checkpoints", "2", "state", "d", "*"))
  data = bytearray(open(nodes[0], "rb").read())
  data[int(len(data) * 0.3)] ^= 0x01  # The entries are sorted: opt_state.* come first.
  open(nodes[0], "wb").write(bytes(data))
  for _ in range(5):
    proc = _analyze(workdir)
    assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
    assert "Event loop is closed" not in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "analyze.py: checkpoint step 2 cannot be read ("), proc.stderr[-2000:]
