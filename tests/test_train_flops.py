import pytest

from hybrid_nope.train.flops import attended_pairs_per_query, flops_per_token, matmul_params
from tests.helpers import tiny_config


def test_attended_pairs():
  assert attended_pairs_per_query("G", window=0, seq_len=4) == pytest.approx((1 + 2 + 3 + 4) / 4)
  assert attended_pairs_per_query("S", window=2, seq_len=4) == pytest.approx((1 + 2 + 2 + 2) / 4)


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
