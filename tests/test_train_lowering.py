# Tiers (pytest.ini): the tests marked integration here run launch/lower.py end to end (paper
# shapes, an 8-device mesh), so they are `make test-all` only; kernels_in's parsing stays in
# `make test`.
# test-all only: the train step lowers for TPU and CUDA on one device and on fsdp 2 x tensor 4
# with each platform's forward and backward attention kernels
# (test_the_train_step_lowers_with_each_platforms_kernels); the CPU lowering has no custom calls
# (test_the_cpu_lowering_has_no_custom_calls); a GLA hybrid lowers for TPU and CUDA with the chosen
# linear kernels, Mosaic on TPU and Triton on CUDA
# (test_a_gla_hybrid_lowers_for_tpu_and_cuda_with_the_chosen_linear_kernel); a 64K-token
# swa256_350m step split over 8 chips by mesh.sequence lowers for both, with its halos and
# gathers (test_a_64k_step_lowers_split_over_8_chips_for_tpu_and_cuda); configs/lag4096.py's
# largest window at its paper shape (seq_len 8192, far lag 4096) lowers for both with the
# platform's kernel in every attention layer (test_lag4096_lowers_at_its_shape_for_tpu_and_cuda).
"""launch/lower.py: the full train step lowers for TPU and CUDA on this CPU-only machine, on one
device and on an 8-way fsdp x tensor mesh, and carries each platform's attention kernels."""
import json
import subprocess
import sys

import pytest

from hybrid_nope.train.lowering import collectives_in, kernels_in
from tests.helpers import REPO

SLICE_350M = ["--config=configs/swa256_350m.py", "--config.model.num_layers=2",
              "--config.data.seq_len=8192"]
DEMO = ["--config=configs/demo.py"]
# Hybrids with D layers, which run the XLA delta rule on every platform beside the G layers'
# kernels: DG (per-head gate) and DDDG (per-channel gate), under remat.
DELTA = ["--config.data.seq_len=2048", "--config.metrics.far_lag=1024", "--config.model.remat=true"]
CONFIGS = {"demo": DEMO, "350m_slice": SLICE_350M,
           "gdn_slice": ["--config=configs/gdn_120m.py", "--config.model.num_layers=2", *DELTA],
           "kda_slice": ["--config=configs/kda_120m.py", "--config.model.num_layers=4", *DELTA]}
