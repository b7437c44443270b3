"""The config of an exported hybrid with gated linear attention (L) or gated delta rule (D)
layers: SmolLM3's, plus what those layers need (modeling_hybrid_nope.py is the model).

Copied into the export directory by hybrid_nope/export/hf.py and loaded from there by
`transformers.AutoConfig.from_pretrained(OUT, trust_remote_code=True)` (config.json's auto_map).
Needs torch and transformers 5.x; nothing in hybrid_nope imports it.
"""
from huggingface_hub.dataclasses import strict
from transformers import SmolLM3Config


@strict
class HybridNopeConfig(SmolLM3Config):
  r"""
  layer_kinds (`str`): one letter per layer, hybrid_nope's model.pattern repeated to
      num_hidden_layers: S sliding-window attention, G global attention (both SmolLM3 layers,
      chosen by `layer_types`), L gated linear attention, D gated delta rule (`layer_types`
      "linear_attention", which gives them a recurrent-state cache layer).
  gate_rank (`int`), gate_temperature (`float`): the L and D gate,
      log α = logsigmoid(x W_1 W_2 + b) / τ with W_1 W_2 of rank `gate_rank` and τ the temperature.
  delta_gate (`str`): D layers' decay, "head" (one α per kv head) or "channel" (one per key
      channel).
  conv_width (`int`): width of D layers' causal depthwise convolutions on q, k and v.
  """

  model_type = "hybrid_nope"

  layer_kinds: str | None = None  # None only in a default-constructed config (to_diff_dict's)
  gate_rank: int = 16
  gate_temperature: float = 16.0
  delta_gate: str = "head"
  conv_width: int = 4

  def __post_init__(self, **kwargs):
    super().__post_init__(**kwargs)
    kinds = self.layer_kinds
    if kinds is not None and (len(kinds) != self.num_hidden_layers or set(kinds) - set("SGLD")):
      raise ValueError(f"layer_kinds={self.layer_kinds!r}: expected one of the letters S, G, L, "
                       f"D per layer ({self.num_hidden_layers} layers)")
    if self.delta_gate not in ("head", "channel"):
      raise ValueError(f"delta_gate={self.delta_gate!r}: expected 'head' or 'channel'")


__all__ = ["HybridNopeConfig"]
