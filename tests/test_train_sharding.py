# Tiers (pytest.ini): the tests marked integration here run 8-device meshes or two processes,
# so they are `make test-all` only; the mesh shape and divisibility checks stay in `make test`.
# test-all only: every mesh gives one device's losses and recency profiles
# (test_same_losses_and_recency_on_every_mesh); L and D layers under remat on fsdp 2 x tensor 4
# match one device (test_recurrent_mixers_under_remat_on_a_mesh_match_one_device); parameter
# shardings follow the logical rules and a checkpoint restores onto another mesh
# (test_shardings_follow_the_rules_and_restore_onto_another_mesh); two processes give the losses,
# recency, samples and data position of one, and their run resumes on one process
# (test_two_processes_match_one).
"""Meshes, shardings and multi-device training (8 simulated CPU devices in a subprocess)."""
import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.run.storage import read_jsonl
from hybrid_nope.train import loop
from hybrid_nope.train.sharding import MeshError, check_divisibility, mesh_shape
from tests.helpers import MESH_TEST, REPO, run_8_devices, tiny_config, xla_flags
from tests.scripts.mesh_runs import MESHES, RECURRENT_PATTERN, losses, recency_profiles



def mesh_cfg(data, fsdp, tensor, sequence=1):
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, sequence=sequence, tensor=tensor))


def test_mesh_shape_fills_and_checks():
  assert mesh_shape(mesh_cfg(-1, 1, 1), 8) == (8, 1, 1, 1)
  assert mesh_shape(mesh_cfg(2, -1, 2), 8) == (2, 2, 1, 2)
  assert mesh_shape(mesh_cfg(2, 1, 1, sequence=-1), 8) == (2, 1, 4, 1)
  with pytest.raises(MeshError, match="has 6 devices"):
    mesh_shape(mesh_cfg(2, 3, 1), 8)
  with pytest.raises(MeshError, match="mesh.fsdp=-1 cannot fill"):
    mesh_shape(mesh_cfg(3, -1, 1), 8)
  with pytest.raises(MeshError, match="at most one -1"):
    mesh_shape(mesh_cfg(-1, -1, 1), 8)


@pytest.mark.parametrize("overrides, shape, key", [
    (dict(data__batch_size=6), (4, 1, 1, 1), "data.batch_size"),
    (dict(model__num_heads=6, model__num_kv_heads=6), (1, 1, 1, 4), "model.num_heads"),
    (dict(model__num_kv_heads=2), (1, 1, 1, 4), "model.num_kv_heads"),
    (dict(model__num_kv_heads=4), (1, 1, 1, 4), "model.vocab_size"),  # 258 ids: not 4 ways
    (dict(data__seq_len=66), (1, 1, 4, 1), "data.seq_len=66 is not divisible by mesh.sequence"),
    (dict(data__seq_len=64, model__pattern="SG", model__window=18), (1, 1, 4, 1),
     "model.window=18 needs the 17 keys before each shard"),
])
def test_bad_mesh_for_the_model_fails_before_compile(overrides, shape, key):
  with pytest.raises(MeshError, match=key):
    check_divisibility(tiny_config(**overrides), shape)


def train_losses_and_profiles(config, workdir, hooks=()):
  """The losses (and recency profiles, when the hook runs) a one-device run of 3 steps writes."""
  assert loop.train(config, str(workdir), hooks=list(hooks))["step"] == 3
  return losses(workdir), recency_profiles(workdir) if hooks else None


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  want, want_profiles = train_losses_and_profiles(
      tiny_config(**MESH_TEST), tmp_path_factory.mktemp("one_device"), [RecencyHook.for_run])
  assert len(want) == 3
  return want, want_profiles


# Each mesh is its own 8-device process, so pytest's workers share them out. data 2 × fsdp 4
# covers the data axis; the pure data-parallel mesh is kept for `pytest -m slow`.
@pytest.mark.long
@pytest.mark.parametrize("mesh", [pytest.param(m, marks=pytest.mark.slow) if m == "data8" else m
                                  for m in MESHES])
@pytest.mark.integration
def test_same_losses_and_recency_on_every_mesh(mesh, one_device, tmp_path):
  want, want_profiles = one_device
  out = run_8_devices("tests.scripts.mesh_runs", str(tmp_path), mesh)
  np.testing.assert_allclose(out["losses"], want, rtol=2e-5)
  # The hook on a mesh measures what one device does.
  np.testing.assert_allclose(out["recency"], want_profiles, rtol=1e-4, atol=1e-5)


