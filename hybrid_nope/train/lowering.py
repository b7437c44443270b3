"""The full train step (forward, backward, optimizer) lowered with jax.export for TPU or CUDA on a
machine without that hardware, to show the accelerator paths lower before a job is submitted.

The step is the one `loop.train` jits, on the config's mesh (simulated with host devices when it
spans more than one), with the attention kernels chosen for the target platform
(`kernels.target_platform`). Nothing is compiled or allocated: state and batch are abstract.
"""
from __future__ import annotations

import collections
import re

import jax
from jax import export

from hybrid_nope import kernels
from hybrid_nope.data.pipeline import loader
from hybrid_nope.train import sharding
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import abstract_train_state
from hybrid_nope.train.step import train_step_for
from hybrid_nope.errors import ConfigError
from hybrid_nope.validate import validate

PLATFORMS = ("tpu", "cuda", "cpu")
# Custom calls of our kernels: no compatibility guarantee across jax versions, which is why
# jax.export refuses them unless told. The module is checked here, never stored.
KERNEL_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}


def lower_train_step(config, platform: str) -> export.Exported:
  """jax.export of the train step for `platform` on the config's mesh over this process's
  devices. Raises whatever the lowering raises: that is the check."""
  if platform not in PLATFORMS:
    raise ConfigError(f"--platform={platform}: expected one of {', '.join(PLATFORMS)}")
  validate(config, check_paths=False)  # The data is not read: only shapes matter.
  mesh = sharding.make_mesh(config)
  tx = make_optimizer(config.train)
  with sharding.activation_rules(mesh), kernels.target_platform(platform):
    model_def, state, state_shardings = abstract_train_state(config.model, tx,
                                                             config.train.seed, mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct((config.data.batch_size, config.data.seq_len),
                                     loader.BATCH_DTYPES[k], sharding=batch_sharding)
             for k in loader.BATCH_KEYS}
    step = jax.jit(train_step_for(config, model_def, tx),
                   in_shardings=(state_shardings, {k: batch_sharding for k in batch}),
                   out_shardings=(state_shardings, sharding.replicated(mesh)),
                   donate_argnums=0)
    checks = ([export.DisabledSafetyCheck.custom_call(KERNEL_CALLS[platform])]
              if platform in KERNEL_CALLS else [])
    return export.export(step, platforms=[platform], disabled_checks=checks)(state, batch)


def kernels_in(module_text: str) -> dict[str, int]:
  """{custom-call target: count} and {kernel name: count} of a StableHLO module's text; the
  kernel names are those Pallas gives its calls (splash_mha_fwd…, swa_flash_dq…, gla_chunk_fwd,
  delta_chunk_fwd…). Layers that trace to the same function share it, so counts are of distinct
  call sites in the text."""
  calls = collections.Counter(re.findall(r"custom_call @([\w$.]+)\(", module_text))
  names = collections.Counter(re.findall(
      r'(?:kernel_name|(?<!\w)name) = "((?:splash|swa_flash|gla_chunk|delta_chunk)\w*)"',
      module_text))
  return {"custom_calls": dict(calls), "kernels": dict(names)}


def describe(config, platform: str) -> dict:
  """What launch/lower.py prints: the mesh, the module's size and the attention kernels in it."""
  exported = lower_train_step(config, platform)
  text = exported.mlir_module()
  mesh = sharding.make_mesh(config)
  return {"platform": platform, "mesh": dict(mesh.shape), "devices": mesh.size,
          "module_text_bytes": len(text), "serialized_bytes": len(exported.mlir_module_serialized),
          **kernels_in(text), "collectives": collectives_in(text)}


def collectives_in(module_text: str) -> dict[str, int]:
  """{op: count} of the explicit collectives in a StableHLO module (those shard_map bodies
  write; the partitioner adds its own only when the module is compiled): under mesh.sequence,
  the halos' collective_permute and the gathered keys' and states' all_gather."""
  return dict(collections.Counter(re.findall(
      r"stablehlo\.(collective_permute|all_gather|all_reduce|reduce_scatter|all_to_all)\b",
      module_text)))


def summary_text(result: dict) -> str:
  kernels_found = ", ".join(f"{name} x{n}" for name, n in sorted(result["kernels"].items()))
  calls = ", ".join(f"{name} x{n}" for name, n in sorted(result["custom_calls"].items()))
  collectives = ", ".join(f"{op} x{n}" for op, n in sorted(result["collectives"].items()))
  return (f"train step lowered for {result['platform']} on mesh {result['mesh']} "
          f"({result['devices']} devices)\n"
          f"module: {result['module_text_bytes'] / 1e6:.2f} MB StableHLO text, "
          f"{result['serialized_bytes'] / 1e6:.2f} MB StableHLO bytecode\n"
          f"custom calls: {calls or 'none'}\n"
          f"attention kernels: {kernels_found or 'none (the xla path)'}\n"
          f"explicit collectives: {collectives or 'none'}")
