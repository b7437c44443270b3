"""memory_fit: one device's memory (what XLA reports, else the datasheet by device_kind, else on
CPU the host's available RAM), and the cheapest change of the config keys that brings an
estimate under it, named as flags. The dry run on the paper config is test_train_dry_run.py's."""
import dataclasses

import pytest

from hybrid_nope.train import memory_fit
from hybrid_nope.train.memory_fit import GIB
from tests.helpers import tiny_config

ONE_DEVICE = {"data": 1, "fsdp": 1, "sequence": 1, "tensor": 1}


@dataclasses.dataclass
class FakeDevice:
  device_kind: str
  platform: str = "tpu"
  stats: dict | None = None

  def memory_stats(self):
    return self.stats


@pytest.mark.parametrize("kind, expected", [
    ("TPU v5 lite", 16 * GIB), ("TPU v5p", 95 * GIB), ("TPU v5", 95 * GIB),
    ("TPU v4", 32 * GIB), ("NVIDIA H100 80GB HBM3", 80e9)])
def test_the_datasheet_figure_is_the_longest_device_kind_that_matches(kind, expected):
  assert memory_fit.device_memory(FakeDevice(kind)) == (expected, f"the {kind}'s HBM (datasheet)")


def test_what_xla_reports_comes_before_the_datasheet():
  memory, what = memory_fit.device_memory(FakeDevice("TPU v4", stats={"bytes_limit": 30 * GIB}))
  assert memory == 30 * GIB and "memory_stats bytes_limit" in what


def test_a_cpu_has_the_hosts_available_ram_and_an_unknown_chip_none(monkeypatch):
  monkeypatch.setattr(memory_fit, "_available_ram", lambda: (12 * GIB, "/proc/meminfo"))
  memory, what = memory_fit.device_memory(FakeDevice("cpu", platform="cpu"))
  assert memory == 12 * GIB and what == "the available RAM of this host (/proc/meminfo)"
  memory, what = memory_fit.device_memory(FakeDevice("TPU v9 future"))
  assert memory is None and "device_kind='TPU v9 future'" in what and "HBM_BYTES" in what


def test_the_available_ram_is_read_from_this_host():
  available, source = memory_fit._available_ram()  # pylint: disable=protected-access
  assert 0 < available and source


def model_total(state, per_row, remat_factor=0.25):
  """A stand-in for the dry run's estimate: the state over fsdp, and per_row bytes for each row
  of a microbatch (a quarter of them with remat)."""
  def total(c, shape):
    rows = c.data.batch_size / (shape["data"] * shape["fsdp"]) / c.train.grad_accum_steps
    return state / shape["fsdp"] + rows * per_row * (remat_factor if c.model.remat else 1)
  return total


def test_the_plan_takes_accumulation_before_remat_before_chips():
  c = tiny_config(data__batch_size=16, model__loss_block=16)
  total = model_total(state=1 * GIB, per_row=1 * GIB)
  # 16 rows: 17 GiB. Within 5 GiB: 4 microbatches of 4 rows, no remat and one chip.
  found = memory_fit.plan(c, ONE_DEVICE, total, 5 * GIB)
  assert found.changes == {"train.grad_accum_steps": 4} and found.devices == 1
  assert found.flags() == "--config.train.grad_accum_steps=4" and found.bytes == 5 * GIB
  # Within 1.5 GiB: one row per microbatch is 2 GiB; with remat 2 rows are.
  found = memory_fit.plan(c, ONE_DEVICE, total, 1.5 * GIB)
  assert found.changes == {"model.remat": True, "train.grad_accum_steps": 8}
  # Within 0.6 GiB the state must split: over 4 chips, the batch split over them too.
  found = memory_fit.plan(c, ONE_DEVICE, total, 0.6 * GIB)
  assert found.changes == {"model.remat": True, "train.grad_accum_steps": 4, "mesh.fsdp": 4}
  assert found.devices == 4 and found.bytes == 0.5 * GIB
  assert total(memory_fit.changed(c, found.changes), {**ONE_DEVICE, "fsdp": 4}) == 0.5 * GIB
  # A state too large alone, small activations: more chips alone.
  found = memory_fit.plan(c, ONE_DEVICE, model_total(1 * GIB, 0.01 * GIB), 0.6 * GIB)
  assert found.changes == {"mesh.fsdp": 2} and found.devices == 2


def test_the_plan_blocks_the_loss_where_it_is_whole_and_gives_up_past_max_fsdp():
  c = tiny_config(data__batch_size=4, model__loss_block=0, data__seq_len=4096)
  logits = lambda c, shape: 8 * GIB if not c.model.loss_block else 1 * GIB
  found = memory_fit.plan(c, ONE_DEVICE, logits, 5 * GIB)
  assert found.changes == {"model.loss_block": memory_fit.LOSS_BLOCK}
  c.data.seq_len = 64  # Blocks of half a row.
  assert memory_fit.plan(c, ONE_DEVICE, logits, 5 * GIB).changes == {"model.loss_block": 32}
  # Not named where it does not help.
  assert memory_fit.plan(c, ONE_DEVICE, model_total(1 * GIB, 1 * GIB), 3 * GIB).changes == {
      "train.grad_accum_steps": 2}
  assert memory_fit.plan(c, ONE_DEVICE, lambda c, shape: 1e30, 5 * GIB) is None


def test_the_verdict_is_one_line_naming_every_key_and_the_flags_that_fit(monkeypatch):
  monkeypatch.setattr(memory_fit, "_available_ram", lambda: (5 * GIB, "test"))
  c = tiny_config(data__batch_size=16, model__loss_block=64)
  fits, line = memory_fit.verdict(c, ONE_DEVICE, model_total(1 * GIB, 1 * GIB),
                                  FakeDevice("cpu", platform="cpu"))
  assert fits is False and "\n" not in line
  assert line.startswith("does not fit: 17.00 GiB per device (estimate) against 5.00 GiB, the "
                         "available RAM of this host (test); it fits with "
                         "--config.train.grad_accum_steps=4 (5.00 GiB per device); ")
  for key in ("mesh.fsdp (more chips", "model.remat", "model.loss_block (the blocked loss; now "
              "64)", "train.grad_accum_steps"):
    assert key in line
  fits, line = memory_fit.verdict(c, ONE_DEVICE, lambda c, shape: 1 * GIB,
                                  FakeDevice("cpu", platform="cpu"))
  assert fits and line.startswith("fits: 1.00 GiB per device (estimate) against 5.00 GiB")
  fits, line = memory_fit.verdict(c, ONE_DEVICE, lambda c, shape: 1 * GIB, FakeDevice("TPU v9"))
  assert fits is None and line.startswith("memory not compared: no memory figure")
