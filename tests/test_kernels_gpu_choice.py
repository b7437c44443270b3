"""The per-layer attention choice on CUDA (dispatch.cuda_attention) and its wiring into
attention()'s "auto": the table's rules, what resolve() reports for a layer, and that float32
runs our kernel's dots at HIGHEST (IEEE in Triton, not TF32)."""
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope import kernels
from hybrid_nope.kernels import cudnn, dispatch, linear_pallas_gpu, pallas_gpu

RUNNABLE = dict(has_segments=False, cudnn_unavailable=None)


@pytest.mark.parametrize("window, seq_len, dtype, extra, expected", [
    (None, 8192, jnp.bfloat16, {}, "cudnn"),
    (None, 32768, jnp.float16, {}, "cudnn"),
    (None, 8191, jnp.bfloat16, {}, "pallas"),          # below the measured crossover
    (None, 8192, jnp.float32, {}, "pallas"),           # cuDNN takes no float32
    (1024, 32768, jnp.bfloat16, {}, "pallas"),         # windows: our kernel
    (64, 8192, jnp.bfloat16, {}, "pallas"),
    (None, 8192, jnp.bfloat16, {"has_segments": True}, "pallas"),  # dense T x T mask otherwise
    (None, 8192, jnp.bfloat16, {"cudnn_unavailable": "no GPU"}, "pallas"),
])
def test_table(window, seq_len, dtype, extra, expected):
  choice = dispatch.cuda_attention(window=window, seq_len=seq_len, dtype=dtype,
                                   **{**RUNNABLE, **extra})
  assert choice.impl == expected and choice.why


def test_resolve_reports_the_layer_choice_on_cuda(monkeypatch):
  q = jnp.zeros((1, 8192, 2, 64), jnp.bfloat16)
  seg = jnp.ones((1, 8192), jnp.int32)
  with kernels.target_platform("cuda"):
    # This CPU cannot trace cuDNN, so a global layer exported from here gets our kernel.
    assert kernels.resolve("auto", q, window=None) == "pallas"
    monkeypatch.setattr(cudnn, "unsupported_reason", lambda q, segment_ids: None)
    assert kernels.resolve("auto", q, window=None) == "cudnn"
    assert kernels.resolve("auto", q, window=16384) == "cudnn"  # a window >= T is global
    assert kernels.resolve("auto", q, window=256) == "pallas"
    assert kernels.resolve("auto", q, seg, window=None) == "pallas"
    assert kernels.resolve("auto", q.astype(jnp.float32), window=None) == "pallas"
  assert kernels.resolve("auto", q, window=None) == "xla"  # CPU


def test_cuda_auto_calls_the_chosen_kernel(monkeypatch):
  calls = []
  monkeypatch.setattr(cudnn, "unsupported_reason", lambda q, segment_ids: None)
  monkeypatch.setattr(cudnn, "attention", lambda q, k, v, **kw: calls.append("cudnn") or q)
  monkeypatch.setattr(pallas_gpu, "attention", lambda q, k, v, **kw: calls.append("pallas") or q)
  q = jnp.zeros((1, 8192, 2, 64), jnp.bfloat16)
  dispatch.cuda_auto(q, q, q, window=None)
  dispatch.cuda_auto(q, q, q, window=128)
  dispatch.cuda_auto(q[:, :4096], q[:, :4096], q[:, :4096], window=None)
  assert calls == ["cudnn", "pallas", "pallas"]


def _dot_precisions(jaxpr) -> list:
  """The precision of every dot_general in `jaxpr` and the jaxprs nested in its equations."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      found.append(eqn.params["precision"])
    for inner in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _dot_precisions(inner)
  return found


def _attention(q, interpret):
  return pallas_gpu.attention(q, q, q, window=8, interpret=interpret)


def _gla(q, interpret):
  log_decay = -jnp.abs(q)
  return linear_pallas_gpu.linear_attention(q, q, q, log_decay, interpret=interpret)


@pytest.mark.parametrize("kernel, dots", [(_attention, 9), (_gla, 12)])
@pytest.mark.parametrize("dtype, highest", [(jnp.float32, True), (jnp.bfloat16, False)])
def test_triton_kernel_dots_are_highest_in_float32_only(kernel, dots, dtype, highest):
  q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 32, 2, 16)), dtype)
  loss = lambda q: kernel(q, interpret=True).astype(jnp.float32).sum()
  precisions = _dot_precisions(jax.make_jaxpr(jax.grad(loss))(q).jaxpr)
  data_dots = [p for p in precisions if p is None or jax.lax.Precision.HIGHEST not in tuple(p)]
  # Forward and backward kernels all seen (the GLA kernels' 0/1 range-sum dots are always
  # HIGHEST: they are float32 sums, not data dots).
  assert len(precisions) >= dots
  assert (not data_dots) if highest else len(data_dots) >= dots // 2
