"""hybrid_nope/checkpoint_integrity.py: the keys a params leaf has in meta's checksums, the
comparison of saved and computed checksums, and the one-line messages every reader gives."""
import jax
import numpy as np

from hybrid_nope import checkpoint_integrity as integrity
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
