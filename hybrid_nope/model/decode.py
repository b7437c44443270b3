"""Generation with a cache: the prompt in one forward pass, then one jitted step per new token.

  ids = decode.generate(model, prompt_ids, max_new_tokens, temperature=0.0, top_p=1.0, seed=0,
                        eos_id=None)

`model` is a LanguageModel with its parameters, e.g. from a workdir:

  step, model_def, params = model.checkpointed.restore_params(run.open_readonly(workdir))
  model = model_def.bind(params)

`prompt_ids` is one 1-D int array or a list of them (any lengths); the result is a list with one
int32 array per prompt holding the new tokens only, ending at the first `eos_id` (included) or
after `max_new_tokens`. Temperature 0 is greedy (argmax); otherwise temperature and nucleus
(top-p) sampling from jax.random.key(seed) (model/sampling.py).

Prompts of different lengths are padded on the left, so every row's next token sits at the same
column and one index writes every row's cache; each row keeps its own positions (0 at its first
token) and masks its padding, so a row decodes as it would alone.

The prompt pass is the model's own forward (its kernels, segment ids marking the padding); a
step runs the same blocks on one token per row, with each mixer's output taken from its cached
decoder instead (model/decode_layers.py) through the forward's `observe` argument. Both are
compiled once per prompt shape and `max_new_tokens`; the token loop is a lax.while_loop that
stops when every row has emitted `eos_id`.
"""
from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_nope.model import sampling
from hybrid_nope.model.decode_layers import DecodeError
from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.transformer import LanguageModel

PAD_ID = 0  # Fills the left padding; masked, so any id would do.


def _mixer_inputs(capture: dict):
  """An `observe` that keeps each layer's mixer input (the "pre_mixer_norm" boundary)."""
  def observe(layer, name, x):
    if name == "pre_mixer_norm":
      capture[layer] = x
    return x
  return observe


def prefill(model: LanguageModel, tokens_BT, start_B, capacity: int):
  """(logits [B, T, V] of the prompt, every layer's cache) for left-padded prompts."""
  columns_T = jnp.arange(tokens_BT.shape[1])
  positions_BT = jnp.maximum(columns_T[None, :] - start_B[:, None], 0)
  segment_ids_BT = (columns_T[None, :] >= start_B[:, None]).astype(jnp.int32)  # 0 = padding
  inputs = {}
  logits_BTV = model(tokens_BT, positions_BT=positions_BT, segment_ids_BT=segment_ids_BT,
                     observe=_mixer_inputs(inputs))
  caches = [decoder_for(kind).prefill(block.attn, inputs[layer], positions_BT, start_B, capacity)
            for layer, (kind, block) in enumerate(zip(model.kinds, model.blocks))]
  return logits_BTV, caches


def step(model: LanguageModel, caches: list, tokens_B, column, start_B):
  """(logits [B, V] of the token after `tokens_B`, the caches holding it): one token per row at
  `column`, through the model's own blocks with each mixer's output from its decoder."""
  positions_B1 = (column - start_B)[:, None]
  inputs, updated = {}, list(caches)

  def observe(layer, name, x):
    if name == "pre_mixer_norm":
      inputs[layer] = x
    elif name == "mixer":  # The block's own mixer output on one token is discarded (unused).
      y, updated[layer] = decoder_for(model.kinds[layer]).step(
          model.blocks[layer].attn, caches[layer], inputs[layer], positions_B1, column, start_B)
      return y
    return x

  logits_B1V = model(tokens_B[:, None], positions_BT=positions_B1, segment_ids_BT=None,
                     observe=observe)
  return logits_B1V[:, 0], updated


def decoder_for(letter: str):
  """The decoder of a pattern letter (its spec's); DecodeError for a kind that has none."""
  decoder = KINDS[letter].decoder if letter in KINDS else None
  if decoder is None:
    decodable = sorted(k for k, spec in KINDS.items() if spec.decoder is not None)
    raise DecodeError(f"layer kind {letter!r} has no incremental decoder yet (decoding supports "
                      f"{decodable}; model/decode_layers.py)")
  return decoder


def _check_decodable(model: LanguageModel) -> None:
  for kind in sorted(set(model.kinds)):
    decoder_for(kind)


def left_pad(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [B, T], start [B]): each prompt right-aligned in a row of the longest's length."""
  if not prompts or any(np.ndim(p) != 1 or len(p) == 0 for p in prompts):
    raise DecodeError("expected one or more non-empty 1-D prompts of token ids")
  width = max(len(p) for p in prompts)
  tokens = np.full((len(prompts), width), PAD_ID, np.int32)
  start = np.array([width - len(p) for p in prompts], np.int32)
  for row, p in enumerate(prompts):
    tokens[row, start[row]:] = p
  return tokens, start


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity", "temperature", "top_p"))
def _prefill(state, tokens_BT, start_B, key, *, graphdef, capacity, temperature, top_p):
  """(first new token [B], caches, key)."""
  logits_BTV, caches = prefill(nnx.merge(graphdef, state), tokens_BT, start_B, capacity)
  key, sub = jax.random.split(key)
  first_B = sampling.next_token(logits_BTV[:, -1], sub, temperature=temperature, top_p=top_p)
  return first_B, caches, key


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature",
                                             "top_p"))
