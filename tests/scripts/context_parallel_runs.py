"""Attention with the sequence split over 4 of 8 simulated devices against one device
(tests/test_kernels_context_parallel.py)."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import PartitionSpec as P

from hybrid_nope import kernels
from hybrid_nope.kernels import context_parallel

B, T, N, K, H = 4, 256, 4, 2, 16
DATA, SEQUENCE = 2, 4


def main():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.float32) for _ in range(2))
  # Documents of ~50 tokens: many cross the shard edges at 64, 128 and 192.
  seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.02, axis=1), jnp.int32)
  edges = range(T // SEQUENCE, T, T // SEQUENCE)
  crossings = int(sum(int(seg[b, e - 1] == seg[b, e]) for b in range(B) for e in edges))
  mesh = jax.make_mesh((DATA, SEQUENCE), ("data", "sequence"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  spec, seg_spec = P("data", "sequence", None, None), P("data", "sequence")

  def one_device(window):
    return lambda q, k, v: kernels.attention(q, k, v, window=window, segment_ids=seg, impl="xla")

  def split(window):
    def body(q, k, v, s):
      if window is None:
        return context_parallel.global_causal(q, k, v, s, axis="sequence", chunk=48)
      kernel = functools.partial(kernels.attention, impl="xla", window=window)
      return context_parallel.sliding_window(kernel, q, k, v, s, window=window,
                                             axis="sequence", axis_size=SEQUENCE)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec,
                       check_vma=False)
    return lambda q, k, v: fn(q, k, v, seg)

  def value_and_grads(attend):
    loss = lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v)) * attend(q, k, v))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)

  result = {"crossings": crossings}
  for window in (2, 37, 64, None):
    want = value_and_grads(one_device(window))
    got = value_and_grads(split(window))
    result[f"w{window}"] = [float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
                            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
  try:
    value_and_grads(split(66))
    result["too_wide"] = None
  except ValueError as e:
    result["too_wide"] = str(e)
  result.update(recurrent_cases(rng, seg, mesh))
  print("RESULT " + json.dumps(result))


def recurrent_cases(rng, seg, mesh):
  """GLA and the delta rule (per-head and per-channel gates, GVA with d_v = 2 d_k) through the
  public kernels on the mesh, the state carried across shards; rows end in padding."""
  seg = (seg + 1).at[1, -9:].set(0)  # ids from 1: segment 0 is padding to these kernels
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q, k, v = normal(B, T, N, H), normal(B, T, K, H), normal(B, T, K, H)
  decay = -jnp.asarray(rng.random((B, T, K, H)) * 0.3, jnp.float32)
  k_gva, v_gva = normal(B, T, N, H), normal(B, T, 2 * N, 2 * H)
  beta = jnp.asarray(rng.random((B, T, 2 * N)), jnp.float32)
  channel_decay = -jnp.asarray(rng.random((B, T, 2 * N, H)) * 0.3, jnp.float32)
  cases = {
      "gla": (kernels.linear_attention, (q, k, v, decay)),
      "delta_gqa_head_gate": (kernels.delta_attention, (q, k, v, decay[..., 0],
                                                        beta[..., :K])),
      "delta_gva_channel_gate": (kernels.delta_attention, (q, k_gva, v_gva, channel_decay,
                                                           beta)),
  }
  out = {}
  for name, (kernel, args) in cases.items():
    def value_and_grads(**axes):
      attend = lambda *a: kernel(*a, segment_ids=seg, impl="xla", **axes)
      loss = lambda *a: jnp.sum(jnp.sin(attend(*a)) * attend(*a))
      return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args)
    want = value_and_grads()
    with jax.set_mesh(mesh):
      got = value_and_grads(batch_axes="data", sequence_axes="sequence")
    out[name] = [float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
                 for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
  return out


if __name__ == "__main__":
  logging.set_verbosity(logging.ERROR)
  main()
