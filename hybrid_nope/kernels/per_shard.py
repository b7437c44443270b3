"""Run an attention implementation on each device's shard of the context mesh (shard_map).

Attention is independent across batch rows and across kv-head groups, so under a mesh that
splits the batch and the heads every device can run the kernel on its own shard with no
communication. Left to the SPMD partitioner instead, a Pallas call or a loop of dynamic slices
(kernels/xla.py) cannot be partitioned: XLA gathers q, k, v and runs the whole problem on every
device. This is how MaxText drives splash attention on pods, and on a CPU host split into
several devices (--xla_force_host_platform_device_count) it is what puts the kernel's loops on
every core: XLA:CPU runs one device's loop on one thread.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
from absl import logging
from jax.sharding import PartitionSpec as P

AxisNames = str | tuple[str, ...] | None


def _names(axes: AxisNames) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def _mesh_split(batch_axes: AxisNames, head_axes: AxisNames, *, B: int, N: int, K: int,
                sequence_axis: str | None = None):
  """(mesh, reason): the context mesh to shard over, or None and why the call stays whole."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return None, None
  batch, heads = _names(batch_axes), _names(head_axes)
  size = lambda names: math.prod(mesh.shape[a] for a in names)
  unknown = [a for a in batch + heads if a not in mesh.shape]
  if unknown:
    raise ValueError(f"attention sharding axes {unknown} are not axes of the mesh "
                     f"{dict(mesh.shape)}")
  # Every mesh axis with more than one device must split q, k, v and the output: an axis that
  # does not would see each device compute the same full result, and without replication
  # checks (which Pallas calls do not support everywhere) its gradient would be summed twice.
  unused = [a for a, n in mesh.shape.items()
            if n > 1 and a not in batch + heads + (sequence_axis,)]
  if unused:
    return None, f"mesh axes {unused} split neither the batch nor the heads"
  if B % size(batch) or N % size(heads) or K % size(heads):
    return None, (f"batch {B} / heads {N} (kv {K}) do not divide over {batch} x {heads} of "
                  f"{dict(mesh.shape)}")
  return mesh, None


_LOGGED: set[str] = set()


def _sequence_split(sequence_axes: AxisNames, T: int):
  """(axis name, its size) when the context mesh splits the sequence over more than one device
  and T divides over it; else None (logged once where T does not divide: a prompt in
  generation, which the partitioner then gathers)."""
  names = _names(sequence_axes)
  mesh = jax.sharding.get_abstract_mesh()
  if not names or mesh.empty or math.prod(mesh.shape.get(a, 1) for a in names) == 1:
    return None
  if len(names) > 1:
    raise ValueError(f"the sequence splits over one mesh axis; the rules give {names}")
  size = mesh.shape[names[0]]
  if T % size:
    _warn_once(f"sequence of {T} tokens does not divide over {names[0]}={size}")
    return None
  return names[0], size


def _warn_once(reason: str) -> None:
  if reason not in _LOGGED:
    _LOGGED.add(reason)
    logging.warning("attention runs unsharded (the partitioner gathers it): %s", reason)


def run(fn: Callable, arrays_BTxH: tuple, segment_ids, *, batch_axes: AxisNames,
        head_axes: AxisNames, sequence_axes: AxisNames = None,
        sequence_fn: Callable | None = None):
  """fn(*arrays, segment_ids) on each shard: batch over `batch_axes`, heads over `head_axes`.

  `arrays_BTxH`: [B, T, heads, H] operands, queries first then the kv-head ones (k, v and, for
  linear attention, the decay); the output is laid out as the first. Outside a multi-device
  mesh, or where the shapes do not split (logged once), fn runs on the whole arrays and the
  partitioner places it as before.

  Where the mesh also splits the sequence (`sequence_axes`, context parallelism), each device
  holds T / n consecutive tokens and runs `sequence_fn(*arrays, segment_ids, axis=, axis_size=)`
  instead (kernels/context_parallel.py), which moves what crosses shard edges itself. Segment
  ids are then always given (ones for an unpacked batch): the edges are masked by them.
  """
  B, T, N, _ = arrays_BTxH[0].shape
  sequence = _sequence_split(sequence_axes, T)
  axis = sequence[0] if sequence else None
  if sequence and sequence_fn is None:
    raise ValueError(f"this kernel has no context-parallel form, but the mesh splits the "
                     f"sequence over {axis}={sequence[1]}")
  mesh, reason = _mesh_split(batch_axes, head_axes, B=B, N=N, K=arrays_BTxH[1].shape[2],
                             sequence_axis=axis)
  if mesh is None:
    if sequence:  # Nothing may fall back to a gather: the sequence did not fit one device.
      raise ValueError(f"the sequence splits over {axis}={sequence[1]}, but {reason}")
    if reason is not None:
      _warn_once(reason)
    return fn(*arrays_BTxH, segment_ids)
  batch, heads = _names(batch_axes) or None, _names(head_axes) or None
  spec_BTxH, spec_BT = P(batch, axis, heads, None), P(batch, axis)
  specs = (spec_BTxH,) * len(arrays_BTxH)
  if sequence:
    body = lambda *operands: sequence_fn(*operands, axis=axis, axis_size=sequence[1])
    if segment_ids is None:
      segment_ids = jax.numpy.ones((B, T), jax.numpy.int32)
  else:
    body = fn
  if segment_ids is None:
    return jax.shard_map(lambda *arrays: body(*arrays, None), mesh=mesh, in_specs=specs,
                         out_specs=spec_BTxH, check_vma=False)(*arrays_BTxH)
  return jax.shard_map(body, mesh=mesh, in_specs=specs + (spec_BT,), out_specs=spec_BTxH,
                       check_vma=False)(*arrays_BTxH, segment_ids)


def run_on_platforms(branches: dict, arrays_BTxH: tuple, segment_ids, *, batch_axes: AxisNames,
                     head_axes: AxisNames, sequence_axes: AxisNames = None,
                     sequence_form: Callable | None = None, **kernel_kwargs):
  """`branches` (platform -> kernel(*arrays, segment_ids=, **kernel_kwargs), "default" for the
  rest) run per shard as `run` does, the lowered platform's branch picked by
  jax.lax.platform_dependent; a single branch is called directly. Where the mesh splits the
  sequence, `sequence_form(kernel, *arrays, segment_ids, axis=, axis_size=)` runs on each
  shard instead, `kernel(*arrays, segment_ids=)` being that same per-platform kernel."""
  def on_shard(*operands):
    *arrays, seg = operands
    seg = () if seg is None else (seg,)  # platform_dependent takes arrays only.

    def bind(kernel):
      return lambda *ops: kernel(*ops[:len(arrays)], segment_ids=ops[len(arrays)] if seg else None,
                                 **kernel_kwargs)
    if len(branches) == 1:
      return bind(next(iter(branches.values())))(*arrays, *seg)
    return jax.lax.platform_dependent(*arrays, *seg, **{
        platform: bind(kernel) for platform, kernel in branches.items()})

  def on_sequence_shard(*operands, axis, axis_size):
    kernel = lambda *arrays, segment_ids: on_shard(*arrays, segment_ids)
    return sequence_form(kernel, *operands, axis=axis, axis_size=axis_size)

  return run(on_shard, arrays_BTxH, segment_ids, batch_axes=batch_axes, head_axes=head_axes,
             sequence_axes=sequence_axes,
             sequence_fn=on_sequence_shard if sequence_form is not None else None)
