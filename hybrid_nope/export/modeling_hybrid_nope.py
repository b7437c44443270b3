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
projected inputs. The recurrence runs in chunks of CHUNK tokens in float32 (chunked_recurrence:
T/CHUNK steps, each a few batched matmuls and one triangular solve for D), exact up to rounding
with no difference of prefix sums; tests/hf/check_hf.py checks it against a float64 token loop.

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
CHUNK = 16  # Tokens per step (16 or 32 fastest on CPU: benchmarks/hf_recurrence.py).
LOG_ZERO = -1e30  # A log gate whose exp is 0 (a document start), finite so 0 · it is not NaN.


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


def sum_masks(C: int, device=None) -> torch.Tensor:
  """0/1 [2C + C², C]: rows i of Σ_{s<=i} (prefix), of Σ_{s>i} (suffix), then rows (i, j) of
  Σ_{j<s<=i} (pairwise)."""
  s, i = torch.arange(C, device=device), torch.arange(C, device=device)[:, None]
  j = torch.arange(C, device=device)[None, :, None]
  pairwise = (s > j) & (s <= i[:, :, None])  # [i, j, s]
  return torch.cat([s <= i, s > i, pairwise.reshape(C * C, C)]).float()


def gate_sums(g: torch.Tensor, masks: torch.Tensor):
  """Log-gate sums over chunks g [R, C, X] (finite, floored at LOG_ZERO): prefix Σ_{s<=i},
  suffix Σ_{s>i} [R, C, X] and pairwise Σ_{j<s<=i} [R, C(i), C(j), X] (0 for j >= i), as one
  product with `sum_masks`: each a direct sum of the gates it covers, never a difference of two
  prefixes (that loses the small sums after one strong decay, and is −inf − −inf at a document
  start); torch.cumsum over a middle axis was 30% of the forward."""
  R, C, X = g.shape
  sums = torch.matmul(masks, g)
  return sums[:, :C], sums[:, C:2 * C], sums[:, 2 * C:].view(R, C, C, X)


def intra_weights(q, k, decay, with_kk: bool):
  """qk [R, G, C, C] = Σ_d q_id k_jd decay_ijd and, for D, kk [R, C, C] the same for k_i·k_j,
  j < i. A scalar gate (X = 1) scales the plain dots; a per-channel one weighs every channel."""
  if decay.shape[-1] == 1:
    decay = decay[..., 0]
    qk = torch.einsum("rigd,rjd->rgij", q, k) * decay[:, None]
    kk = (k @ k.transpose(1, 2) * decay).tril(-1) if with_kk else None
    return qk, kk
  k_decayed = decay * k[:, None]  # [R, C(i), C(j), H]: k_j decayed from j to i
  qk = torch.einsum("rigd,rijd->rgij", q, k_decayed)
  kk = torch.einsum("rid,rijd->rij", k, k_decayed).tril(-1) if with_kk else None
  return qk, kk


def one_token(q, k, v, g, beta, h):
  """One step from h [B, K, key, value]: h' = diag(α) h + k uᵀ with u = v (L) or
  β (v − (diag(α) h)ᵀ k) (D); o = qᵀ h'. Returns (o [B, 1, K, G, H], h')."""
  h = h * g.float().exp()[..., :, None]
  u = v if beta is None else beta[..., None] * (v - torch.einsum("bkd,bkde->bke", k, h))
  h = h + k[..., :, None] * u[..., None, :]
  return torch.einsum("bkgd,bkde->bkge", q, h)[:, None], h


