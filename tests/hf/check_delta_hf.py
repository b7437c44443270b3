"""Layer D against the published delta layers in transformers: `make check-delta-hf` (needs torch +
transformers, .venv-hf).

Builds tiny random Qwen3-Next and Kimi Linear models with transformers' own classes, maps each
linear-attention layer's weights into our D layer (model/delta.py with the published options:
gate form mamba2 or kda, 1/sqrt(d_k), GVA, expand_v), runs both on the same random hidden
states (float32, several rows) and compares the layer outputs:

  qwen3_next        Qwen3NextGatedDeltaNet, num_v_heads = num_k_heads
  qwen3_next gva    num_v_heads = 2 num_k_heads (value heads share q/k heads)
  qwen3_next gva dv num_v_heads = 2 num_k_heads and value head dim = 2 key head dim
  kimi_linear       KimiLinearDeltaAttention (per-channel gate, low-rank sigmoid output gate)

The models' other parts (MoE, MLA, Qwen3-Next's gated full attention, their MLPs and norms) are
not ours and are not compared; docs/architecture.md says which parts D expresses. Every weight,
the norms' gains and the gates' A_log and dt_bias are drawn at random so that a wrong mapping
shows. Prints one table; exits 1 if a relative max error exceeds TOLERANCE.

  .venv-hf/bin/python tests/hf/check_delta_hf.py
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import (KimiLinearConfig, KimiLinearForCausalLM, Qwen3NextConfig,  # noqa: E402
                          Qwen3NextForCausalLM)

from hybrid_nope.model.delta import DeltaAttention  # noqa: E402

TOLERANCE = 1e-4  # max |ours − theirs| / max |theirs|, float32
D_MODEL, T, ROWS, EPS = 48, 150, 3, 1e-6


def randomise(module: torch.nn.Module, seed: int) -> None:
  """Every parameter of `module` drawn anew: weights N(0, 1/fan-in), gains around 1, A_log and
  dt_bias in their published ranges."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if name.endswith("A_log"):
        p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
      elif name.endswith("dt_bias"):
        p.copy_(torch.randn(p.shape, generator=g) - 4.0)
      elif p.ndim == 1 or name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1]))


def t2n(x: torch.Tensor) -> np.ndarray:
  return x.detach().to(torch.float32).numpy()


def ours(params: dict, **options) -> DeltaAttention:
  """A D layer of the given options with `params` (name -> array) in place of its own."""
  layer = DeltaAttention(d_model=D_MODEL, norm_eps=EPS, impl="xla", dtype=jnp.float32,
                         rngs=nnx.Rngs(0), qk_scale="1/sqrt(d_k)", **options)
  own = {name for name, value in vars(layer).items() if isinstance(value, nnx.Param)}
  if own != set(params):
    raise AssertionError(f"parameters differ: only ours {sorted(own - set(params))}, only "
                         f"mapped {sorted(set(params) - own)}")
  for name, value in params.items():
    have = getattr(layer, name)
    if tuple(have.shape) != value.shape:
      raise AssertionError(f"{name}: ours {tuple(have.shape)}, mapped {value.shape}")
    have[...] = jnp.asarray(value, jnp.float32)
  return layer


def conv_taps(weight: torch.Tensor, heads: int, dim: int) -> np.ndarray:
  """A depthwise Conv1d's [channels, 1, width] taps (oldest first, as its padding = width − 1
  then cut to the sequence makes them) as ours [width, heads, dim]."""
  return t2n(weight[:, 0, :]).T.reshape(-1, heads, dim)


