"""Attention run per shard on 8 simulated devices against one device (tests/test_kernels_per_shard.py)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from hybrid_nope import kernels

B, T, N, K, H = 4, 300, 8, 4, 16


def main():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.float32) for _ in range(2))
  seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.02, axis=1), jnp.int32)

  def value_and_grads(window, **axes):
    def loss(q, k, v):
      out = kernels.attention(q, k, v, window=window, segment_ids=seg, impl="xla", **axes)
      return jnp.sum(out * jnp.sin(out))  # Any non-linear function: distinct cotangents.
    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    lowered = fn.lower(q, k, v).as_text()
    return fn(q, k, v), lowered.count("manual_computation") + lowered.count("shard_map")

  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  result = {}
  for window in (37, None):
    want, _ = value_and_grads(window)
    with jax.set_mesh(mesh):
      cases = {"split": dict(batch_axes=("data", "fsdp"), head_axes="tensor"),
               "tensor_unused": dict(batch_axes=("data", "fsdp"))}
      for name, axes in cases.items():
        got, manual = value_and_grads(window, **axes)
        errors = [float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w))
                  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        result[f"{name}_w{window}"] = {"errors": errors, "shard_map": manual > 0}
  with jax.set_mesh(mesh):
    try:
      kernels.attention(q, k, v, impl="xla", batch_axes="rows")
      result["unknown_axis"] = None
    except ValueError as e:
      result["unknown_axis"] = str(e)
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  logging.set_verbosity(logging.ERROR)
  main()
