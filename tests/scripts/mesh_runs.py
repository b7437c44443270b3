"""Runs in its own process with 8 simulated CPU devices (XLA_FLAGS set by the caller) and prints
one JSON object for one PART: a mesh's losses and recency profiles (PART is a name in MESHES),
the recurrent mixers under remat on a mesh ("recurrent"), or the parameter shardings and a
cross-mesh checkpoint restore ("layout"). One part per process, so the test's parts run on
separate pytest workers.

  python -m tests.scripts.mesh_runs WORKDIR PART
"""
import json
import os
import sys

import jax
import numpy as np

from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.train import loop, sharding
from hybrid_nope.run import run_identity
from hybrid_nope.run.checkpoint import Checkpointer
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import sharded_train_state
from tests.helpers import MESH_TEST, tiny_config

# (data, fsdp, sequence, tensor). data2_sequence4: each row's 64 tokens in shards of 16, with
# the tiny corpus's documents crossing their edges (context parallelism).
MESHES = {"data8": (8, 1, 1, 1), "data2_fsdp4": (2, 4, 1, 1), "fsdp2_tensor4": (1, 2, 1, 4),
          "data2_sequence4": (2, 1, 4, 1)}
# Remat scans over stacked block parameters; the stack must keep each parameter's sharding.
REMAT_MESH = "fsdp2_tensor4"
RECURRENT_PATTERN = "LDG"


def config_for(mesh, **overrides):
  data, fsdp, sequence, tensor = mesh
  return tiny_config(**MESH_TEST, mesh__data=data, mesh__fsdp=fsdp, mesh__sequence=sequence,
                     mesh__tensor=tensor, **overrides)


def losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def recency_profiles(workdir):
  """Every recency record's profile, in file order (the probe is replicated on the mesh)."""
  with open(os.path.join(workdir, "recency.jsonl")) as f:
    return [r["profile"] for r in map(json.loads, f)]


def mesh_part(workdir, name):
  """Losses and recency profiles of the tiny run on one mesh, with the hook."""
  run_dir = os.path.join(workdir, name)
  loop.train(config_for(MESHES[name]), run_dir, hooks=[RecencyHook.for_run])
  return {"losses": losses(run_dir), "recency": recency_profiles(run_dir)}


def recurrent_part(workdir):
  """The recurrent mixers, gated linear attention (L) and the gated delta rule (D), run per shard
  like attention: on the mesh that splits both batch and heads, under remat (the scan over
  stacked blocks, whose stack must keep each parameter's sharding), with the hook. One LDG model
  holds both, so the check costs one run."""
  run_dir = os.path.join(workdir, f"{RECURRENT_PATTERN}_{REMAT_MESH}_remat")
  loop.train(config_for(MESHES[REMAT_MESH], model__pattern=RECURRENT_PATTERN,
                        model__num_layers=len(RECURRENT_PATTERN), model__remat=True), run_dir,
             hooks=[RecencyHook.for_run])
  return {"losses": losses(run_dir)}


def layout_part(workdir):
  """Each rule's parameter sharding, and a checkpoint saved on one mesh restored onto another."""
  out = {"specs": {}}
  config = config_for(MESHES["fsdp2_tensor4"])
  tx = make_optimizer(config.train)
  mesh = sharding.make_mesh(config)
  _, state, _ = sharded_train_state(config.model, tx, 0, mesh)
  p = state.params
  for path, x in {"embedding_VD": p["embed"]["embedding_VD"],
                  "wq_DNH": p["blocks"][0]["attn"]["wq_DNH"],
                  "wo_NHD": p["blocks"][0]["attn"]["wo_NHD"],
                  "w_down_FD": p["blocks"][0]["mlp"]["w_down_FD"],
                  "scale_D": p["final_norm"]["scale_D"]}.items():
    out["specs"][path] = [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]

  # Save on 8-way FSDP, restore onto data 2 × fsdp 4.
  save_cfg, restore_cfg = config_for((1, 8, 1, 1)), config_for((2, 4, 1, 1))
  _, saved, _ = sharded_train_state(save_cfg.model, tx, 1, sharding.make_mesh(save_cfg))
  ckpt_dir = os.path.join(workdir, "cross_mesh")
  batch = save_cfg.data.batch_size  # The saved data position: one batch read by step 1.
  meta = {"data": {"data": "this run's"}, "config": {},
          "history": [run_identity.start_event(save_cfg)], "data_position": {"rows": batch}}
  ckpt = Checkpointer(ckpt_dir, keep=1)
  ckpt.save(1, saved, meta)
  ckpt.wait()
  restore_mesh = sharding.make_mesh(restore_cfg)
  _, fresh, shardings = sharded_train_state(restore_cfg.model, tx, 2, restore_mesh)
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        fresh, shardings)
  restored, rows = Checkpointer(ckpt_dir, keep=1).restore(
      1, target, ckpt.read_meta(1), data_fingerprint={"data": "this run's"},
      allow_changed_data=False, batch_size=batch)
  assert rows == batch
  same = all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)))
  on_new_mesh = all(x.sharding.mesh.shape == restore_mesh.shape
                    for x in jax.tree.leaves(restored.params))
  wq = lambda s: np.asarray(s.params["blocks"][0]["attn"]["wq_DNH"])
  # Different init seeds, so equality means the values really came from the checkpoint.
  out["cross_mesh_restore"] = {"equal": same, "on_new_mesh": on_new_mesh,
                               "fresh_init_differs": not np.array_equal(wq(saved), wq(fresh))}
  return out


PARTS = {**{name: (lambda w, name=name: mesh_part(w, name)) for name in MESHES},
         "recurrent": recurrent_part, "layout": layout_part}


def main(workdir, part):
  assert jax.device_count() == 8, jax.devices()
  print("RESULT " + json.dumps(PARTS[part](workdir)))


if __name__ == "__main__":
  main(*sys.argv[1:])
