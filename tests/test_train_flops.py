import jax
import pytest

from hybrid_nope.model.mixer_costs import attended_pairs_per_query
from hybrid_nope.train.flops import flops_per_token, matmul_params
from tests.helpers import tiny_config


def weights_read_off_the_model(m) -> int:
  """Every weight of the two-layer model `m` that multiplies activations (the mixers' and MLPs'
  parameters named w*) and the output head (tied or not)."""
  from flax import nnx
  from hybrid_nope.model import LanguageModel
  model = nnx.eval_shape(lambda: LanguageModel(m, rngs=nnx.Rngs(0)))
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  params = nnx.state(model, nnx.Param)
  return sum(size({k: v for k, v in params["blocks"][i][part].items() if k.startswith("w")})
             for i in range(2) for part in ("attn", "mlp")) + m.d_model * m.vocab_size


def test_attended_pairs():
  assert attended_pairs_per_query(None, seq_len=4) == pytest.approx((1 + 2 + 3 + 4) / 4)
  assert attended_pairs_per_query(2, seq_len=4) == pytest.approx((1 + 2 + 2 + 2) / 4)


def test_flops_per_token_by_hand():
  m = tiny_config(model__pattern="SG", model__num_layers=2, model__window=4).model
  D, N, K, H, F, V = 32, 4, 2, 8, 64, 258
  per_layer = D * N * H * 2 + D * K * H * 2 + 3 * D * F
  assert matmul_params(m) == 2 * per_layer + D * V
  T = 64
  pairs_s = (1 + 2 + 3 + 4 * (T - 3)) / T
  pairs_g = (T + 1) / 2
  want = 6 * matmul_params(m) + 3 * 4 * N * H * (pairs_s + pairs_g)
  assert flops_per_token(m, T) == pytest.approx(want)


def test_a_gated_linear_attention_layer_counts_its_matmul_parameters_and_chunked_mixing():
  from hybrid_nope.model.mixer_costs import LINEAR_CHUNK, linear_attention_flops_per_token
  m = tiny_config(model__pattern="LG", model__num_layers=2).model
  assert matmul_params(m) == weights_read_off_the_model(m)
  N, K, H, C, T = 4, 2, 8, LINEAR_CHUNK, 64
  assert linear_attention_flops_per_token(N, K, H) == N * (2 * H * (C + 1) + 2 * H * H) + K * 2 * H * H
  want = 6 * matmul_params(m) + 3 * (linear_attention_flops_per_token(N, K, H)
                                     + 4 * N * H * (T + 1) / 2)
  assert flops_per_token(m, T) == pytest.approx(want)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_a_delta_rule_layer_counts_its_matmul_parameters_and_chunked_mixing(gate):
  """Every weight of a D layer that multiplies activations, read off the model itself:
  projections, output gate, low-rank decay gate, β, and the short convolutions' taps (one
  multiply-add per tap per token, as for a matmul weight)."""
  from hybrid_nope.model.mixer_costs import (DELTA_CHUNK, delta_attention_flops_per_token,
                                              linear_attention_flops_per_token)
  m = tiny_config(model__pattern="DG", model__num_layers=2, model__delta_gate=gate).model
  assert matmul_params(m) == weights_read_off_the_model(m)
  N, K, H, C, T = 4, 2, 8, DELTA_CHUNK, 64
  # Beyond linear attention's work, per kv head: k·kᵀ (strictly lower), the triangular inverse,
  # the transformed keys and values, and S k.
  extra = K * (H * (C - 1) + C * C / 3 + 2 * H * (C + 1) + 2 * H * H)
  linear = linear_attention_flops_per_token(N, K, H, chunk=C)
  assert delta_attention_flops_per_token(N, K, H) == pytest.approx(linear + extra)
  want = 6 * matmul_params(m) + 3 * (delta_attention_flops_per_token(N, K, H)
                                     + 4 * N * H * (T + 1) / 2)
  assert flops_per_token(m, T) == pytest.approx(want)


@pytest.mark.parametrize("options", [
    dict(delta_gate_form="mamba2"),
    dict(delta_gate_form="kda", delta_gate="channel"),
    dict(delta_gate_form="mamba2", delta_expand_v=2),
    dict(delta_v_heads=4, num_heads=2, num_kv_heads=2),  # GVA
])
def test_the_published_delta_forms_count_their_matmul_parameters_and_mixing(options):
  """The published forms' parameters read off the model (gate weights, GVA's value heads,
  expand_v's wider values); the mixing by hand for value heads V of dim J read by O heads."""
  from hybrid_nope.model.mixer_costs import DELTA_CHUNK, delta_attention_flops_per_token
  m = tiny_config(model__pattern="DG", model__num_layers=2,
                  **{f"model__{k}": v for k, v in options.items()}).model
  assert matmul_params(m) == weights_read_off_the_model(m)
  N, K, H, C = m.num_heads, m.num_kv_heads, m.head_dim, DELTA_CHUNK
  V, J = m.delta_v_heads or K, m.delta_expand_v * H
  O = V if V != K else N
  want = (O * ((2 * H + 2 * J) * (C + 1) / 2 + 2 * H * J) + V * 2 * H * J
          + V * (H * (C - 1) + C * C / 3 + (H + J) * (C + 1) + 2 * H * J))
  assert delta_attention_flops_per_token(N, K, H, v_heads=V, v_dim=J) == pytest.approx(want)