@pytest.mark.long
@pytest.mark.integration
def test_recurrent_mixers_under_remat_on_a_mesh_match_one_device(one_device, tmp_path):
  """L and D layers (one LDG model) under remat on fsdp 2 × tensor 4, against one device
  without remat."""
  pattern = RECURRENT_PATTERN
  want, _ = train_losses_and_profiles(
      tiny_config(**MESH_TEST, model__pattern=pattern, model__num_layers=len(pattern)),
      tmp_path / "one_device")
  assert len(want) == 3 and want != one_device[0]
  out = run_8_devices("tests.scripts.mesh_runs", str(tmp_path / "mesh"), "recurrent")
  np.testing.assert_allclose(out["losses"], want, rtol=2e-5)


@pytest.mark.long
@pytest.mark.integration
def test_shardings_follow_the_rules_and_restore_onto_another_mesh(tmp_path):
  out = run_8_devices("tests.scripts.mesh_runs", str(tmp_path), "layout")
  # LOGICAL_RULES: embed -> fsdp, vocab/heads/mlp -> tensor, kv (head_dim) unsharded.
  assert out["specs"]["embedding_VD"] == ["tensor", "fsdp"]
  assert out["specs"]["wq_DNH"] == ["fsdp", "tensor", None]
  assert out["specs"]["wo_NHD"] == ["tensor", None, "fsdp"]
  assert out["specs"]["w_down_FD"] == ["tensor", "fsdp"]
  assert out["specs"]["scale_D"] == ["fsdp"]
  assert out["cross_mesh_restore"] == {"equal": True, "on_new_mesh": True,
                                       "fresh_init_differs": True}


@pytest.mark.long
@pytest.mark.integration
def test_two_processes_match_one(tmp_path):
  import socket
  from tests.scripts.two_process import TWO_PROCESS
  loop.train(tiny_config(**TWO_PROCESS), str(tmp_path / "one"), hooks=[RecencyHook.for_run])
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
             JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
             XLA_FLAGS=xla_flags())
  # Output goes to files, not pipes: communicate() on one process while the other fills its
  # 64 KiB pipe and then blocks deadlocks both, since each waits on the other in a collective.
  logs = [(open(tmp_path / f"p{i}.out", "w+"), open(tmp_path / f"p{i}.err", "w+"))
          for i in range(2)]
  procs = [subprocess.Popen([sys.executable, "-m", "tests.scripts.two_process",
                             str(tmp_path / "two")], cwd=REPO, env=dict(env, JAX_PROCESS_ID=str(i)),
                            stdout=logs[i][0], stderr=logs[i][1], text=True)
           for i in range(2)]
  try:
    for p in procs:
      p.wait(timeout=600)
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
  outs = []
  for p, (out_f, err_f) in zip(procs, logs):
    out_f.seek(0), err_f.seek(0)
    outs.append((out_f.read(), err_f.read()))
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, f"return code {p.returncode}; stderr tail:\n{err[-4000:]}"
    result = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    assert result["resumed_at"] == 3

  np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=2e-5)
  np.testing.assert_allclose(recency_profiles(tmp_path / "two"), recency_profiles(tmp_path / "one"),
                             rtol=1e-4, atol=1e-5)
  # The samples, written once (by process 0), are those of the one-process run.
  samples = {run: [r for r in read_jsonl(str(tmp_path / run / "metrics.jsonl")) if "samples" in r]
             for run in ("one", "two")}
  assert [r["step"] for r in samples["two"]] == [3]
  assert samples["two"] == samples["one"]
  # The data position is one global number, so the run saved by two processes resumes on one
  # with the batches (hence the losses) of a run that stayed on one process.
  with open(tmp_path / "two" / "checkpoints" / "3" / "meta" / "metadata") as f:
    rows = 3 * tiny_config(**TWO_PROCESS).data.batch_size
    assert json.load(f)["data_position"] == {"rows": rows}
  longer = tiny_config(**dict(TWO_PROCESS, train__steps=6,
                              train__allow_changes=("train.steps",)))
  for run in ("one", "two"):
    loop.train(longer, str(tmp_path / run))
  np.testing.assert_allclose(losses(tmp_path / "two")[3:], losses(tmp_path / "one")[3:],
                             rtol=2e-5)
  assert len(losses(tmp_path / "two")) == 6
