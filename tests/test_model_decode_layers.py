"""Per-kind decoders on one mixer: a prefill then steps give the mixer's own forward outputs.

Whole models of every pattern are checked in test_model_decode.py; here a single layer, the
per-channel delta gate (KDA) the model tests do not build, and the ring buffer's bookkeeping.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.model import decode, decode_layers
from hybrid_nope.model.delta import DeltaAttention


def test_ring_slots_hold_the_latest_columns_of_each_residue():
  for slots in (1, 3, 5):
    for column in range(12):
      held = np.asarray(decode_layers.AttentionDecoder.slot_columns(column, slots))
      written = sorted(c for c in held if c >= 0)
      assert written == list(range(max(0, column - slots + 1), column + 1))
      assert all(c % slots == s for s, c in enumerate(held) if c >= 0)


def test_the_delta_decoder_gives_the_layers_outputs_with_a_per_channel_gate_and_padding():
  D, T, P = 16, 9, 4
  mixer = DeltaAttention(d_model=D, num_heads=4, num_kv_heads=2, head_dim=8, norm_eps=1e-5,
                         gate="channel", impl="xla", dtype=jnp.float32, rngs=nnx.Rngs(params=0))
  x_BTD = jax.random.normal(jax.random.key(1), (2, T, D))
  start_B = jnp.asarray([2, 0])  # Row 0's first two columns are padding.
  decoder = decode.decoder_for("D")
  cache = jax.jit(lambda x: decoder.prefill(mixer, x, None, start_B, T))(x_BTD[:, :P])
  step = jax.jit(lambda cache, x, column: decoder.step(mixer, cache, x, None, column, start_B))
  outputs = []
  for column in range(P, T):
    y_B1D, cache = step(cache, x_BTD[:, column:column + 1], column)
    outputs.append(y_B1D[:, 0])
  decoded_BND = np.stack(outputs, axis=1)
  # The forward pass over the whole rows, padding as segment 0 (kernels' rule: a row alone).
  segment_ids_BT = (jnp.arange(T)[None, :] >= start_B[:, None]).astype(jnp.int32)
  reference_BTD = jax.jit(lambda x: mixer(x, positions_BT=None, segment_ids_BT=segment_ids_BT))(
      x_BTD)
  np.testing.assert_allclose(decoded_BND, reference_BTD[:, P:], rtol=1e-5, atol=1e-5)


def test_a_kind_without_a_decoder_is_refused_by_letter():
  with pytest.raises(decode_layers.DecodeError, match="'X'"):
    decode.decoder_for("X")
