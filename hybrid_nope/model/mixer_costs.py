"""What one layer's token mixer costs per token: its matmul parameters and its forward FLOPs
beside them. The layer-kind specs (model/kind_specs.py) point at these; train/flops.py sums them."""
from __future__ import annotations

import numpy as np

from hybrid_nope.kernels.delta_xla import CHUNK as DELTA_CHUNK
from hybrid_nope.kernels.linear_xla import CHUNK as LINEAR_CHUNK
from hybrid_nope.model.delta import CONV_WIDTH
from hybrid_nope.model.gla import GATE_RANK


def attention_params(m) -> int:
  """An attention layer's q, k, v, o projections."""
  return m.d_model * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)


def linear_params(m) -> int:
  """A gated linear attention layer's: attention's, its low-rank decay gate and output gate."""
  D, N, K, H = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
  return attention_params(m) + D * N * H + GATE_RANK * (D + K * H)


def delta_heads(m) -> tuple[int, int, int]:
  """(V value heads, J = d_v, O output heads) of a D layer (model/delta.py's head layout)."""
  V = m.delta_v_heads or m.num_kv_heads
  return V, m.delta_expand_v * m.head_dim, (V if V != m.num_kv_heads else m.num_heads)


def delta_params(m) -> int:
  """A D layer's: q, k, v, o, the output gate, the forget gate of its form, β and the taps of
  its short convolutions (a depthwise tap is one multiply-add per token, as a matmul weight is)."""
  D, N, K, H = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
  V, J, O = delta_heads(m)
  params = D * H * (N + K) + D * V * J + O * J * D + D * V + CONV_WIDTH * (N * H + K * H + V * J)
  params += D * J + J * O * J if m.delta_gate_form == "kda" else D * O * J  # output gate
  gate_channels = V * H if m.delta_gate == "channel" else V
  params += {"gla": GATE_RANK * (D + gate_channels), "mamba2": D * V,
             "kda": H * (D + V * H)}[m.delta_gate_form]
  return params


def attended_pairs_per_query(window: int | None, seq_len: int) -> float:
  """Mean number of keys a query attends to in a causal sequence of length seq_len (window
  None: the whole prefix)."""
  i = np.arange(seq_len)
  keys = i + 1 if window is None else np.minimum(i + 1, window)
  return float(keys.mean())


def attention_flops_per_token(m, seq_len: int, window: int | None) -> float:
  """QKᵀ and AV over the attended pairs."""
  return 4 * m.num_heads * m.head_dim * attended_pairs_per_query(window, seq_len)


def linear_attention_flops_per_token(num_heads: int, num_kv_heads: int, head_dim: int,
                                     chunk: int = LINEAR_CHUNK) -> float:
  """Forward FLOPs per token of chunked linear attention, counted as useful work: within a
  chunk the causal half of q·k and of the weighted sum of v ((chunk + 1) / 2 keys on average),
  across chunks the read-out q·S per query head and the state update k vᵀ per kv head."""
  H = head_dim
  return num_heads * (4 * H * (chunk + 1) / 2 + 2 * H * H) + num_kv_heads * 2 * H * H


def delta_attention_flops_per_token(num_heads: int, num_kv_heads: int, head_dim: int,
                                    chunk: int = DELTA_CHUNK, *, v_heads: int = 0,
                                    v_dim: int = 0) -> float:
  """Forward FLOPs per token of the chunked gated delta rule, counted as useful work: linear
  attention's (above: per read-out head the causal halves of q·k and of the weighted values and
  q·S, per state k vᵀ), and per state (value head) the delta rule's own: the strictly lower half
  of k·kᵀ, the unit-lower-triangular inverse (C³/3 per chunk of C), the transformed keys and
  values (causal halves) and the state's prediction of each value, S k. v_heads / v_dim: value
  heads and their dim when they differ from the kv heads and head_dim (GVA, expand_v)."""
  H, C = head_dim, chunk
  V, J = v_heads or num_kv_heads, v_dim or head_dim
  O = V if V != num_kv_heads else num_heads  # read-out heads
  linear = O * ((2 * H + 2 * J) * (C + 1) / 2 + 2 * H * J) + V * 2 * H * J
  delta_rule = 2 * H * (C - 1) / 2 + C * C / 3 + (2 * H + 2 * J) * (C + 1) / 2 + 2 * H * J
  return linear + V * delta_rule


def linear_mixing_flops(m, seq_len: int) -> float:
  del seq_len  # A state, not a prefix: the same at every length.
  return linear_attention_flops_per_token(m.num_heads, m.num_kv_heads, m.head_dim)


def delta_mixing_flops(m, seq_len: int) -> float:
  del seq_len
  V, J, _ = delta_heads(m)
  return delta_attention_flops_per_token(m.num_heads, m.num_kv_heads, m.head_dim, v_heads=V,
                                         v_dim=J)
