"""hybrid_nope/run/checkpoint_integrity.py: the keys a params leaf has in meta's checksums, the
comparison of saved and computed checksums, the one-line messages every reader gives, which
steps a reader beside a live trainer counts as finished, and a read's noise held back."""
import logging as std_logging
import os
import sys
import threading

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hybrid_nope.run import checkpoint_integrity as integrity
from hybrid_nope.errors import UserError
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import init_train_state
from tests.helpers import tiny_config


def test_params_checksums_are_the_train_states_own_for_its_params():
  config = tiny_config()
  _, state = init_train_state(config.model, make_optimizer(config.train), seed=0)
  whole = jax.device_get(jax.jit(integrity.state_checksums)(state))
  params = jax.device_get(jax.jit(integrity.params_checksums)(state.params))
  assert ".params['blocks'][0]['attn']['wq_DNH']" in params
  assert params == {k: v for k, v in whole.items() if k.startswith(".params")}
  assert len(params) == len(jax.tree.leaves(state.params))
  # Not just the keys: each value is that leaf's own checksum.
  assert int(params[".params['embed']['embedding_VD']"]) == int(
      integrity.leaf_checksum(state.params["embed"]["embedding_VD"]))


def test_differing_leaves_lists_computed_keys_saved_differently_or_not_at_all():
  saved = {"a": 1, "b": 2, "c": 3, "opt": 9}  # "opt": saved, not read, so not compared.
  computed = {"c": np.uint32(4), "a": np.uint32(1), "b": 2, "new": 5}
  assert integrity.differing_leaves(saved, computed) == ["c", "new"]
  assert integrity.differing_leaves(saved, {"a": 1, "b": np.uint32(2)}) == []


def test_corrupt_message_names_the_step_its_state_the_count_and_the_first_leaf():
  message = integrity.corrupt_message(8, "/run/checkpoints/8", [".params['w']", ".step"])
  assert message == ("checkpoint step 8 is corrupt: 2 leaves of /run/checkpoints/8/state "
                     "differ from the checksums saved with them (first: .params['w'])")


def _chained(*messages):
  """An exception whose __cause__ chain holds `messages`, outermost first."""
  error = None
  for text in reversed(messages):
    try:
      raise ValueError(text) from error
    except ValueError as e:
      error = e
  return error


def test_read_error_finds_tensorstore_status_under_pages_of_spec():
  spec = "Error opening {\n" + "  \"driver\": \"zarr3\",\n" * 200 + "}"
  inner = ('OUT_OF_RANGE: Error reading "params.w/0.0" in OCDBT database: Requested byte range '
           '[10, 20) is not valid for value of size 15\nmore spec')
  line = integrity.read_error(_chained(spec, "outer wrapper", inner), "/ckpt/8/state")
  assert line == inner.splitlines()[0]
  # No status anywhere: the outermost message's first line, after where it was read.
  assert integrity.read_error(_chained("bad header\nrest", "cause"), "/c/8/state") == (
      "/c/8/state: bad header")
  assert integrity.read_error(RuntimeError(), "/c/8/state") == "/c/8/state: RuntimeError"
  assert integrity.unreadable_message(3, _chained(spec, inner), "/c/3/state") == (
      f"checkpoint step 3 cannot be read ({inner.splitlines()[0]})")


def _step_dirs(root, **steps):
  """Step directories under `root`: name -> whether it holds orbax's commit marker."""
  for name, marked in steps.items():
    os.makedirs(root / name)
    if marked:
      (root / name / integrity.COMMIT_MARKER).write_text("")


def test_list_steps_counts_committed_steps_as_finished_and_the_rest_as_unfinished(tmp_path):
  tmp = f"5{ocp.path.atomicity_types.TMP_DIR_SUFFIX}-1733"
  _step_dirs(tmp_path, **{"2": True, "3": False, "4": True, tmp: False, "rolled_back": False})
  (tmp_path / "owner.json").write_text("{}")
  listing = integrity.list_steps(str(tmp_path))
  assert listing == integrity.StepListing(finished=(2, 4), unfinished=(3, 5))
  assert integrity.being_written_message(listing, 4) == "step 5 is being written; reading step 4"
  assert integrity.being_written_message(integrity.StepListing((2, 4), (3,)), 4) is None
  assert integrity.list_steps(str(tmp_path / "absent")) == integrity.StepListing((), ())


def test_list_steps_reads_a_local_directory_from_before_commit_markers_as_finished(tmp_path):
  _step_dirs(tmp_path, **{"4": False, "8": False,
                          f"9{ocp.path.atomicity_types.TMP_DIR_SUFFIX}": False})
  assert integrity.list_steps(str(tmp_path)) == integrity.StepListing((4, 8), (9,))


class _Refused(UserError):
  pass


def _noisy_read(fail):
  """A read whose other threads print tracebacks meanwhile, as tensorstore's callbacks into
  orbax's closed event loop do; it raises `fail` if given."""
  def noise():
    for _ in range(9):
      print("Traceback (most recent call last):\nRuntimeError: Event loop is closed",
            file=sys.stderr)
    std_logging.getLogger("asyncio").error("Task exception was never retrieved")

  def read():
    thread = threading.Thread(target=noise)
    thread.start()
    thread.join()
    if fail:
      raise fail
    return "restored"
  return read


@pytest.mark.parametrize("fail", [OSError("DATA_LOSS: bad block"), _Refused("step 8 is bad")])
def test_read_quietly_refuses_in_one_line_with_the_threads_noise_in_a_file(fail, capfd, caplog):
  with pytest.raises(UserError) as e:
    integrity.read_quietly(_noisy_read(fail), lambda error: _Refused(f"cannot read: {error}"))
  message = str(e.value)
  assert type(e.value) is _Refused and "\n" not in message
  first, log = message.split(" (what orbax's threads printed: ")
  assert first == ("cannot read: DATA_LOSS: bad block" if isinstance(fail, OSError) else
                   "step 8 is bad")
  text = open(log.rstrip(")")).read()
  assert text.count("Event loop is closed") == 9 and "Task exception was never retrieved" in text
  assert "Event loop is closed" not in capfd.readouterr().err
  assert "never retrieved" not in caplog.text


def test_read_quietly_passes_a_good_reads_output_on(capsys):
  assert integrity.read_quietly(_noisy_read(None), _Refused) == "restored"
  assert capsys.readouterr().err.count("Event loop is closed") == 9