def _decode(state, first_B, caches, start_B, key, prompt_width, eos, *, graphdef, max_new_tokens,
            temperature, top_p):
  """(new tokens [B, max_new_tokens], how many were made): after a row emits `eos` (-1: none)
  it repeats it; the loop ends when every row has, or at max_new_tokens."""
  model = nnx.merge(graphdef, state)
  out_BN = jnp.full((first_B.shape[0], max_new_tokens), eos, jnp.int32).at[:, 0].set(first_B)

  def running(carry):
    made, _, _, _, _, done_B = carry
    return (made < max_new_tokens) & ~jnp.all(done_B)

  def one_token(carry):
    made, token_B, caches, key, out_BN, done_B = carry
    logits_BV, caches = step(model, caches, token_B, prompt_width + made - 1, start_B)
    key, sub = jax.random.split(key)
    picked_B = sampling.next_token(logits_BV, sub, temperature=temperature, top_p=top_p)
    token_B = jnp.where(done_B, eos, picked_B)
    out_BN = jax.lax.dynamic_update_slice_in_dim(out_BN, token_B[:, None], made, axis=1)
    return made + 1, token_B, caches, key, out_BN, done_B | (token_B == eos)

  carry = (jnp.int32(1), first_B, caches, key, out_BN, first_B == eos)
  made, _, _, _, out_BN, _ = jax.lax.while_loop(running, one_token, carry)
  return out_BN, made


class Generator:
  """One model, sampling rule and `max_new_tokens`; compiled once per prompt batch shape (the
  compiled programs are shared by every Generator of the same model graph and settings).
  `prefill` and `decode` are separate calls, and `compile` compiles both ahead of them, so that
  compilation, prompt and token loop can be timed apart."""

  def __init__(self, model: LanguageModel, max_new_tokens: int, *, temperature: float = 0.0,
               top_p: float = 1.0, eos_id: int | None = None):
    _check_decodable(model)
    sampling.check(temperature, top_p)
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
      raise DecodeError(f"max_new_tokens={max_new_tokens!r}: expected an integer >= 1")
    vocab_size = model.embed.vocab_size
    if eos_id is not None and not 0 <= eos_id < vocab_size:
      raise DecodeError(f"eos_id={eos_id}: expected an id in [0, {vocab_size})")
    self.graphdef, self.state = nnx.split(model)
    self.max_new_tokens = int(max_new_tokens)
    self.eos_id = eos_id
    self.sampling = dict(temperature=float(temperature), top_p=float(top_p))
    self._programs = {}  # prompt batch shape -> (prefill, decode) compiled ahead of time

  def _prefill_args(self, tokens_BT, start_B, key):
    capacity = tokens_BT.shape[1] + self.max_new_tokens - 1  # Columns a step ever writes.
    return ((self.state, tokens_BT, start_B, key),
            dict(graphdef=self.graphdef, capacity=capacity, **self.sampling))

  def _decode_args(self, first_B, caches, start_B, key, prompt_width):
    eos = -1 if self.eos_id is None else self.eos_id
    return ((self.state, first_B, caches, start_B, key, jnp.int32(prompt_width), jnp.int32(eos)),
            dict(graphdef=self.graphdef, max_new_tokens=self.max_new_tokens, **self.sampling))

  def compile(self, tokens_BT, start_B) -> float:
    """Compiles both programs for this prompt batch's shape; returns the seconds it took."""
    begin = time.perf_counter()
    args, static = self._prefill_args(tokens_BT, start_B, jax.random.key(0))
    prefill_program = _prefill.lower(*args, **static).compile()
    first_B, caches, key = jax.eval_shape(functools.partial(_prefill, **static), *args)
    args, static = self._decode_args(first_B, caches, start_B, key, tokens_BT.shape[1])
    self._programs[tokens_BT.shape] = (prefill_program, _decode.lower(*args, **static).compile())
    return time.perf_counter() - begin

  def prefill(self, tokens_BT, start_B, key):
    """(first new token [B], caches, key) of left-padded prompts (`left_pad`)."""
    args, static = self._prefill_args(tokens_BT, start_B, key)
    if tokens_BT.shape in self._programs:
      return self._programs[tokens_BT.shape][0](*args)
    return _prefill(*args, **static)

  def decode(self, first_B, caches, start_B, key, prompt_width: int):
    """(new tokens [B, max_new_tokens], how many the loop made, the first included)."""
    args, static = self._decode_args(first_B, caches, start_B, key, prompt_width)
    if (first_B.shape[0], prompt_width) in self._programs:
      return self._programs[(first_B.shape[0], prompt_width)][1](*args)
    return _decode(*args, **static)

  def __call__(self, prompts: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    tokens_BT, start_B = left_pad([np.asarray(p, np.int32) for p in prompts])
    first_B, caches, key = self.prefill(tokens_BT, start_B, jax.random.key(seed))
    out_BN, _ = self.decode(first_B, caches, start_B, key, tokens_BT.shape[1])
    return self.rows(out_BN)

  def rows(self, out_BN) -> list[np.ndarray]:
    """Each row's new tokens up to its first eos_id, included."""
    rows = []
    for row in np.asarray(jax.device_get(out_BN)):
      ends = np.flatnonzero(row == self.eos_id) if self.eos_id is not None else []
      rows.append(row[:ends[0] + 1] if len(ends) else row)
    return rows


def generate(model: LanguageModel, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, eos_id: int | None = None):
  """New token ids after each prompt (see the module docstring): a list of int32 arrays for a
  list of prompts, one array for one 1-D prompt."""
  single = isinstance(prompt_ids, np.ndarray | jax.Array) and np.ndim(prompt_ids) == 1
  prompts = [prompt_ids] if single else list(prompt_ids)
  rows = Generator(model, max_new_tokens, temperature=temperature, top_p=top_p,
                   eos_id=eos_id)(prompts, seed)
  return rows[0] if single else rows
