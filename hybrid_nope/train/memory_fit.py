"""Does a run fit its devices' memory? What one device has (`device_memory`), and the config
changes that would bring `--dry_run`'s estimate per device under it (`plan`, `verdict`).

The levers (`levers`), cheapest first: the blocked loss (model.loss_block: no [B, T, V]
logits), gradient accumulation (train.grad_accum_steps: fewer rows per microbatch),
rematerialisation (model.remat: a third more compute, only each pattern repeat's input kept),
and more chips (mesh.fsdp: the state and the batch sharded over them).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import jax

GIB = 2**30
# Memory of one device as jax sees it (a chip; a TensorCore on v2 and v3), from vendor
# datasheets; keyed by a substring of device_kind, the longest that matches. Where the backend
# reports memory_stats()["bytes_limit"] (TPU and GPU do) that is used instead: what XLA may
# allocate there (on GPU, XLA_PYTHON_CLIENT_MEM_FRACTION of the card).
HBM_BYTES = {
    "TPU v2": 8 * GIB, "TPU v3": 16 * GIB, "TPU v4": 32 * GIB, "TPU v5 lite": 16 * GIB,
    "TPU v5e": 16 * GIB, "TPU v5p": 95 * GIB, "TPU v5": 95 * GIB, "TPU v6 lite": 32 * GIB,
    "TPU v6e": 32 * GIB, "TPU7x": 192 * GIB,
    "H200": 141e9, "H100": 80e9, "A100": 40e9,  # A100: the smaller of its two cards.
}
LOSS_BLOCK = 1024  # The most model.loss_block a plan sets where it is 0 (configs/base.py's).
MAX_FSDP = 4096  # The most chips a plan names.


def levers(config, mesh_shape: dict) -> str:
  """The config keys that reduce memory per device, each with its value where already used."""
  m, accum, fsdp = config.model, config.train.grad_accum_steps, mesh_shape["fsdp"]
  notes = {"mesh.fsdp": ["more chips: the state and the batch sharded over them"]
                        + [f"now {fsdp}"] * (fsdp > 1),
           "model.remat": ["now True"] * bool(m.remat),
           "model.loss_block": ["the blocked loss"] + [f"now {m.loss_block}"] * bool(m.loss_block),
           "train.grad_accum_steps": [f"now {accum}"] * (accum > 1)}
  return ", ".join(key + (f" ({'; '.join(note)})" if note else "") for key, note in notes.items())


def _available_ram() -> tuple[int, str]:
  """(bytes, where from): the host's available memory, under its cgroup's limit if lower."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    available, source = info["MemAvailable"], "/proc/meminfo MemAvailable"
  except (OSError, KeyError, ValueError, IndexError):
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    source = "free pages"
  try:
    with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
      limit = f.read().strip()
    with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
      used = int(f.read())
    if limit != "max" and int(limit) - used < available:
      available, source = int(limit) - used, "the cgroup's memory.max less memory.current"
  except (OSError, ValueError):
    pass
  return available, source


def device_memory(device=None) -> tuple[float | None, str]:
  """(bytes one device may use, what the figure is); None where nothing says (an unknown
  accelerator without memory_stats)."""
  device = device or jax.devices()[0]
  kind = device.device_kind
  try:
    limit = (device.memory_stats() or {}).get("bytes_limit")
  except Exception:  # pylint: disable=broad-except  # Backends without memory_stats raise.
    limit = None
  if limit:
    return float(limit), f"what XLA may allocate on the {kind} (memory_stats bytes_limit)"
  for name in sorted(HBM_BYTES, key=len, reverse=True):
    if name in kind:
      return float(HBM_BYTES[name]), f"the {kind}'s HBM (datasheet)"
  if device.platform == "cpu":
    available, source = _available_ram()
    devices = jax.local_device_count()
    shared = f", shared by {devices} host devices" if devices > 1 else ""
    return available / devices, f"the available RAM of this host ({source}{shared})"
  return None, (f"no memory figure for device_kind={kind!r} (memory_stats gives none; add it "
                "to hybrid_nope/train/memory_fit.py's HBM_BYTES)")


