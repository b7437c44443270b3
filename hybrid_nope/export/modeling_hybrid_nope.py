"""Hybrid NoPE models in transformers (trust_remote_code): SmolLM3's decoder for the attention
layers (S, G) and two recurrent token mixers written from their published formulas.

  L  gated linear attention (GLA; Yang et al. 2023), per kv head a state S [key, value]:
       log α_t = logsigmoid(x_t W_1 W_2 + b) / τ                 one per key channel
       S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,   o_t = H^(−1/2) q_tᵀ S_t
  D  gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024; with a per-channel gate
     Kimi Delta Attention), per kv head a state S [value, key]:
       q, k, v = silu(causal depthwise conv(x W)), the window inside the document
       q, k ← x / sqrt(Σx² + 1e−6) per head;  β_t = sigmoid(x_t W_β) per kv head
       log α_t as L's, one per kv head or per key channel
       S_t = S_{t−1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   o_t = S_t q_t
  both  y_t = W_O (RMSNorm_head(o_t) ⊙ silu(x_t W_G));  GQA: query head n reads kv head
        n // (N / K)

Documents: a state (and D's convolution window) starts empty where position_ids restart
(position_ids[t] ≠ position_ids[t − 1] + 1, or 0 at a call's first token), the rule SmolLM3's
masks follow for its attention layers in a packed row; a padding token (attention_mask 0)
leaves the state as it was. Decoding: DynamicCache(config) gives each "linear_attention" layer
a LinearAttentionLayer, which holds the float32 state and, for D, the last conv_width − 1
projected inputs. The recurrence runs token by token in float32: exact, O(T) small steps.

hybrid_nope/export/hf.py copies this file and configuration_hybrid_nope.py into an export and
names them in config.json's auto_map; tests/hf/check_hf.py checks the logits against hybrid_nope.
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import (create_causal_mask, create_recurrent_attention_mask,
                                        create_sliding_window_causal_mask)
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.smollm3.modeling_smollm3 import (SmolLM3DecoderLayer, SmolLM3ForCausalLM,
                                                          SmolLM3PreTrainedModel, SmolLM3RMSNorm,
                                                          SmolLM3RotaryEmbedding)
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_hybrid_nope import HybridNopeConfig

L2_EPS = 1e-6  # q, k / sqrt(Σx² + eps) in D layers, as fla's l2norm and hybrid_nope's kernel


def document_starts(position_ids: torch.Tensor, batch: int) -> torch.Tensor:
  """[B, T] bool: a document starts at t (its state and convolution window begin empty)."""
  positions = position_ids.expand(batch, -1)
  starts = torch.empty_like(positions, dtype=torch.bool)
  starts[:, 0] = positions[:, 0] == 0  # Within a call a restart; at its first token, position 0.
  starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
  return starts


def cached_state(cache: Cache | None, layer_idx: int) -> torch.Tensor | None:
  """The layer's recurrent state in the cache, None before its first write. Read off the cache
  layer: Cache.get_recurrent_state counts a state only once a conv state was written (every
  transformers recurrent model has a convolution; L layers have none)."""
  if cache is None:
    return None
  layer = cache.layers[layer_idx]
  return layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else None


def l2norm(x: torch.Tensor) -> torch.Tensor:
  return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


class RecurrentMixer(nn.Module):
  """What L and D layers share: q, k, v projections, the low-rank decay gate, and the output
  (per-head RMSNorm, swish gate, W_O). Subclasses give `mix`: (x, starts, valid, cache) ->
  o [B, T, N, H] float32."""

  def __init__(self, config: HybridNopeConfig, layer_idx: int, gate_width: int):
    super().__init__()
    D, N, K, H = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                  config.head_dim)
    self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = layer_idx, N, K, H
    self.gate_temperature = config.gate_temperature
    self.q_proj = nn.Linear(D, N * H, bias=False)
    self.k_proj = nn.Linear(D, K * H, bias=False)
    self.v_proj = nn.Linear(D, K * H, bias=False)
    self.gate_down_proj = nn.Linear(D, config.gate_rank, bias=False)
    self.gate_up_proj = nn.Linear(config.gate_rank, gate_width, bias=True)
    self.out_gate_proj = nn.Linear(D, N * H, bias=False)
    self.out_norm = SmolLM3RMSNorm(H, eps=config.rms_norm_eps)
    self.o_proj = nn.Linear(N * H, D, bias=False)

  def log_decay(self, x: torch.Tensor) -> torch.Tensor:
    """log α [B, T, gate_width], float32."""
    return F.logsigmoid(self.gate_up_proj(self.gate_down_proj(x)).float()) / self.gate_temperature

  def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
              **kwargs):
    """SmolLM3DecoderLayer's call of its self_attn; attention_mask is the [B, T] padding mask
    of create_recurrent_attention_mask (None: no padding)."""
    B, T, _ = hidden_states.shape
    valid = None if attention_mask is None else attention_mask.bool()
    o = self.mix(hidden_states, document_starts(position_ids, B), valid, past_key_values)
    gate = F.silu(self.out_gate_proj(hidden_states)).view(B, T, self.num_heads, self.head_dim)
    y = self.out_norm(o.to(hidden_states.dtype)) * gate
    return self.o_proj(y.reshape(B, T, -1)), None

  def recur(self, step, state, starts, valid, cache, *inputs):
    """Runs `step(state, keep [B], *inputs at t) -> (state, out_t)` over time from the cached
    (or a zero) state; keep is 0 where a document starts; a padding token keeps the state.
    Returns the outputs stacked on axis 1, and stores the last state in the cache."""
    previous = cached_state(cache, self.layer_idx)
    state = state if previous is None else previous
    outs = []
    for t in range(starts.shape[1]):
      new, out = step(state, (~starts[:, t]).float(), *(x[:, t] for x in inputs))
      state = new if valid is None else torch.where(valid[:, t, None, None, None], new, state)
      outs.append(out)
    if cache is not None:
      cache.update_recurrent_state(state, self.layer_idx)
    return torch.stack(outs, 1)


class GatedLinearAttention(RecurrentMixer):
  """L: S_t = diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = H^(−1/2) q_tᵀ S_t; S [B, K, key, value]."""

  def __init__(self, config: HybridNopeConfig, layer_idx: int):
    super().__init__(config, layer_idx,
                     gate_width=config.num_key_value_heads * config.head_dim)

  def mix(self, x, starts, valid, cache):
    B, T, _ = x.shape
    N, K, H = self.num_heads, self.num_kv_heads, self.head_dim
    q = self.q_proj(x).view(B, T, K, N // K, H).float()
    k, v = (proj(x).view(B, T, K, H).float() for proj in (self.k_proj, self.v_proj))
    alpha = self.log_decay(x).view(B, T, K, H).exp()

    def step(S, keep, q, k, v, alpha):
      S = S * (alpha * keep[:, None, None])[..., None] + k[..., :, None] * v[..., None, :]
      return S, torch.einsum("bkgh,bkhv->bkgv", q, S)

    zero = x.new_zeros(B, K, H, H, dtype=torch.float32)
    out = self.recur(step, zero, starts, valid, cache, q, k, v, alpha)
    return out.reshape(B, T, N, H) * H ** -0.5


class GatedDeltaNet(RecurrentMixer):
  """D: S_t = S_{t−1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t; S [B, K,
  value, key]; q, k, v through a causal depthwise convolution that stays in its document."""

  def __init__(self, config: HybridNopeConfig, layer_idx: int):
    K, H = config.num_key_value_heads, config.head_dim
    super().__init__(config, layer_idx, gate_width=K * H if config.delta_gate == "channel" else K)
    W, N = config.conv_width, config.num_attention_heads
    # nn.Conv1d's depthwise layout [channels, 1, width], taps oldest first; applied by `conv`.
    self.q_conv1d = nn.Conv1d(N * H, N * H, W, groups=N * H, bias=False)
    self.k_conv1d = nn.Conv1d(K * H, K * H, W, groups=K * H, bias=False)
    self.v_conv1d = nn.Conv1d(K * H, K * H, W, groups=K * H, bias=False)
    self.beta_proj = nn.Linear(config.hidden_size, K, bias=False)
    self.conv_width = W

  def conv(self, projected, starts, cache):
    """silu(depthwise causal conv) of projected [B, T, C] (q, k, v channels side by side), each
    window zero before its document's start; the cache keeps the last width − 1 inputs of the
    ongoing document (transformers' conv-state layout [B, C, width − 1])."""
    B, T, C = projected.shape
    lag = self.conv_width - 1
    docs = starts.long().cumsum(1)  # 0: the document the cache holds; k: the k-th started here
    past = None if cache is None else cache.get_conv_state(self.layer_idx)
    past = projected.new_zeros(B, lag, C) if past is None else past.transpose(1, 2)
    inputs, input_docs = torch.cat([past, projected], 1), F.pad(docs, (lag, 0))
    same = input_docs.unfold(1, self.conv_width, 1) == docs[..., None]  # [B, T, width]
    windows = inputs.unfold(1, self.conv_width, 1) * same[:, :, None, :]  # [B, T, C, width]
    weight = torch.cat([c.weight[:, 0] for c in (self.q_conv1d, self.k_conv1d, self.v_conv1d)])
    if cache is not None:
      ongoing = (input_docs[:, -lag:] == docs[:, -1:])[..., None]
      cache.update_conv_state((inputs[:, -lag:] * ongoing).transpose(1, 2), self.layer_idx)
    return F.silu(torch.einsum("btcw,cw->btc", windows, weight))

  def mix(self, x, starts, valid, cache):
    B, T, _ = x.shape
    N, K, H = self.num_heads, self.num_kv_heads, self.head_dim
    if valid is not None:  # Padding inputs are zero in every convolution window.
      x = x * valid[..., None].to(x.dtype)
    projected = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
    q, k, v = self.conv(projected, starts, cache).float().split([N * H, K * H, K * H], -1)
    q = l2norm(q.view(B, T, K, N // K, H))
    k, v = l2norm(k.view(B, T, K, H)), v.view(B, T, K, H)
    beta = torch.sigmoid(self.beta_proj(x).float())  # [B, T, K]
    alpha = self.log_decay(x).view(B, T, K, -1).exp()  # [B, T, K, 1 or H]

    def step(S, keep, q, k, v, beta, alpha):
      S = S * (alpha * keep[:, None, None])[:, :, None, :]  # S_{t−1} diag(α_t)
      error = v - torch.einsum("bkvd,bkd->bkv", S, k)  # v_t − S' k_t
      S = S + (beta[..., None] * error)[..., :, None] * k[..., None, :]
      return S, torch.einsum("bkvd,bkgd->bkgv", S, q)

    zero = x.new_zeros(B, K, H, H, dtype=torch.float32)
    return self.recur(step, zero, starts, valid, cache, q, k, v, beta, alpha).reshape(B, T, N, H)


MIXERS = {"L": GatedLinearAttention, "D": GatedDeltaNet}


class HybridNopeDecoderLayer(SmolLM3DecoderLayer):
  """SmolLM3's pre-norm block, its self_attn replaced by the L or D mixer in those layers."""

  def __init__(self, config: HybridNopeConfig, layer_idx: int):
    super().__init__(config, layer_idx)
    kind = config.layer_kinds[layer_idx]
    if kind in MIXERS:
      self.self_attn = MIXERS[kind](config, layer_idx)


class HybridNopePreTrainedModel(SmolLM3PreTrainedModel):
  config_class = HybridNopeConfig
  config: HybridNopeConfig
  _no_split_modules = ["HybridNopeDecoderLayer"]
  _is_stateful = True  # No rollback of a recurrent state: generate refuses assisted decoding.


class HybridNopeModel(HybridNopePreTrainedModel):

  def __init__(self, config: HybridNopeConfig):
    super().__init__(config)
    if config.layer_kinds is None:
      raise ValueError("config.layer_kinds is missing: expected one letter (S, G, L, D) a layer")
    self.padding_idx, self.vocab_size = config.pad_token_id, config.vocab_size
    self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
    self.layers = nn.ModuleList([HybridNopeDecoderLayer(config, i)
                                 for i in range(config.num_hidden_layers)])
    self.norm = SmolLM3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    self.rotary_emb = SmolLM3RotaryEmbedding(config=config)
    self.gradient_checkpointing = False
    self.post_init()

  @merge_with_config_defaults
  @capture_outputs
  def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
              inputs_embeds=None, use_cache=None, **kwargs) -> BaseModelOutputWithPast:
    if (input_ids is None) ^ (inputs_embeds is not None):
      raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
    if inputs_embeds is None:
      inputs_embeds = self.embed_tokens(input_ids)
    if use_cache and past_key_values is None:
      past_key_values = DynamicCache(config=self.config)
    if position_ids is None:
      past = past_key_values.get_seq_length() if past_key_values is not None else 0
      position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past
      position_ids = position_ids.unsqueeze(0)
    masks = attention_mask
    if not isinstance(masks, dict):  # generate() may have built them already.
      mask_kwargs = {"config": self.config, "inputs_embeds": inputs_embeds,
                     "attention_mask": attention_mask, "past_key_values": past_key_values,
                     "position_ids": position_ids}
      builders = {"full_attention": create_causal_mask,
                  "sliding_attention": create_sliding_window_causal_mask,
                  "linear_attention": create_recurrent_attention_mask}
      masks = {t: builders[t](**mask_kwargs) for t in set(self.config.layer_types)}
    hidden_states = inputs_embeds
    position_embeddings = self.rotary_emb(hidden_states, position_ids)
    for i, decoder_layer in enumerate(self.layers[:self.config.num_hidden_layers]):
      hidden_states = decoder_layer(
          hidden_states, attention_mask=masks[self.config.layer_types[i]],
          position_embeddings=position_embeddings, position_ids=position_ids,
          past_key_values=past_key_values, use_cache=use_cache, **kwargs)
    return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states),
                                   past_key_values=past_key_values if use_cache else None)


class HybridNopeForCausalLM(HybridNopePreTrainedModel, SmolLM3ForCausalLM):
  """SmolLM3ForCausalLM's head and forward on HybridNopeModel."""

  def __init__(self, config: HybridNopeConfig):
    HybridNopePreTrainedModel.__init__(self, config)
    self.model = HybridNopeModel(config)
    self.vocab_size = config.vocab_size
    self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    self.post_init()


__all__ = ["HybridNopeForCausalLM", "HybridNopeModel", "HybridNopePreTrainedModel"]
