"""One spec per layer kind (a letter of `model.pattern`): everything the rest of the code asks
about a kind. Nothing outside this module compares a letter (tests/test_layer_kind_letters.py).

  S  sliding-window attention   records' layer_type "swa"     a local mixer (window w)
  G  global causal attention    "global"                      NoPE by default: reads recency out
  L  gated linear attention     "linear"                      a local mixer (data-dependent decay)
  D  gated delta rule           "delta"                       a local mixer (decay and erase)

Packages that sit beside model (train, analysis, export, validate) read the fields: plain data,
or callables of the model config.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
from flax import nnx

from hybrid_nope.config_values import boolean
from hybrid_nope.errors import ConfigError
from hybrid_nope.model import decode_layers, delta, mixer_costs
from hybrid_nope.model.attention import Attention
from hybrid_nope.model.delta import DeltaAttention
from hybrid_nope.model.gla import GatedLinearAttention


def _no_config_checks(config) -> None:
  del config


def _no_remote_config(m) -> dict:
  del m
  return {}


@dataclasses.dataclass(frozen=True)
class LayerKind:
  letter: str
  layer_type: str    # `layer_type` in recency records (DESIGN.md)
  description: str
  local: bool        # a local mixer: plants recency into the residual stream
  windowed: bool     # reads model.window
  # Attends to the whole prefix: its logits can read recency out (where NoPE), and under
  # mesh.sequence it keeps the whole row's gathered keys and values.
  global_attention: bool
  # Carries a state between tokens instead of attending: extra activations kept for the
  # backward pass; SmolLM3 lacks it, so the export writes it with modeling_hybrid_nope.py.
  recurrent: bool
  position_key: str | None  # the model.* key of its position encoding (attention kinds)
  # (model config, shared shape kwargs) -> the block's token mixer (`Block.attn`).
  build_mixer: Callable[[Any, dict], nnx.Module]
  decoder: Any  # model/decode_layers.py: prefill and step of incremental decoding
  mixer_params: Callable[[Any], int]           # matmul parameters of the mixer (train/flops.py)
  mixing_flops: Callable[[Any, int], float]    # (model config, seq_len) -> forward FLOPs/token
  # The recency hook's extras: (name, (mixer, x_BTD) -> gate) whose token means it records at
  # the mixer's input; the records' laws follow them (decay: α^d; decay and beta: the delta law).
  recorded_gates: tuple[tuple[str, Callable], ...] = ()
  check_config: Callable[[Any], None] = _no_config_checks  # raises ConfigError (validate.py)
  hf_layer_type: str = ""  # config.json's layer_types entry
  # model.* keys the HF export writes at one value only (their values here).
  hf_fixed_keys: dict = dataclasses.field(default_factory=dict)
  hf_remote_config: Callable[[Any], dict] = _no_remote_config  # config.json's extra fields

  def position(self, m) -> str | None:
    """The position encoding ("rope" or "nope") of an attention kind; None for a recurrent one."""
    return getattr(m, self.position_key) if self.position_key else None


def _attention(window_key: str | None, position_key: str):
  def build(cfg, shape: dict) -> nnx.Module:
    return Attention(window=getattr(cfg, window_key) if window_key else None,
                     position=getattr(cfg, position_key),
                     rope_theta=cfg.rope_theta, impl=cfg.attention_impl, **shape)
  return build


def _gla(cfg, shape: dict) -> nnx.Module:
  return GatedLinearAttention(norm_eps=cfg.norm_eps, impl=cfg.linear_impl, **shape)


def _delta(cfg, shape: dict) -> nnx.Module:
  return DeltaAttention(norm_eps=cfg.norm_eps, gate=cfg.delta_gate, impl=cfg.delta_impl,
                        gate_form=cfg.delta_gate_form, expand_v=cfg.delta_expand_v,
                        v_heads=cfg.delta_v_heads, qk_scale=cfg.delta_qk_scale,
                        allow_neg_eigval=cfg.delta_allow_neg_eigval, **shape)


def _check_delta_config(config) -> None:
  m = config.model
  boolean(config, "model.delta_allow_neg_eigval")
  try:
    delta.check_shape(gate_form=m.delta_gate_form, gate=m.delta_gate, num_heads=m.num_heads,
                      num_kv_heads=m.num_kv_heads, v_heads=m.delta_v_heads,
                      expand_v=m.delta_expand_v, qk_scale=m.delta_qk_scale)
  except ValueError as e:
    raise ConfigError(str(e)) from None


DECAY = ("decay", lambda mixer, x_BTD: jnp.exp(mixer.log_decay(x_BTD)))
BETA = ("beta", lambda mixer, x_BTD: mixer.beta(x_BTD))

KINDS = {k.letter: k for k in (
    LayerKind("S", "swa", "sliding-window attention", local=True, windowed=True,
              global_attention=False, recurrent=False, position_key="swa_pos",
              build_mixer=_attention("window", "swa_pos"),
              decoder=decode_layers.AttentionDecoder(),
              mixer_params=mixer_costs.attention_params,
              mixing_flops=lambda m, T: mixer_costs.attention_flops_per_token(m, T, m.window),
              hf_layer_type="sliding_attention"),
    LayerKind("G", "global", "global attention", local=False, windowed=False,
              global_attention=True, recurrent=False, position_key="global_pos",
              build_mixer=_attention(None, "global_pos"),
              decoder=decode_layers.AttentionDecoder(),
              mixer_params=mixer_costs.attention_params,
              mixing_flops=lambda m, T: mixer_costs.attention_flops_per_token(m, T, None),
              hf_layer_type="full_attention"),
    LayerKind("L", "linear", "gated linear attention", local=True, windowed=False,
              global_attention=False, recurrent=True, position_key=None, build_mixer=_gla,
              decoder=decode_layers.LinearDecoder(), mixer_params=mixer_costs.linear_params,
              mixing_flops=mixer_costs.linear_mixing_flops, recorded_gates=(DECAY,),
              hf_layer_type="linear_attention"),
    LayerKind("D", "delta", "gated delta rule (Gated DeltaNet)", local=True, windowed=False,
              global_attention=False, recurrent=True, position_key=None, build_mixer=_delta,
              decoder=decode_layers.DeltaDecoder(), mixer_params=mixer_costs.delta_params,
              mixing_flops=mixer_costs.delta_mixing_flops, recorded_gates=(DECAY, BETA),
              check_config=_check_delta_config, hf_layer_type="linear_attention",
              # modeling_hybrid_nope.py writes the first form only (the published forms are
              # tests/hf/check_delta_hf.py's parity, not an export yet).
              hf_fixed_keys={"delta_gate_form": "gla", "delta_expand_v": 1, "delta_v_heads": 0,
                             "delta_qk_scale": "1", "delta_allow_neg_eigval": False},
              hf_remote_config=lambda m: {"delta_gate": m.delta_gate,
                                          "conv_width": delta.CONV_WIDTH}),
)}

# The letter of each SmolLM3 attention layer type (the HF import reads layer_types back).
LETTER_OF_HF_ATTENTION = {k.hf_layer_type: k.letter for k in KINDS.values() if not k.recurrent}


def kinds_where(kinds: str, predicate: Callable[[LayerKind], bool]) -> list[int]:
  """The layers (indices into `kinds`, one letter a layer) whose spec satisfies `predicate`."""
  return [i for i, k in enumerate(kinds) if predicate(KINDS[k])]


def has_local_mixer(pattern: str) -> bool:
  """Whether some letter of `pattern` is a local mixer (the global-only baseline has none)."""
  return any(KINDS[k].local for k in pattern)
