# Tiers (pytest.ini): test_greedy_decoding_gives_the_forward_pass_logits_and_tokens prefills and
# decodes a whole model for each pattern (~30 s cold on 2 cores together), so by cost it is
# integration, `make test-all` only.
# test-all only: for every decodable pattern, greedy cached decoding gives the full forward
# pass's logits and tokens (test_greedy_decoding_gives_the_forward_pass_logits_and_tokens; each
# layer's decoder against the layer is checked in `make test` by test_model_decode_layers.py);
# each row stops at its own EOS and a tiny nucleus is greedy
# (test_each_row_stops_at_its_own_eos_and_a_tiny_nucleus_is_greedy, ~20 s cold).
"""Cached decoding gives the full forward pass's logits and tokens, for every decodable pattern."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.model import decode
from hybrid_nope.model.decode_layers import DecodeError
from hybrid_nope.model.transformer import LanguageModel
from tests.helpers import tiny_config

# Window 3 < every sequence here, so the SWA ring buffer wraps; 4 query heads on 2 kv heads
# (GQA). An untied head: a tied one at init mostly predicts the token it reads, and greedy
# decoding would repeat one token.
PATTERNS = {
    "SG_rope": dict(model__pattern="SG", model__swa_pos="rope"),
    "SG_nope": dict(model__pattern="SG", model__swa_pos="nope"),
    "G": dict(model__pattern="G"),
    "LG": dict(model__pattern="LG"),
    "DG": dict(model__pattern="DG"),
    # The published forms: Gated DeltaNet with wide values, and KDA with GVA (value heads
    # sharing q/k heads: 2 query = 2 key heads, 4 value heads), and β in (0, 2).
    "DG_gdn": dict(model__pattern="DG", model__delta_gate_form="mamba2",
                   model__delta_expand_v=2, model__delta_qk_scale="1/sqrt(d_k)"),
    "DG_kda_gva": dict(model__pattern="DG", model__delta_gate_form="kda",
                       model__delta_gate="channel", model__num_heads=2, model__delta_v_heads=4,
                       model__delta_allow_neg_eigval=True),
}


@functools.lru_cache(maxsize=None)
def tiny_model(name: str) -> LanguageModel:
  config = tiny_config(**{**dict(model__window=3, model__num_heads=4, model__num_kv_heads=2,
                                 model__tie_embeddings=False), **PATTERNS[name]})
  return LanguageModel(config.model, rngs=nnx.Rngs(params=0))


def forward_logits(model, rows: list[np.ndarray]) -> list[np.ndarray]:
  """Each row's logits [len, V] from one forward pass over the rows right-padded into a batch
  (causal: padding after a row's tokens cannot change their logits)."""
  batch = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    batch[i, :len(row)] = row
  logits = np.asarray(jax.jit(model)(jnp.asarray(batch)))
  return [logits[i, :len(row)] for i, row in enumerate(rows)]


# One batch of prompts of different lengths (left-padded), and the tokens to make after them.
PROMPTS = [np.random.default_rng(0).integers(0, 256, n).astype(np.int32) for n in (3, 7)]
NEW = 9


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.integration
def test_greedy_decoding_gives_the_forward_pass_logits_and_tokens(name):
  model, prompts, new = tiny_model(name), PROMPTS, NEW
  tokens, start = decode.left_pad(prompts)
  width = tokens.shape[1]
  prompt_logits, caches = jax.jit(decode.prefill, static_argnums=(0, 3))(
      model, jnp.asarray(tokens), jnp.asarray(start), width + new - 1)
  step = jax.jit(functools.partial(decode.step, model))
  chosen, step_logits = [np.asarray(prompt_logits[:, -1]).argmax(-1)], []
  for i in range(new - 1):
    logits, caches = step(caches, jnp.asarray(chosen[-1]), width + i, jnp.asarray(start))
    step_logits.append(np.asarray(logits))
    chosen.append(step_logits[-1].argmax(-1))
  chosen, step_logits = np.stack(chosen, 1), np.stack(step_logits, 1)
  references = forward_logits(model, [np.concatenate([p, c]) for p, c in zip(prompts, chosen)])
  for row, (prompt, reference) in enumerate(zip(prompts, references)):
    n = len(prompt)
    np.testing.assert_allclose(np.asarray(prompt_logits)[row, start[row]:], reference[:n],
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(step_logits[row], reference[n:-1], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(chosen[row], reference[n - 1:-1].argmax(-1))
  assert len(set(chosen.ravel().tolist())) > 3  # Not one repeated token.
  if name == "SG_rope":  # The compiled token loop makes the same tokens (as the steps above).
    np.testing.assert_array_equal(np.stack(decode.generate(model, prompts, new)), chosen)


@pytest.mark.integration
def test_each_row_stops_at_its_own_eos_and_a_tiny_nucleus_is_greedy():
  model, prompts = tiny_model("SG_rope"), PROMPTS
  free = decode.generate(model, prompts, NEW)
  eos = int(free[0][2])  # Row 0 emits it third; row 1 later or never.
  stopped = decode.generate(model, prompts, NEW, eos_id=eos)
  for row, new in zip(free, stopped):
    ends = np.flatnonzero(row == eos)
    np.testing.assert_array_equal(new, row[:ends[0] + 1] if len(ends) else row)
  assert len(stopped[0]) <= 3
  sampled = decode.generate(model, prompts, NEW, temperature=1.5, top_p=1e-6, seed=3)
  for row, new in zip(free, sampled):
    np.testing.assert_array_equal(new, row)


def test_one_prompt_gives_one_array_and_bad_requests_fail_by_name():
  model = tiny_model("G")
  prompt = np.arange(5, dtype=np.int32)
  one = decode.generate(model, prompt, 3)
  assert isinstance(one, np.ndarray) and one.shape == (3,)
  np.testing.assert_array_equal(one, decode.generate(model, [prompt], 3)[0])
  with pytest.raises(DecodeError, match="max_new_tokens"):
    decode.generate(model, prompt, 0)
  with pytest.raises(DecodeError, match="eos_id"):
    decode.generate(model, prompt, 2, eos_id=10**6)
  with pytest.raises(DecodeError, match="non-empty"):
    decode.generate(model, [prompt, prompt[:0]], 2)
