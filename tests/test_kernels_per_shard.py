# Tiers (pytest.ini): the whole module is integration (8 simulated devices in a subprocess),
# so `make test-all` only.
# test-all only: kernels.attention under shard_map over batch and heads gives one device's
# values and gradients, stays whole when the tensor axis splits nothing, and names an unknown
# axis (test_per_shard_matches_one_device_and_falls_back_when_an_axis_is_unused).
"""kernels.attention per shard (shard_map over batch and heads) on 8 simulated devices."""
import pytest

from tests.helpers import run_8_devices

pytestmark = pytest.mark.integration


def test_per_shard_matches_one_device_and_falls_back_when_an_axis_is_unused():
  out = run_8_devices("tests.scripts.per_shard_runs")
  for window in (37, None):
    split = out[f"split_w{window}"]
    assert split["shard_map"], "batch over data x fsdp, heads over tensor: expected shard_map"
    # Value, dq, dk, dv: each device computes its own rows and heads, nothing is summed twice.
    assert max(split["errors"]) < 1e-6, split
    unused = out[f"tensor_unused_w{window}"]
    assert not unused["shard_map"], "tensor splits nothing here: the call must stay whole"
    assert max(unused["errors"]) < 1e-6, unused
  assert "['rows']" in out["unknown_axis"] and "not axes of the mesh" in out["unknown_axis"]
