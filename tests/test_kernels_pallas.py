# Tiers (pytest.ini): the two reference grids, in interpret mode (slow), cost ~30 s cold on 2
# cores, so by cost they are integration, `make test-all` only; each kernel's bfloat16, block,
# padding and x64 checks stay in `make test`.
# test-all only: the Triton GPU kernel (test_gpu_kernel_matches_reference) and the TPU splash
# wrapper (test_tpu_splash_matches_reference) match the float64 reference, forward and dq, dk,
# dv, over ragged T, T = 1, window 1, multi-block and global windows, segments and GQA 1, 2, 4.
"""The Pallas kernels in interpret mode on CPU: our Triton GPU kernel and the TPU splash wrapper,
forward and dq, dk, dv against the float64 reference.

Interpretation is slow, so each kernel runs a handful of shapes chosen to cover every feature:
ragged T (not a multiple of the block), T = 1, window 1 (rows that see only themselves),
windows spanning several blocks and >= T, global attention, segment ids (where the GPU kernel
skips other documents' key blocks), GQA 1, 2 and 4, and bfloat16. The full window grid runs
on the "xla" implementation (test_kernels_attention.py).
"""
import jax
import jax.numpy as jnp
import pytest

from hybrid_nope.kernels import pallas_gpu, pallas_tpu, xla
from test_kernels_attention import check_against_reference

# (T, window, gqa, segments)
CASES = [
    (17, 7, 1, False),     # ragged T shorter than two blocks, window inside a block
    (1, None, 4, True),    # a single token
    (100, 1, 4, True),     # every row sees only itself
    (100, None, 1, True),  # global attention over packed documents (segment skipping)
    (256, 64, 4, True),    # a window spanning several blocks, GQA 4
    (200, 400, 2, False),  # window >= T is global; GQA 2; ragged tail
]


def gpu_kernel(block_sizes):
  def fn(q, k, v, **kwargs):
    return pallas_gpu.attention(q, k, v, block_sizes=block_sizes, interpret=True, **kwargs)
  return fn


def tpu_kernel(q, k, v, **kwargs):
  # 128 is splash's smallest tile; it still gives several blocks at T = 256.
  return pallas_tpu.attention(q, k, v, block_sizes=pallas_tpu.BlockSizes(128, 128),
                              interpret=True, **kwargs)


@pytest.mark.parametrize("T, window, gqa, segments", CASES)
@pytest.mark.integration
def test_gpu_kernel_matches_reference(T, window, gqa, segments):
  # 16 is Triton's smallest dot tile, so T = 100..256 spans 7..16 blocks.
  check_against_reference(gpu_kernel(pallas_gpu.BlockSizes(16, 16)), T, window, gqa, segments)


def test_gpu_kernel_with_different_forward_and_backward_blocks():
  # T is padded to the larger block; bounds and grids of each kernel use its own block.
  check_against_reference(gpu_kernel(pallas_gpu.BlockSizes(forward=32, backward=16)), 90, 20,
                          2, True)


def test_gpu_kernel_bfloat16_close_to_reference():
  check_against_reference(gpu_kernel(pallas_gpu.BlockSizes(16, 16)), 80, 16, 4, True,
                          dtype=jnp.bfloat16, tol=2e-2)


def test_gpu_kernel_pads_small_head_dims():
  # H = 8 is padded to Triton's 16; H = 24 to the power of two 32.
  check_against_reference(gpu_kernel(pallas_gpu.BlockSizes(16, 16)), 40, 9, 2, True, H=24)


@pytest.mark.parametrize("T, window, gqa, segments", CASES)
@pytest.mark.integration
def test_tpu_splash_matches_reference(T, window, gqa, segments):
  check_against_reference(tpu_kernel, T, window, gqa, segments)


def test_tpu_splash_bfloat16_close_to_reference():
  check_against_reference(tpu_kernel, 150, 16, 4, True, dtype=jnp.bfloat16, tol=2e-2)


@pytest.mark.parametrize("kernel", ["gpu", "tpu", "xla"])
def test_every_kernel_works_with_x64_on(kernel):
  # x64 turns Python ints into int64 in index arithmetic: our Triton kernel divides by int32
  # explicitly, and splash (whose index maps do not) is traced with x64 off.
  fn = {"gpu": gpu_kernel(pallas_gpu.BlockSizes(16, 16)), "tpu": tpu_kernel,
        "xla": xla.attention}[kernel]
  with jax.enable_x64(True):
    check_against_reference(fn, 100, 16, 2, True)


def test_tpu_splash_built_inside_a_shard_map_serves_a_later_trace_outside_it():
  # The kernel is cached across traces; built first inside a shard_map (a pod's per-shard
  # attention), its mask tables once carried the Manual mesh axes into the next trace under
  # the plain mesh (an eval or a resume's redone eval), which failed to trace.
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  q_BTNH = jax.random.normal(jax.random.key(0), (1, 128, 2, 16), jnp.float32)
  window = 48  # no other test builds this kernel, so this one is built inside the shard_map
  attend = lambda q: pallas_tpu.attention(q, q, q, window=window, interpret=True)
  P = jax.sharding.PartitionSpec
  with jax.set_mesh(mesh):
    per_shard = jax.jit(jax.shard_map(attend, mesh=mesh, in_specs=P("data"),
                                      out_specs=P("data"), check_vma=False))(q_BTNH)
    whole = jax.jit(attend)(q_BTNH)
  expected = xla.attention(q_BTNH, q_BTNH, q_BTNH, window=window)
  assert jnp.allclose(per_shard, expected, atol=1e-5) and jnp.allclose(whole, expected, atol=1e-5)