MESH_8 = ["--devices=8", "--config.mesh.data=1", "--config.mesh.fsdp=2", "--config.mesh.tensor=4"]
EXPECTED = {"tpu": ("tpu_custom_call", ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv")),
            "cuda": ("__gpu$xla.gpu.triton", ("swa_flash_fwd", "swa_flash_dq", "swa_flash_dkv"))}


@pytest.mark.parametrize("config, mesh", [
    *((c, m) for c in ("demo", "350m_slice") for m in ("one_device", "fsdp2_tensor4")),
    ("gdn_slice", "fsdp2_tensor4"), ("kda_slice", "one_device")])
@pytest.mark.integration
def test_the_train_step_lowers_with_each_platforms_kernels(config, mesh):
  args = [*CONFIGS[config], *(MESH_8 if mesh != "one_device" else [])]
  if config == "demo" and mesh != "one_device":  # Tensor 4 splits kv heads and the vocabulary.
    args += ["--config.model.num_kv_heads=4", "--config.model.vocab_size=260"]
  proc = subprocess.run([sys.executable, "launch/lower.py", "--platform=tpu,cuda", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert [r["platform"] for r in results] == ["tpu", "cuda"]
  for result in results:
    assert result["devices"] == (8 if mesh != "one_device" else 1)
    if mesh != "one_device":
      assert result["mesh"] == {"data": 1, "fsdp": 2, "sequence": 1, "tensor": 4}
    call, names = EXPECTED[result["platform"]]
    assert set(result["custom_calls"]) == {call}
    for name in names:  # Forward and both backward kernels: it really is a train step.
      assert any(k.startswith(name) for k in result["kernels"]), (name, result["kernels"])
    assert result["module_text_bytes"] > 0
  assert proc.stdout.count("attention kernels: ") == 2


# The paper's model on ProLong's longest rows: 64K tokens a row, split over 8 chips.
SEQUENCE_64K = ["--config=configs/swa256_350m.py", "--devices=8", "--config.data.seq_len=65536",
                "--config.data.batch_size=8", "--config.mesh.data=1", "--config.mesh.sequence=8",
                "--config.model.dtype=bfloat16"]


@pytest.mark.long
@pytest.mark.integration
def test_a_64k_step_lowers_split_over_8_chips_for_tpu_and_cuda():
  proc = subprocess.run([sys.executable, "launch/lower.py", "--platform=tpu,cuda",
                         *SEQUENCE_64K], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert [r["platform"] for r in results] == ["tpu", "cuda"]
  for result in results:
    assert result["mesh"] == {"data": 1, "fsdp": 1, "sequence": 8, "tensor": 1}
    call, names = EXPECTED[result["platform"]]
    for name in names:  # The SWA layers keep the platform's kernel inside the halo exchange.
      assert any(k.startswith(name) for k in result["kernels"]), (name, result["kernels"])
    # Halos travel by collective_permute; global keys and carried states by all_gather.
    assert result["collectives"].get("collective_permute", 0) > 0, result["collectives"]
    assert result["collectives"].get("all_gather", 0) > 0, result["collectives"]


@pytest.mark.parametrize("experiment", ["swa4096", "nopeswa4096"])
@pytest.mark.long
@pytest.mark.integration
def test_lag4096_lowers_at_its_shape_for_tpu_and_cuda(experiment):
  proc = subprocess.run([sys.executable, "launch/lower.py", "--platform=cuda,tpu",
                         f"--config=configs/lag4096.py:{experiment}"], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert [r["platform"] for r in results] == ["cuda", "tpu"]
  for result in results:
    call, names = EXPECTED[result["platform"]]
    assert set(result["custom_calls"]) == {call}
    for name in names:
      assert any(k.startswith(name) for k in result["kernels"]), (name, result["kernels"])
  # CUDA: one Triton kernel per layer and direction (8 layers: 4 windowed, 4 global).
  assert sum(results[0]["kernels"].values()) == 3 * 8


@pytest.mark.integration
def test_the_cpu_lowering_has_no_custom_calls():
  proc = subprocess.run([sys.executable, "launch/lower.py", "--platform=cpu", *DEMO], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "custom calls: none" in proc.stdout


def test_kernels_in_counts_calls_and_kernel_names():
  text = ('%0 = stablehlo.custom_call @tpu_custom_call(%a) {kernel_name = "splash_mha_fwd_x"}\n'
          '%1 = stablehlo.custom_call @tpu_custom_call(%b) {kernel_name = "splash_mha_dq_y"}\n'
          'func.func private @name = "other"')
  assert kernels_in(text) == {"custom_calls": {"tpu_custom_call": 2},
                              "kernels": {"splash_mha_fwd_x": 1, "splash_mha_dq_y": 1}}


def test_collectives_in_counts_each_explicit_collective():
  text = ('%0 = "stablehlo.collective_permute"(%a) <{source_target_pairs = ...}>\n'
          '%1 = "stablehlo.all_gather"(%0) %2 = "stablehlo.all_gather"(%1)\n'
          '%3 = stablehlo.add %2, %2 // all_gathered_keys is a name, not an op')
  assert collectives_in(text) == {"collective_permute": 1, "all_gather": 2}


# The L layers' Pallas kernels per platform: linear_pallas (TPU), linear_pallas_gpu (CUDA).
GLA_KERNELS = {"tpu": ("gla_chunk_fwd",),
               "cuda": ("gla_chunk_states", "gla_chunk_out", "gla_chunk_dstates", "gla_chunk_grads")}


def lower_small(config: str, platforms: str, **overrides) -> list[dict]:
  """launch/lower.py's RESULT lines for a 2-layer `config` at seq_len 2048."""
  args = [f"--config={config}", "--config.model.num_layers=2", "--config.data.seq_len=2048",
          "--config.metrics.far_lag=1024", *(f"--config.{k}={v}" for k, v in overrides.items())]
  proc = subprocess.run([sys.executable, "launch/lower.py", f"--platform={platforms}", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]


@pytest.mark.parametrize("linear_impl", ["auto", "pallas"])
@pytest.mark.integration
def test_a_gla_hybrid_lowers_for_tpu_and_cuda_with_the_chosen_linear_kernel(linear_impl):
  results = lower_small("configs/gla_350m.py", "tpu,cuda", **{"model.linear_impl": linear_impl})
  assert [r["platform"] for r in results] == ["tpu", "cuda"]
  for result in results:
    attention = EXPECTED[result["platform"]][1][0]  # the G layers' forward kernel
    assert any(k.startswith(attention) for k in result["kernels"]), result["kernels"]
    for name in GLA_KERNELS[result["platform"]]:  # "auto" keeps the L layers on XLA (untimed)
      found = any(k.startswith(name) for k in result["kernels"])
      assert found == (linear_impl == "pallas"), (name, result["kernels"])


DELTA_KERNELS = ("delta_chunk_fwd", "delta_chunk_dstate", "delta_chunk_grads")


@pytest.mark.parametrize("delta_impl", ["auto", "pallas"])
@pytest.mark.integration
def test_a_gated_deltanet_hybrid_lowers_for_cuda_with_the_chosen_delta_kernel(delta_impl):
  [result] = lower_small("configs/gdn_350m.py", "cuda", **{"model.delta_impl": delta_impl})
  for name in DELTA_KERNELS:  # "auto" keeps the D layers on XLA (untimed on a GPU)
    found = any(k.startswith(name) for k in result["kernels"])
    assert found == (delta_impl == "pallas"), (name, result["kernels"])
