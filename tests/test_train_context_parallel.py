# Tiers (pytest.ini): integration (8 simulated devices in a subprocess), so `make test-all` only.
# The trainer's run on data 2 × sequence 4 (losses and recency profiles equal one device's) is
# a mesh of tests/test_train_sharding.py::test_same_losses_and_recency_on_every_mesh; the
# config checks of mesh.sequence are in that file's `make test` tier.
"""Context parallelism in the model: a row's tokens split over 4 devices (mesh.sequence) give one
device's loss and gradients for every layer kind, with documents crossing the shard edges."""
import pytest

from tests.helpers import run_8_devices

pytestmark = pytest.mark.integration


def test_every_layer_kind_gives_one_devices_loss_and_gradients_across_shard_edges():
  out = run_8_devices("tests.scripts.sequence_runs")
  assert out["mesh"] == {"data": 2, "fsdp": 1, "sequence": 4, "tensor": 1}
  assert out["inputs_split"] == "P(('data', 'fsdp'), 'sequence')"
  assert out["crossings"] >= 10  # Documents continue across the shard edges of most rows.
  assert out["collective_permutes"] > 0 and out["all_gathers"] > 0  # The shards do talk.
  assert abs(out["loss"] - out["want_loss"]) <= 1e-6 * abs(out["want_loss"])
  worst = max(out["grad_errors"].values())
  assert worst < 1e-4, sorted(out["grad_errors"].items(), key=lambda kv: -kv[1])[:5]
  # The comparison catches what context parallelism must get right: without the halo the S
  # layer's gradients, without the carried state the L and D layers', are wrong at O(1).
  for mutant, layer in (("no_halo", "['blocks'][0]"), ("no_carried_state", "['blocks'][2]"),
                        ("no_carried_state", "['blocks'][3]")):
    assert max(e for name, e in out[mutant].items() if name.startswith(layer)) > 0.1, mutant