@dataclasses.dataclass
class Plan:
  changes: dict  # config key -> value
  devices: int
  bytes: float

  def flags(self) -> str:
    return " ".join(f"--config.{k}={v}" for k, v in self.changes.items())


def _accum_steps(config, batch_shards: int) -> list[int]:
  """Valid train.grad_accum_steps from the config's up: each microbatch splits over the data
  and fsdp shards (validate.check_divisibility)."""
  batch = config.data.batch_size
  return [k for k in range(config.train.grad_accum_steps, batch + 1)
          if batch % k == 0 and (batch // k) % batch_shards == 0]


def _fsdp_sizes(config, mesh_shape: dict) -> list[int]:
  """mesh.fsdp from the current one up, doubling: those that split d_model and the batch."""
  sizes, n = [], mesh_shape["fsdp"]
  while n <= MAX_FSDP:
    if config.model.d_model % n == 0 and config.data.batch_size % (mesh_shape["data"] * n) == 0:
      sizes.append(n)
    n *= 2
  return sizes


def changed(config, changes: dict):
  """A copy of `config` with `changes` (key -> value) set."""
  out = config.copy_and_resolve_references()
  for key, value in changes.items():
    section, name = key.split(".")
    out[section][name] = value
  return out


def plan(config, mesh_shape: dict, total: Callable[[object, dict], float],
         available: float) -> Plan | None:
  """The first change of the config (in LEVERS' order of cost: the blocked loss, then the
  fewest microbatches, without remat before with it, on the fewest chips) whose `total(config,
  mesh_shape)` bytes per device fit in `available`; None if none does. {} where it fits."""
  base = {}
  if not config.model.loss_block:  # Blocks of half a row at most, taken where they help.
    block = {"model.loss_block": min(LOSS_BLOCK, max(1, config.data.seq_len // 2))}
    if total(changed(config, block), mesh_shape) < total(config, mesh_shape):
      base = block
  remats = [False, True] if not config.model.remat else [True]
  devices = math.prod(mesh_shape.values())
  for fsdp in _fsdp_sizes(config, mesh_shape):
    shape = {**mesh_shape, "fsdp": fsdp}
    for remat in remats:
      for k in _accum_steps(config, mesh_shape["data"] * fsdp):
        changes = {**base, "model.remat": remat, "train.grad_accum_steps": k, "mesh.fsdp": fsdp}
        bytes_ = total(changed(config, changes), shape)
        if bytes_ <= available:
          current = {"model.remat": config.model.remat,
                     "train.grad_accum_steps": config.train.grad_accum_steps,
                     "mesh.fsdp": mesh_shape["fsdp"]}
          return Plan({k: v for k, v in changes.items() if current.get(k) != v},
                      devices * fsdp // mesh_shape["fsdp"], bytes_)
  return None


def verdict(config, mesh_shape: dict, total: Callable[[object, dict], float],
            device=None) -> tuple[bool | None, str]:
  """(fits: True, False or None where the device's memory is unknown, the line that says so
  and, where it does not fit, which keys would make it)."""
  estimate = total(config, mesh_shape)
  available, what = device_memory(device)
  if available is None:
    return None, f"memory not compared: {what}"
  against = (f"{estimate / GIB:.2f} GiB per device (estimate) against {available / GIB:.2f} "
             f"GiB, {what}")
  if estimate <= available:
    return True, f"fits: {against}"
  found = plan(config, mesh_shape, total, available)
  if found is None:
    advice = f"no mix of these keys fits it, up to mesh.fsdp={MAX_FSDP}"
  else:
    more = found.devices > math.prod(mesh_shape.values())
    advice = (f"it fits with {found.flags()}{f' on {found.devices} devices' * more} "
              f"({found.bytes / GIB:.2f} GiB per device)")
  return False, (f"does not fit: {against}; {advice}; what reduces it: "
                 f"{levers(config, mesh_shape)}")
