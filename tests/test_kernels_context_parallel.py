# Tiers (pytest.ini): integration (8 simulated devices in a subprocess), so `make test-all` only.
"""kernels/context_parallel.py: attention, gated linear attention and the delta rule with the
sequence split over 4 devices (data 2 x sequence 4) give one device's values and gradients,
with documents crossing shard edges (the recurrent layers' state carried across them)."""
import pytest

from tests.helpers import run_8_devices

pytestmark = pytest.mark.integration


def test_sequence_split_attention_matches_one_device_across_shard_edges():
  out = run_8_devices("tests.scripts.context_parallel_runs")
  assert out["crossings"] > 0  # Documents do cross the shard edges.
  for window in (2, 37, 64, None):  # Halo of 1, of a partial shard, of a whole shard; global.
    assert max(out[f"w{window}"]) < 2e-6, (window, out[f"w{window}"])
  assert "needs 65 keys from the previous shard" in out["too_wide"]
  # The recurrent layers through the public kernels on the mesh: value, then each input's grad.
  for case in ("gla", "delta_gqa_head_gate", "delta_gva_channel_gate"):
    assert max(out[case]) < 5e-6, (case, out[case])
