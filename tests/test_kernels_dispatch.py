"""kernels/dispatch.py, the one table: every (contract, platform, impl, availability, layer)
resolves as the three per-contract dispatchers did before it (RESOLVE, AVAILABLE and BRANCHES
were printed by the old code at f6775ac, before the table existed), and its reasons name what is
missing."""
import contextlib
import dataclasses
import itertools
import re
from unittest import mock

import jax
import jax.numpy as jnp
import pytest

from hybrid_nope import kernels
from hybrid_nope.kernels import (cudnn, delta_pallas_gpu, dispatch, linear_pallas,
                                 linear_pallas_gpu, pallas_gpu, pallas_tpu)

# Target platforms; "host" is no target_platform(...), i.e. this CPU-only test machine.
PLATFORMS = ("host", "cpu", "tpu", "cuda", "rocm")
LAYERS = {  # name -> (T, dtype, window, segment ids): the cases CUDA's per-layer "auto" tells apart
    "global-8k-bf16": (8192, jnp.bfloat16, None, False),
    "global-4k-bf16": (4096, jnp.bfloat16, None, False),
    "global-8k-f16": (8192, jnp.float16, None, False),
    "global-8k-f32": (8192, jnp.float32, None, False),
    "global-8k-bf16-seg": (8192, jnp.bfloat16, None, True),
    "w256-8k-bf16": (8192, jnp.bfloat16, 256, False),
    "w8192-8k-bf16": (8192, jnp.bfloat16, 8192, False),  # a window >= T is global
    "w16384-8k-bf16": (8192, jnp.bfloat16, 16384, False),
}

# contract, impl, Pallas modules present, cuDNN can run the call, layer ("*": every layer) |
# resolve's answer per platform ("error": ValueError). The old attention raised AssertionError
# for an impl outside its IMPLS ("bogus"); the table raises ValueError as the others did.
RESOLVE = """
attention        auto   yes yes global-8k-bf16     | xla   xla   pallas cudnn  xla
attention        auto   yes yes global-4k-bf16     | xla   xla   pallas pallas xla
attention        auto   yes yes global-8k-f16      | xla   xla   pallas cudnn  xla
attention        auto   yes yes global-8k-f32      | xla   xla   pallas pallas xla
attention        auto   yes yes global-8k-bf16-seg | xla   xla   pallas pallas xla
attention        auto   yes yes w256-8k-bf16       | xla   xla   pallas pallas xla
attention        auto   yes yes w8192-8k-bf16      | xla   xla   pallas cudnn  xla
attention        auto   yes yes w16384-8k-bf16     | xla   xla   pallas cudnn  xla
attention        auto   yes no  *                  | xla   xla   pallas pallas xla
attention        auto   no  yes *                  | xla   xla   xla    xla    xla
attention        auto   no  no  *                  | xla   xla   xla    xla    xla
attention        xla    yes yes *                  | xla   xla   xla    xla    xla
attention        xla    yes no  *                  | xla   xla   xla    xla    xla
attention        xla    no  yes *                  | xla   xla   xla    xla    xla
attention        xla    no  no  *                  | xla   xla   xla    xla    xla
attention        pallas yes yes *                  | error error pallas pallas error
attention        pallas yes no  *                  | error error pallas pallas error
attention        pallas no  yes *                  | error error error  error  error
attention        pallas no  no  *                  | error error error  error  error
attention        cudnn  yes yes *                  | cudnn error error  cudnn  error
attention        cudnn  yes no  *                  | error error error  error  error
attention        cudnn  no  yes *                  | cudnn error error  cudnn  error
attention        cudnn  no  no  *                  | error error error  error  error
attention        bogus  yes yes *                  | error error error  error  error
attention        bogus  yes no  *                  | error error error  error  error
attention        bogus  no  yes *                  | error error error  error  error
attention        bogus  no  no  *                  | error error error  error  error
linear_attention auto   yes yes *                  | xla   xla   xla    xla    xla
linear_attention auto   no  yes *                  | xla   xla   xla    xla    xla
linear_attention xla    yes yes *                  | xla   xla   xla    xla    xla
linear_attention xla    no  yes *                  | xla   xla   xla    xla    xla
linear_attention pallas yes yes *                  | error error pallas pallas error
linear_attention pallas no  yes *                  | error error error  error  error
linear_attention cudnn  yes yes *                  | error error error  error  error
linear_attention cudnn  no  yes *                  | error error error  error  error
linear_attention bogus  yes yes *                  | error error error  error  error
linear_attention bogus  no  yes *                  | error error error  error  error
delta_attention  auto   yes yes *                  | xla   xla   xla    xla    xla
delta_attention  auto   no  yes *                  | xla   xla   xla    xla    xla
delta_attention  xla    yes yes *                  | xla   xla   xla    xla    xla
delta_attention  xla    no  yes *                  | xla   xla   xla    xla    xla
delta_attention  pallas yes yes *                  | error error error  pallas error
delta_attention  pallas no  yes *                  | error error error  error  error
delta_attention  cudnn  yes yes *                  | error error error  error  error
delta_attention  cudnn  no  yes *                  | error error error  error  error
delta_attention  bogus  yes yes *                  | error error error  error  error
delta_attention  bogus  no  yes *                  | error error error  error  error
"""

