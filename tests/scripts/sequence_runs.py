"""A model with every layer kind (S, G, L, D) on 8 simulated devices, data 2 × sequence 4,
against one device: loss and every parameter's gradient, on packed rows whose documents cross
the shard edges and end in padding (tests/test_train_context_parallel.py).

  python -m tests.scripts.sequence_runs
"""
import json

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.kernels import context_parallel
from hybrid_nope.model.definition import init_model
from hybrid_nope.model.loss import objective_sums
from hybrid_nope.train import sharding
from tests.helpers import MESH_TEST, tiny_config

PATTERN = "SGLD"
DATA, SEQUENCE = 2, 4


def packed_batch(config, rng):
  """Rows of documents of ~12 tokens (positions restart in each), the last few tokens padding."""
  B, T = config.data.batch_size, config.data.seq_len
  starts = rng.random((B, T)) < 1 / 12
  starts[:, 0] = True
  segment_ids = np.cumsum(starts, axis=1).astype(np.int32)
  positions = np.zeros((B, T), np.int32)
  for b in range(B):
    for t in range(1, T):
      positions[b, t] = 0 if starts[b, t] else positions[b, t - 1] + 1
  segment_ids[:, -5:] = 0  # padding: segment 0, weight 0
  vocab = config.model.vocab_size
  batch = {"inputs": rng.integers(0, vocab, (B, T)), "targets": rng.integers(0, vocab, (B, T)),
           "segment_ids": segment_ids, "positions": positions,
           "weights": (segment_ids > 0).astype(np.float32)}
  return {k: jnp.asarray(v, jnp.float32 if k == "weights" else jnp.int32)
          for k, v in batch.items()}


def main():
  assert jax.device_count() == 8, jax.devices()
  config = tiny_config(**MESH_TEST, model__pattern=PATTERN, model__num_layers=len(PATTERN),
                       model__window=7, mesh__data=DATA, mesh__sequence=SEQUENCE)
  model_def, params = init_model(config.model, 0)
  batch = packed_batch(config, np.random.default_rng(0))
  T = config.data.seq_len
  edges = range(T // SEQUENCE, T, T // SEQUENCE)
  seg = np.asarray(batch["segment_ids"])
  crossings = int(sum(seg[b, e - 1] == seg[b, e] != 0 for b in range(seg.shape[0])
                      for e in edges))

  def loss(params, batch):
    sums = objective_sums(model_def.apply(params, batch), batch["targets"], batch["weights"])
    return sums["loss"] / jnp.sum(batch["weights"])

  value_and_grad = jax.value_and_grad(loss)
  want_loss, want_grads = jax.jit(value_and_grad)(params, batch)

  mesh = sharding.make_mesh(config)
  specs = sharding.logical_param_specs(model_def.bind(params))
  params_on_mesh = jax.device_put(params, sharding.param_shardings(specs, mesh))
  batch_on_mesh = jax.device_put(batch, sharding.batch_sharding(mesh))

  def on_mesh():
    """(loss, {parameter: max |grad error| / max |grad|}, hlo text) on the mesh."""
    jax.clear_caches()  # A mutant below must be traced anew.
    with sharding.activation_rules(mesh):
      step = jax.jit(value_and_grad)
      got_loss, got_grads = step(params_on_mesh, batch_on_mesh)
      hlo = step.lower(params_on_mesh, batch_on_mesh).as_text()
    errors = {jax.tree_util.keystr(path): float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
              for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                                      jax.tree.leaves(want_grads))}
    return float(got_loss), errors, hlo

  got_loss, errors, hlo = on_mesh()
  result = {
      "crossings": crossings, "loss": got_loss, "want_loss": float(want_loss),
      "grad_errors": errors, "mesh": dict(mesh.shape),
      "inputs_split": str(batch_on_mesh["inputs"].sharding.spec),
      # The shards talk: halos (collective-permute) and gathered keys / states (all-gather).
      "collective_permutes": hlo.count("collective_permute"),
      "all_gathers": hlo.count("all_gather")}
  # Mutants the comparison must catch: no halo (SWA keys before the shard read as zeros), and
  # no carried state (each shard's L and D layers start from zero).
  real_previous, real_recurrent = context_parallel._previous_shard, context_parallel.recurrent
  context_parallel._previous_shard = lambda x, axis, axis_size: jnp.zeros_like(x)
  result["no_halo"] = on_mesh()[1]
  context_parallel._previous_shard = real_previous
  context_parallel.recurrent = lambda *args, axis_size, **kwargs: real_recurrent(
      *args, axis_size=1, **kwargs)
  result["no_carried_state"] = on_mesh()[1]
  context_parallel.recurrent = real_recurrent
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
