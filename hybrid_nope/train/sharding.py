"""Device mesh (data, fsdp, tensor) and the one table mapping logical axis names to it.

Parameters carry logical names (model/layers.py); activations are constrained with
`model.layers.constrain`. `LOGICAL_RULES` is the only place either meets the mesh.
"""
from __future__ import annotations

import contextlib
import math

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from hybrid_nope.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")

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


class MeshError(UserError):
  pass


def mesh_shape(mesh_cfg, device_count: int) -> tuple[int, int, int]:
  """Sizes of (data, fsdp, tensor); one -1 takes the devices the others leave."""
  sizes = [mesh_cfg[a] for a in MESH_AXES]
  fill = [a for a, s in zip(MESH_AXES, sizes) if s == -1]
  bad = [a for a, s in zip(MESH_AXES, sizes) if s != -1 and (not isinstance(s, int) or s < 1)]
  if bad or len(fill) > 1:
    raise MeshError(f"config.mesh {dict(zip(MESH_AXES, sizes))} is invalid: expected positive "
                    "integers, with at most one -1 (fill with the remaining devices)")
  known = math.prod(s for s in sizes if s != -1)
  if fill:
    if device_count % known:
      raise MeshError(f"config.mesh.{fill[0]}=-1 cannot fill {device_count} devices: the other "
                      f"axes multiply to {known}, which does not divide {device_count}")
    sizes[sizes.index(-1)] = device_count // known
  if math.prod(sizes) != device_count:
    raise MeshError(f"config.mesh {dict(zip(MESH_AXES, sizes))} has {math.prod(sizes)} devices; "
                    f"this run has {device_count}: make mesh.data × mesh.fsdp × mesh.tensor equal "
                    "it (or set one of them to -1)")
  return tuple(sizes)


def check_divisibility(config, shape: tuple[int, int, int]) -> None:
  """Fails before compiling where a sharded dimension does not split evenly."""
  data, fsdp, tensor = shape
  m = config.model
  checks = [
      ("data.batch_size", config.data.batch_size, data * fsdp, "mesh.data × mesh.fsdp"),
      ("eval.batch_size", config.eval.batch_size, data * fsdp, "mesh.data × mesh.fsdp"),
      ("model.num_heads", m.num_heads, tensor, "mesh.tensor"),
      ("model.num_kv_heads", m.num_kv_heads, tensor, "mesh.tensor"),
      ("model.mlp_dim", m.mlp_dim, tensor, "mesh.tensor"),
      ("model.vocab_size", m.vocab_size, tensor, "mesh.tensor"),
      ("model.d_model", m.d_model, fsdp, "mesh.fsdp"),
  ]
  for key, value, parts, axes in checks:
    if value % parts:
      raise MeshError(f"config.{key}={value} is not divisible by {axes}={parts}")


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