# contract, Pallas modules present, cuDNN can run the call | available_impls per platform.
AVAILABLE = """
attention        yes yes | xla,cudnn xla xla,pallas xla,pallas,cudnn xla
attention        yes no  | xla       xla xla,pallas xla,pallas       xla
attention        no  yes | xla,cudnn xla xla        xla,cudnn        xla
attention        no  no  | xla       xla xla        xla              xla
linear_attention yes yes | xla       xla xla,pallas xla,pallas       xla
linear_attention yes no  | xla       xla xla,pallas xla,pallas       xla
linear_attention no  yes | xla       xla xla        xla              xla
linear_attention no  no  | xla       xla xla        xla              xla
delta_attention  yes yes | xla       xla xla        xla,pallas       xla
delta_attention  yes no  | xla       xla xla        xla,pallas       xla
delta_attention  no  yes | xla       xla xla        xla              xla
delta_attention  no  no  | xla       xla xla        xla              xla
"""

# contract, impl, Pallas modules present | the platform_dependent branches: platform=kernel.
BRANCHES = """
attention        auto   yes | tpu=pallas_tpu.attention cuda=cuda_auto default=xla.attention
attention        auto   no  | default=xla.attention
attention        xla    yes | default=xla.attention
attention        xla    no  | default=xla.attention
attention        pallas yes | tpu=pallas_tpu.attention cuda=pallas_gpu.attention
attention        pallas no  |
attention        cudnn  yes | default=cudnn.attention
attention        cudnn  no  | default=cudnn.attention
linear_attention auto   yes | default=linear_xla.linear_attention
linear_attention auto   no  | default=linear_xla.linear_attention
linear_attention xla    yes | default=linear_xla.linear_attention
linear_attention xla    no  | default=linear_xla.linear_attention
linear_attention pallas yes | tpu=linear_pallas.linear_attention
                                cuda=linear_pallas_gpu.linear_attention
linear_attention pallas no  |
delta_attention  auto   yes | default=delta_xla.delta_attention
delta_attention  auto   no  | default=delta_xla.delta_attention
delta_attention  xla    yes | default=delta_xla.delta_attention
delta_attention  xla    no  | default=delta_xla.delta_attention
delta_attention  pallas yes | cuda=delta_pallas_gpu.delta_attention
delta_attention  pallas no  |
"""


def rows(table):
  """(key words, value words) per row; a line starting with spaces continues the row above."""
  text = re.sub(r"\n +", " ", table.strip())
  for line in text.splitlines():
    key, _, value = line.partition("|")
    yield key.split(), value.split()


@contextlib.contextmanager
def world(pallas: str, cudnn_ok: str):
  """This jax with or without the Pallas modules, on a machine where cuDNN can or cannot run."""
  with contextlib.ExitStack() as stack:
    if pallas == "no":
      for module in (pallas_gpu, pallas_tpu, linear_pallas, linear_pallas_gpu, delta_pallas_gpu):
        stack.enter_context(mock.patch.object(module, "available", lambda: False))
    reason = None if cudnn_ok == "yes" else "no CUDA GPU here"
    stack.enter_context(mock.patch.object(cudnn, "unsupported_reason", lambda q, s: reason))
    yield


def target(platform):
  return contextlib.nullcontext() if platform == "host" else kernels.target_platform(platform)


def layer(name):
  T, dtype, window, segments = LAYERS[name]
  return (jnp.zeros((1, T, 2, 64), dtype), jnp.ones((1, T), jnp.int32) if segments else None,
          window)


def resolved(contract, impl, q, segment_ids, window):
  try:
    return dispatch.resolve(contract, impl, q, segment_ids, window)
  except ValueError:
    return "error"


def test_the_tables_cover_every_contract_impl_and_layer():
  keys = {tuple(key[:4]) for key, _ in rows(RESOLVE)}
  for contract, impl, pallas, cudnn_ok in itertools.product(
      dispatch.TABLE, ("auto", "xla", "pallas", "cudnn", "bogus"), ("yes", "no"), ("yes", "no")):
    assert (contract, impl, pallas, cudnn_ok) in keys or (contract != "attention"
                                                          and cudnn_ok == "no")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="'host' is a CPU")
