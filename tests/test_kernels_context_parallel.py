# Tiers (pytest.ini): integration (8 simulated devices in a subprocess), so `make test-all` only.
"""kernels/context_parallel.py: attention with the sequence split over 4 devices (data 2 x
sequence 4) gives one device's values and gradients, with documents crossing shard edges."""
import pytest

from tests.helpers import run_8_devices

pytestmark = pytest.mark.integration


def test_sequence_split_attention_matches_one_device_across_shard_edges():
  out = run_8_devices("tests.scripts.context_parallel_runs")
  assert out["crossings"] > 0  # Documents do cross the shard edges.
  for window in (2, 37, 64, None):  # Halo of 1, of a partial shard, of a whole shard; global.
    assert max(out[f"w{window}"]) < 2e-6, (window, out[f"w{window}"])
  assert "needs 65 keys from the previous shard" in out["too_wide"]