def qwen3_next_params(mod) -> tuple[dict, dict]:
  """Qwen3NextGatedDeltaNet's weights as D's (mamba2 gate, GVA where num_v > num_k)."""
  K, V, H, J = mod.num_k_heads, mod.num_v_heads, mod.head_k_dim, mod.head_v_dim
  r = V // K
  # in_proj_qkvz rows are grouped per key head: [q (H), k (H), v (r J), z (r J)].
  qkvz = t2n(mod.in_proj_qkvz.weight).T.reshape(D_MODEL, K, 2 * H + 2 * r * J)
  ba = t2n(mod.in_proj_ba.weight).T.reshape(D_MODEL, K, 2 * r)
  conv = mod.conv1d.weight
  params = {
      "wq_DNH": qkvz[..., :H], "wk_DKH": qkvz[..., H:2 * H],
      "wv_DKH": qkvz[..., 2 * H:2 * H + r * J].reshape(D_MODEL, V, J),
      "w_out_gate_DNH": qkvz[..., 2 * H + r * J:].reshape(D_MODEL, V, J),
      "w_beta_DK": ba[..., :r].reshape(D_MODEL, V),
      "w_decay_DK": ba[..., r:].reshape(D_MODEL, V),
      "dt_bias_K": t2n(mod.dt_bias), "a_log_K": t2n(mod.A_log),
      "w_conv_q_WNH": conv_taps(conv[:K * H], K, H),
      "w_conv_k_WKH": conv_taps(conv[K * H:2 * K * H], K, H),
      "w_conv_v_WKH": conv_taps(conv[2 * K * H:], V, J),
      "out_norm_scale_H": t2n(mod.norm.weight),
      "wo_NHD": t2n(mod.out_proj.weight).T.reshape(V, J, D_MODEL),
  }
  options = dict(num_heads=K, num_kv_heads=K, head_dim=H, gate="head", gate_form="mamba2",
                 v_heads=V if V != K else 0, expand_v=J // H)
  return params, options


def kimi_params(mod) -> tuple[dict, dict]:
  """KimiLinearDeltaAttention's weights as D's (kda gate; its output gate has no bias here)."""
  N, H = mod.num_heads, mod.head_dim
  gate = mod.forget_gate
  conv = mod.conv1d.weight
  per_head = lambda w: t2n(w).T.reshape(-1, N, H)
  params = {
      "wq_DNH": per_head(mod.q_proj.weight), "wk_DKH": per_head(mod.k_proj.weight),
      "wv_DKH": per_head(mod.v_proj.weight),
      "w_conv_q_WNH": conv_taps(conv[:N * H], N, H),
      "w_conv_k_WKH": conv_taps(conv[N * H:2 * N * H], N, H),
      "w_conv_v_WKH": conv_taps(conv[2 * N * H:], N, H),
      "w_beta_DK": t2n(mod.b_proj.weight).T,
      "w_decay_down_DR": t2n(gate.f_a_proj.weight).T,
      "w_decay_up_RKH": per_head(gate.f_b_proj.weight),
      "dt_bias_KH": t2n(gate.dt_bias).reshape(N, H), "a_log_K": t2n(gate.A_log).reshape(N),
      "w_out_gate_down_DR": t2n(mod.g_a_proj.weight).T,
      "w_out_gate_up_RNH": per_head(mod.g_b_proj.weight),
      "out_gate_bias_NH": np.zeros((N, H), np.float32),
      "out_norm_scale_H": t2n(mod.o_norm.weight),
      "wo_NHD": t2n(mod.o_proj.weight).T.reshape(N, H, D_MODEL),
  }
  options = dict(num_heads=N, num_kv_heads=N, head_dim=H, gate="channel", gate_form="kda")
  return params, options


def qwen3_next_layers(num_v_heads: int, v_dim: int, seed: int):
  config = Qwen3NextConfig(
      vocab_size=64, hidden_size=D_MODEL, intermediate_size=64, num_hidden_layers=4,
      num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
      linear_num_value_heads=num_v_heads, linear_key_head_dim=16, linear_value_head_dim=v_dim,
      linear_conv_kernel_dim=4, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
      shared_expert_intermediate_size=32, rms_norm_eps=EPS)
  model = Qwen3NextForCausalLM(config).eval()
  layers = [b.linear_attn for b in model.model.layers if hasattr(b, "linear_attn")]
  for i, layer in enumerate(layers):
    randomise(layer, seed + i)
  return [(layer, *qwen3_next_params(layer)) for layer in layers]


def kimi_layers(seed: int):
  config = KimiLinearConfig(
      vocab_size=64, hidden_size=D_MODEL, intermediate_size=64, num_hidden_layers=4,
      num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16,
      qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, num_experts=2,
      num_experts_per_token=1, moe_intermediate_size=32, rms_norm_eps=EPS, pad_token_id=0,
      bos_token_id=1, eos_token_id=2,
      linear_attn_config={"head_dim": 16, "num_heads": 3, "short_conv_kernel_size": 4,
                          "kda_layers": [1, 2, 3], "full_attn_layers": [4]})
  model = KimiLinearForCausalLM(config).eval()
  layers = [b.self_attn for b in model.model.layers
            if type(b.self_attn).__name__ == "KimiLinearDeltaAttention"]
  for i, layer in enumerate(layers):
    randomise(layer, seed + i)
  return [(layer, *kimi_params(layer)) for layer in layers]


def compare(name: str, layers, rows: list[str]) -> bool:
  ok = True
  x = np.random.default_rng(0).normal(size=(ROWS, T, D_MODEL)).astype(np.float32)
  for i, (theirs, params, options) in enumerate(layers):
    with torch.no_grad():
      want = t2n(theirs(torch.from_numpy(x)))
    got = np.asarray(ours(params, **options)(jnp.asarray(x), positions_BT=None,
                                             segment_ids_BT=None))
    err = float(np.abs(got - want).max() / np.abs(want).max())
    ok &= err <= TOLERANCE
    rows.append(f"| {name} | {i} | {options['gate_form']} | {options.get('v_heads') or '='} "
                f"| {options.get('expand_v', 1)} | {err:.2e} | {'ok' if err <= TOLERANCE else 'FAIL'} |")
  return ok


def main() -> int:
  torch.manual_seed(0)
  rows = ["| model | layer | gate form | value heads | expand_v | rel max err | |",
          "|---|---|---|---|---|---|---|"]
  ok = compare("qwen3_next", qwen3_next_layers(2, 16, seed=10), rows)
  ok &= compare("qwen3_next gva", qwen3_next_layers(4, 16, seed=20), rows)
  ok &= compare("qwen3_next gva dv", qwen3_next_layers(4, 32, seed=30), rows)
  ok &= compare("kimi_linear", kimi_layers(seed=40), rows)
  print("\n".join(rows))
  print(f"tolerance {TOLERANCE:g} (relative to the largest output), T={T}, rows={ROWS}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