@pytest.mark.parametrize("contract, impl, pallas, cudnn_ok, name, want",
                         [(*key, tuple(value)) for key, value in rows(RESOLVE)])
def test_resolve_as_before(contract, impl, pallas, cudnn_ok, name, want):
  for layer_name in LAYERS if name == "*" else [name]:
    q, segment_ids, window = layer(layer_name)
    with world(pallas, cudnn_ok):
      got = []
      for platform in PLATFORMS:
        with target(platform):
          got.append(resolved(contract, impl, q, segment_ids, window))
    assert tuple(got) == want, layer_name


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="'host' is a CPU")
@pytest.mark.parametrize("contract, pallas, cudnn_ok, want",
                         [(*key, tuple(value)) for key, value in rows(AVAILABLE)])
def test_available_impls_as_before(contract, pallas, cudnn_ok, want):
  q, segment_ids, _ = layer("global-8k-bf16")
  with world(pallas, cudnn_ok):
    got = []
    for platform in PLATFORMS:
      with target(platform):
        got.append(",".join(dispatch.available_impls(contract, q, segment_ids)))
  assert tuple(got) == want


def label(kernel):
  if kernel is dispatch.cuda_auto:
    return "cuda_auto"
  return f"{kernel.module.__name__.rsplit('.', 1)[-1]}.{kernel.function}"


@pytest.mark.parametrize("contract, impl, pallas, want",
                         [(*key, tuple(value)) for key, value in rows(BRANCHES)])
def test_branches_as_before(contract, impl, pallas, want):
  with world(pallas, "yes"):
    got = dispatch.branches(contract, impl)
  assert tuple(f"{p}={label(k)}" for p, k in got.items()) == want


def test_auto_takes_pallas_where_the_table_says(monkeypatch):
  # A recurrent mixer measured faster on a platform: one entry in the table's `auto` moves it.
  measured = dataclasses.replace(dispatch.TABLE["delta_attention"], auto={"cuda": dispatch.PALLAS})
  monkeypatch.setitem(dispatch.TABLE, "delta_attention", measured)
  with kernels.target_platform("cuda"):
    assert dispatch.resolve("delta_attention", "auto") == "pallas"
  assert dispatch.branches("delta_attention", "auto")["cuda"].module is delta_pallas_gpu
  with kernels.target_platform("tpu"):
    assert dispatch.resolve("delta_attention", "auto") == "xla"


@pytest.mark.parametrize("contract, impl, platform, pallas, reason", [
    ("attention", "pallas", "cpu", "yes",
     "the Pallas attention kernels compile for TPU and CUDA GPUs only; the platform is 'cpu' "
     "(tests run them with interpret=True on pallas_tpu and pallas_gpu)"),
    ("attention", "pallas", "tpu", "no", "jax.experimental.pallas.ops.tpu.splash_attention is "
                                         "missing"),
    ("attention", "pallas", "cuda", "no", "jax.experimental.pallas.triton is missing"),
    ("attention", "cudnn", "tpu", "yes", "cuDNN runs on CUDA GPUs only; the target platform is "
                                         "'tpu'"),
    ("attention", "cudnn", "cuda", "yes", "no CUDA GPU here"),
    ("linear_attention", "pallas", "rocm", "yes",
     "the Pallas linear attention kernels compile for TPU and CUDA GPUs only; the platform is "
     "'rocm' (tests run them with interpret=True on linear_pallas and linear_pallas_gpu)"),
    ("linear_attention", "pallas", "tpu", "no", "jax.experimental.pallas.tpu is missing"),
    ("delta_attention", "pallas", "tpu", "yes",
     "the Pallas delta rule kernels compile for CUDA GPUs only; the platform is 'tpu' (tests run "
     "them with interpret=True on delta_pallas_gpu)"),
])
def test_an_unavailable_impl_says_why_and_what_is_available(contract, impl, platform, pallas,
                                                            reason):
  q, segment_ids, _ = layer("global-8k-bf16")
  with world(pallas, "no"), kernels.target_platform(platform):
    available = dispatch.available_impls(contract, q, segment_ids)
    message = f"impl={impl!r} is not available here: {reason}. Available: {available}"
    with pytest.raises(ValueError) as raised:
      dispatch.resolve(contract, impl, q, segment_ids)
  assert str(raised.value) == message


@pytest.mark.parametrize("contract", list(dispatch.TABLE))
def test_an_unknown_impl_names_the_choices(contract):
  with pytest.raises(ValueError, match=r"impl='cuda': expected one of \('auto', 'xla', 'pallas'"):
    dispatch.resolve(contract, "cuda")
