"""kernels/recurrent_dispatch.py: what each impl means per platform, read at call time."""
import types

import pytest

from hybrid_nope.kernels import recurrent_dispatch, target_platform


def fake(available=True):
  return types.SimpleNamespace(__name__="hybrid_nope.kernels.fake_gpu", kernel=lambda: "pallas",
                               available=lambda: available)


def xla():
  return "xla"


def test_auto_follows_the_mixers_constant_and_pallas_needs_its_platform():
  auto = []
  dispatch = recurrent_dispatch.Dispatch("toy", xla, {"cuda": fake()}, "kernel", lambda: auto)
  with target_platform("cuda"):
    assert dispatch.resolve("auto") == "xla" and dispatch.available_impls() == ("xla", "pallas")
    auto.append("cuda")  # measured faster: "auto" takes it from now on
    assert dispatch.resolve("auto") == "pallas"
    assert dispatch.per_platform("auto")["cuda"]() == "pallas"
  with target_platform("tpu"):
    assert dispatch.resolve("auto") == "xla"
    with pytest.raises(ValueError, match=r"toy kernels compile for CUDA GPUs only; the platform "
                                         r"is 'tpu' .*fake_gpu.*Available: \('xla',\)"):
      dispatch.resolve("pallas")
  with pytest.raises(ValueError, match="expected one of"):
    dispatch.resolve("cudnn")


def test_a_missing_pallas_module_is_named():
  dispatch = recurrent_dispatch.Dispatch("toy", xla, {"cuda": fake(False)}, "kernel", tuple)
  with target_platform("cuda"), pytest.raises(ValueError,
                                              match="jax.experimental.pallas.triton is missing"):
    dispatch.resolve("pallas")
  assert dispatch.per_platform("pallas") == {}
