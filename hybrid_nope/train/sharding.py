"""Device mesh (data, fsdp, tensor) and the one table mapping logical axis names to it.

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
    # Activations: the batch splits over data and fsdp; per-head and MLP-hidden tensors over
    # tensor; the residual stream is replicated across tensor (Megatron layout).
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def make_mesh(config) -> jax.sharding.Mesh:
  shape = mesh_shape(config.mesh, jax.device_count())
  check_divisibility(config, shape)
  return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)


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
  return NamedSharding(mesh, P(("data", "fsdp"), None))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict, mesh) -> dict:
  """Assembles the global batch from each process's rows (leading axis split over data, fsdp)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
