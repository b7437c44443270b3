"""Device mesh (data, fsdp, sequence, tensor) and the one table mapping logical axis names to it.

Parameters carry logical names (model/layers.py); activations are constrained with
`model.layers.constrain`. `LOGICAL_RULES` is the only place either meets the mesh.
"""
from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from hybrid_nope.validate import (MESH_AXES, MeshError, check_divisibility,  # noqa: F401
                                  mesh_shape)


LOGICAL_RULES = (
    # Parameters: FSDP shards the model dimension; tensor parallelism shards heads, MLP, vocab.
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    # Activations: the batch splits over data and fsdp, the tokens of a row over sequence
    # (context parallelism); per-head and MLP-hidden tensors over tensor; the residual stream
    # is replicated across tensor (Megatron layout).
    ("act_batch", ("data", "fsdp")),
    ("act_length", "sequence"),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def make_mesh(config) -> jax.sharding.Mesh:
  shape = mesh_shape(config.mesh, jax.device_count())
  check_divisibility(config, shape)
  mesh = jax.make_mesh(shape, MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))
  _check_sequence_within_processes(mesh)
  return mesh


def _check_sequence_within_processes(mesh) -> None:
  """Each process feeds whole rows (global_batch), so a row's sequence shards must all be
  devices of one process."""
  devices = np.moveaxis(mesh.devices, MESH_AXES.index("sequence"), -1)
  groups = devices.reshape(-1, devices.shape[-1])
  if any(len({d.process_index for d in group}) > 1 for group in groups):
    raise MeshError(f"config.mesh.sequence={mesh.shape['sequence']} spans processes (each has "
                    f"{jax.local_device_count()} devices): a row's shards must be devices of "
                    "one host; use at most that many sequence shards")


@contextlib.contextmanager
def activation_rules(mesh: jax.sharding.Mesh):
  """Within it, `model.layers.constrain` maps activations onto `mesh`."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
    yield


def logical_param_specs(abstract_model) -> dict:
  """Plain dict (as the trainer's params) of PartitionSpecs of logical axis names."""
  return nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(abstract_model, nnx.Param)))


def param_shardings(logical_specs: dict, mesh) -> dict:
  return nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_RULES)


def batch_sharding(mesh) -> NamedSharding:
  """[batch, tokens] inputs: rows over data × fsdp, each row's tokens over sequence."""
  return NamedSharding(mesh, P(("data", "fsdp"), "sequence"))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict, mesh) -> dict:
  """Assembles the global batch from each process's rows (leading axis split over data, fsdp;
  a process holds whole rows, which its devices split over sequence)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