def chunked_recurrence(q, k, v, g, beta, state, chunk: int = CHUNK):
  """L (beta None) or D over chunks of `chunk` tokens, float32: exact up to rounding, T/chunk
  steps instead of T. q [B, T, K, G, H]; k, v [B, T, K, H] (D: l2-normalised); g [B, T, K, X]
  log gates (X = H, or 1: one per kv head), documents and padding already folded in; beta
  [B, T, K]; state [B, K, key, value] or None (zero). Returns o [B, T, K, G, H] (L without its
  H^(−1/2)) and the last state [B, K, key, value].

  Within a chunk, from the state h entering it, with Γ_i = exp(prefix_i):
    L  o_i = (Γ_i ⊙ q_i)ᵀ h + Σ_{j<=i} A_ij v_j,   A_ij = Σ_d q_id k_jd exp(pairwise_ijd)
       h' = diag(Γ_C) h + Σ_j (exp(suffix_j) ⊙ k_j) v_jᵀ
    D  the same with v_j replaced by the values the delta rule writes, u = Ũ − W h, where
       [W | Ũ] = (I + diag(β) KK)⁻¹ diag(β) [Γ ⊙ K | V] and KK_ij = Σ_d k_id k_jd
       exp(pairwise_ijd) for j < i (the WY / UT form of Gated DeltaNet's chunked algorithm).
  exp(LOG_ZERO) is 0: a document start zeroes every decay across it."""
  B, T, K, G, H = q.shape
  if T == 1:  # Decoding: the recurrence's own step, a third faster than a chunk of one.
    return one_token(q[:, 0], k[:, 0], v[:, 0], g[:, 0], None if beta is None else beta[:, 0],
                     q.new_zeros(B, K, H, H) if state is None else state.float())
  C = min(chunk, T)
  n = -(-T // C)
  pad = lambda x: F.pad(x, (0, 0) * (x.dim() - 2) + (0, n * C - T))  # Zero tail: no write.
  # [B, T, K, ...] -> [n, B·K, C, ...]: chunk-major, one batch of rows per chunk.
  chunks = lambda x: pad(x.float()).view(B, n, C, K, *x.shape[3:]).movedim(1, 0).movedim(
      3, 2).reshape(n, B * K, C, *x.shape[3:])
  q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(torch.clamp(g, min=LOG_ZERO))
  beta = None if beta is None else chunks(beta[..., None])[..., 0]
  h = q.new_zeros(B * K, H, H) if state is None else state.reshape(B * K, H, H).float()
  causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
  masks = sum_masks(C, q.device)
  outs = []
  for c in range(n):
    prefix, suffix, pairwise = gate_sums(g[c], masks)
    decay = torch.where(causal[None, :, :, None], pairwise.exp(), 0.0)  # [R, C, C, X]
    gamma = prefix.exp()
    qk, kk = intra_weights(q[c], k[c], decay, beta is not None)
    u = v[c]
    if beta is not None:
      system = torch.eye(C, device=q.device) + beta[c][..., None] * kk
      rhs = beta[c][..., None] * torch.cat([gamma * k[c], v[c]], -1)
      w, u_tilde = torch.linalg.solve_triangular(system, rhs, upper=False,
                                                 unitriangular=True).split(H, -1)
      u = u_tilde - w @ h
    outs.append(torch.einsum("rigd,rde->rgie", q[c] * gamma[:, :, None], h)
                + torch.einsum("rgij,rje->rgie", qk, u))
    h = gamma[:, -1, :, None] * h + (suffix.exp() * k[c]).transpose(1, 2) @ u
  o = torch.stack(outs)  # [n, B·K, G, C, H]
  o = o.view(n, B, K, G, C, H).permute(1, 0, 4, 2, 3, 5).reshape(B, n * C, K, G, H)[:, :T]
  return o, h.view(B, K, H, H)


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

  def recur(self, q, k, v, g, beta, starts, valid, cache, value_major):
    """The chunked recurrence (`chunked_recurrence`) from the cached (or a zero) state, with
    the documents and padding folded into the gates; stores the last state in the cache.
    value_major: the cache holds the state as [value, key] (D's layout)."""
    g = torch.where(starts[..., None, None], LOG_ZERO, g)
    if valid is not None:  # Padding neither decays, reads nor writes the state.
      keep = valid[..., None, None]
      g, k, v = torch.where(keep, g, 0.0), k * keep, v * keep
      beta = None if beta is None else beta * valid[..., None]
    state = cached_state(cache, self.layer_idx)
    if state is not None and value_major:
      state = state.transpose(-1, -2)
    out, state = chunked_recurrence(q, k, v, g, beta, state)
    if cache is not None:
      cache.update_recurrent_state(state.transpose(-1, -2) if value_major else state,
                                   self.layer_idx)
    return out


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
    g = self.log_decay(x).view(B, T, K, H)
    out = self.recur(q, k, v, g, None, starts, valid, cache, value_major=False)
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
    return F.silu((windows * weight).sum(-1))  # einsum here ran C tiny matmuls: 40% of D

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
    g = self.log_decay(x).view(B, T, K, -1)  # [B, T, K, 1 or H]
    return self.recur(q, k, v, g, beta, starts, valid, cache, value_major=True).reshape(
        B, T, N, H)


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
