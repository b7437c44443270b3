"""The import of a transformers SmolLM3-layout checkpoint (hybrid_nope/export/hf_import.py),
without torch: our export read back bit for bit (params and model config), a foreign layout
(SmolLM3-3B's: RoPE in three full-attention layers of four) against the numpy transcription of
transformers' forward in test_export_hf.py, the tied head's 1/sqrt(D) on a D whose root is no
power of two, and every refusal naming its config.json key or tensor. tests/hf/check_hf.py
(`make check-hf`) compares an import with transformers itself; test_export_import_workdir.py
writes and analyses the workdir."""
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import pytest

from configs import base
from hybrid_nope.export import hf, hf_import
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.model.definition import abstract_params, model_definition
from tests.helpers import tiny_config
from tests.test_export_hf import _hf_numpy_logits

BASE_MODEL = base.get_config().model.to_dict()


def write_hf_dir(out: str, config, params, **tensor_changes) -> str:
  """Our export of `params` (hf.write_model, byte tokenizer) into `out`; tensor_changes:
  name -> array (None drops it), the safetensors rewritten without the metadata when given."""
  hf.write_model(out, config, params, export_tokenizer.plan(config, None))
  if tensor_changes:
    path = os.path.join(out, hf.WEIGHTS_FILE)
    _, tensors = hf.read_safetensors(path)
    tensors = {**tensors, **tensor_changes}
    hf.write_safetensors(path, {k: v for k, v in tensors.items() if v is not None})
  return out


def edit_config(out: str, **changes) -> None:
  """config.json with `changes` (a None value drops the key)."""
  path = os.path.join(out, hf.CONFIG_FILE)
  cfg = {**json.load(open(path)), **changes}
  json.dump({k: v for k, v in cfg.items() if v is not None}, open(path, "w"))


def bits(tree):
  """Each leaf's raw bits (equal bits: bit-identical, NaN and -0.0 included)."""
  return jax.tree.map(lambda x: np.asarray(x).view(f"u{np.asarray(x).dtype.itemsize}"), tree)


def assert_same_bits(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(bits(a)), jax.tree.leaves(bits(b))):
    assert x.dtype == y.dtype and np.array_equal(x, y)


def random_params(config, seed=0):
  """Params of the config's shapes, numpy-random (init_model's eager ops cost seconds): weights
  ~ N(0, 1/fan-in), norm gains lognormal around 1, far from 1 as training leaves them (many
  fold into 1/sqrt(D) inexactly)."""
  rng = np.random.default_rng(seed)
  def leaf(x):
    if len(x.shape) == 1:
      return rng.lognormal(0, 1, x.shape).astype(np.float32)
    return (rng.standard_normal(x.shape) / math.sqrt(x.shape[0])).astype(np.float32)
  return jax.tree.map(leaf, abstract_params(config.model))


@pytest.mark.parametrize("overrides", [
    {"model__d_model": 24, "model__num_heads": 4, "model__head_dim": 6},  # tied; sqrt(24)
    {"model__swa_pos": "nope", "model__tie_embeddings": False},
    {"model__pattern": "G", "model__window": 5, "model__swa_pos": "nope"},  # inert keys kept
    {"model__pattern": "SSG", "model__num_layers": 3, "model__global_pos": "rope",
     "model__head_dim": 16, "model__num_kv_heads": 1, "model__d_model": 48},  # MQA; sqrt(48)
    {"model__pattern": "SGSG", "model__num_layers": 4},  # a pattern as written, not its unit
    {"model__param_dtype": "bfloat16", "model__logits_dtype": "float32"},  # stored as BF16
], ids=["tied_d24", "nope_swa_untied", "global_only", "ssg_mqa_d48", "sgsg", "bf16_params"])
def test_our_export_reads_back_bit_for_bit(tmp_path, overrides):
  config = tiny_config(**overrides)
  params = random_params(config, seed=1)
  if config.model.param_dtype == "bfloat16":
    params = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16), params)
  imported = hf_import.read(write_hf_dir(str(tmp_path), config, params), BASE_MODEL)
  assert imported.exact and imported.model == config.model.to_dict()
  assert_same_bits(imported.params, params)


def test_the_tied_fold_is_not_invertible_in_float32_so_the_export_keeps_the_gains(tmp_path):
  # D = 24: sqrt(D) is no power of two. Gains spread over a binade meet under g·D^(-1/2)
  # rounded to float32, so no division recovers them all: the metadata must.
  D = 24
  g_D = np.float32(1.5) + np.arange(1 << 16, dtype=np.float32) * np.float32(2.0 ** -23)
  folded = g_D * np.float32(D ** -0.5)
  assert len(np.unique(folded)) < len(g_D)  # Collisions: the fold loses bits.
  config = tiny_config(model__d_model=D, model__num_heads=4, model__head_dim=6)
  params = random_params(config, seed=3)
  out = write_hf_dir(str(tmp_path / "a"), config, params)
  from hybrid_nope.export.safetensors_dir import Weights
  with Weights(out) as weights:
    assert hf_import.final_norm(weights, D)[1]  # Exact, through the metadata.
  # Without the metadata: the float64 product, within half an ulp of the gains.
  plain = write_hf_dir(str(tmp_path / "b"), config, params,
                       **{"model.norm.weight": hf.hf_state_dict(params, config.model)[
                           "model.norm.weight"]})
  imported = hf_import.read(plain, BASE_MODEL)
  assert not imported.exact
  got, want = imported.params["final_norm"]["scale_D"], np.asarray(
      params["final_norm"]["scale_D"])
  assert np.max(np.abs(got - want) / np.spacing(want)) <= 1.0
  # A folded weight edited after the export: its gains no longer fold to it, so not used.
  edited = hf.hf_state_dict(params, config.model)["model.norm.weight"].copy()
  edited[0] = np.nextafter(edited[0], np.float32(np.inf))
  out = write_hf_dir(str(tmp_path / "c"), config, params)
  hf.write_safetensors(os.path.join(out, hf.WEIGHTS_FILE), {
      **hf.hf_state_dict(params, config.model), "model.norm.weight": edited},
      metadata={"format": "pt", **hf.round_trip_metadata(params, config.model)})
  assert not hf_import.read(out, BASE_MODEL).exact


def smollm3_3b_like(out, *, dtype=np.float32, seed=0, **changes) -> tuple[dict, dict]:
  """A SmolLM3-3B-shaped config.json (36 layers cut to 4: full attention everywhere, NoPE in
  every fourth, GQA, tied, rope_theta 5e6, its inert keys) and random weights, as
  transformers would write them (no metadata of ours); returns (config, state dict)."""
  cfg = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
         "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
         "eos_token_id": 7, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
         "intermediate_size": 48, "max_position_embeddings": 256, "max_window_layers": 4,
         "mlp_bias": False, "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0],
         "layer_types": ["full_attention"] * 4, "num_attention_heads": 4,
         "num_hidden_layers": 4, "num_key_value_heads": 2, "pad_token_id": 0,
         "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
         "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True,
         "torch_dtype": "bfloat16", "transformers_version": "4.54.0", "use_cache": False,
         "use_sliding_window": False, "vocab_size": 300, **changes}
  rng = np.random.default_rng(seed)
  D, F, N, K = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                 "num_key_value_heads"))
  H = cfg.get("head_dim") or D // N
  shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], D), "model.norm.weight": (D,)}
  for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                   p + "self_attn.q_proj.weight": (N * H, D), p + "self_attn.k_proj.weight": (K * H, D),
                   p + "self_attn.v_proj.weight": (K * H, D), p + "self_attn.o_proj.weight": (D, N * H),
                   p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                   p + "mlp.down_proj.weight": (D, F)})
  if not cfg["tie_word_embeddings"]:
    shapes["lm_head.weight"] = (cfg["vocab_size"], D)
  sd = {name: (1 + 0.3 * rng.standard_normal(s) if s == (D,) else
               rng.standard_normal(s) / math.sqrt(s[-1])).astype(dtype)
        for name, s in shapes.items()}
  os.makedirs(out, exist_ok=True)
  hf.write_safetensors(os.path.join(out, hf.WEIGHTS_FILE), sd, metadata={"format": "pt"})
  json.dump(cfg, open(os.path.join(out, hf.CONFIG_FILE), "w"))
  return cfg, sd


def our_logits(imported, tokens_T):
  model_def = model_definition(ml_collections.ConfigDict(imported.model))
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), imported.params)
  forward = jax.jit(lambda p, t: model_def.bind(p)(t))  # One compile, not one per op.
  return np.asarray(forward(params, jnp.asarray(tokens_T[None])))[0]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_smollm3_3b_layout_matches_transformers_forward(tmp_path, dtype):
  cfg, sd = smollm3_3b_like(str(tmp_path), dtype=dtype)
  imported = hf_import.read(str(tmp_path), BASE_MODEL)
  m = imported.model
  assert (m["pattern"], m["window"], m["swa_pos"], m["global_pos"]) == ("SSSG", 256, "rope",
                                                                        "nope")
  assert (m["num_layers"], m["d_model"], m["num_heads"], m["num_kv_heads"], m["head_dim"],
          m["mlp_dim"], m["vocab_size"], m["rope_theta"], m["norm_eps"],
          m["tie_embeddings"]) == (4, 32, 4, 2, 8, 48, 300, 5e6, 1e-6, True)
  assert not imported.exact and "window = max_position_embeddings = 256" in imported.notes[0]
  assert {x.dtype for x in jax.tree.leaves(imported.params)} == (
      {np.dtype(dtype), np.dtype(np.float32)} if dtype != np.float32 else {np.dtype(dtype)})
  tokens_T = np.random.default_rng(1).integers(0, 300, 40)
  hf_cfg = {**cfg, "head_dim": 8, "rope_parameters": {"rope_theta": cfg["rope_theta"]}}
  want = _hf_numpy_logits(hf_cfg, {k: v.astype(np.float32) for k, v in sd.items()}, tokens_T)
  np.testing.assert_allclose(our_logits(imported, tokens_T), want, atol=1e-4, rtol=0)


def test_a_sliding_layout_and_smollm3s_derived_layer_types(tmp_path):
  # No layer_types nor no_rope_layers: SmolLM3Config derives RoPE off in every fourth layer,
  # and with use_sliding_window those NoPE layers slide.
  smollm3_3b_like(str(tmp_path), layer_types=None, no_rope_layers=None,
                  use_sliding_window=True, sliding_window=6, tie_word_embeddings=False,
                  head_dim=16)
  imported = hf_import.read(str(tmp_path), BASE_MODEL)
  m = imported.model
  assert (m["pattern"], m["window"], m["swa_pos"], m["global_pos"], m["head_dim"]) == (
      "GGGS", 6, "nope", "rope", 16)
  # Its forward against transformers' own: tests/hf/check_hf.py (make check-hf).


def test_shortest_unit():
  assert hf_import.shortest_unit("SSSGSSSGSSSG") == "SSSG"
  assert hf_import.shortest_unit("SGSS") == "SGSS"
  assert hf_import.shortest_unit("GGGG") == "G"


@pytest.mark.parametrize("changes, message", [
    ({"attention_bias": True}, "config.json attention_bias=True: expected false"),
    ({"mlp_bias": True}, "config.json mlp_bias=True: expected false"),
    ({"layer_types": ["full_attention"] * 3 + ["linear_attention"]}, "config.json layer_types="),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "config.json rope_scaling.rope_type='yarn': expected 'default'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.5}},
     "config.json rope_parameters.partial_rotary_factor=0.5"),
    ({"quantization_config": {"bits": 4}}, "config.json key 'quantization_config' is not known"),
    ({"hidden_size": None}, "config.json has no 'hidden_size'"),
    ({"model_type": "hybrid_nope"}, "config.json model_type='hybrid_nope': expected 'smollm3'"),
    ({"hidden_act": "gelu"}, "config.json hidden_act='gelu'"),
    ({"num_key_value_heads": 3}, "config.json num_key_value_heads=3: expected a divisor"),
    ({"no_rope_layers": [1, 1, 2, 0]}, "config.json no_rope_layers=[1, 1, 2, 0]"),
    ({"layer_types": ["sliding_attention"] * 4}, "config.json use_sliding_window=False"),
    ({"layer_types": ["sliding_attention"] * 2 + ["full_attention"] * 2,
      "use_sliding_window": True, "sliding_window": 4, "no_rope_layers": [1, 0, 1, 1]},
     "one value over the sliding layers [0, 1]"),
    ({"layer_types": ["sliding_attention"] + ["full_attention"] * 3,
      "use_sliding_window": True, "sliding_window": 4},
     "one value over the full-attention layers [1, 2, 3] where layers [0] slide"),
    ({"max_position_embeddings": None}, "config.json max_position_embeddings=None"),
    ({"use_sliding_window": True, "sliding_window": 0,
      "layer_types": ["sliding_attention"] + ["full_attention"] * 3, "no_rope_layers": [1] * 4},
     "config.json sliding_window=0: expected an integer >= 1"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_what_we_cannot_express_fails_naming_the_key(tmp_path, changes, message):
  smollm3_3b_like(str(tmp_path))
  edit_config(str(tmp_path), **changes)
  with pytest.raises(hf_import.HFImportError) as e:
    hf_import.read(str(tmp_path), BASE_MODEL)
  assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("change, message", [
    ({"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)},
     "tensor model.layers.0.self_attn.q_proj.bias is not one the config's model has"),
    ({"model.layers.3.mlp.up_proj.weight": None},
     "tensor model.layers.3.mlp.up_proj.weight is missing"),
    ({"model.layers.1.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)},
     "tensor model.layers.1.self_attn.k_proj.weight has shape [32, 32]"),
    ({"lm_head.weight": np.ones((300, 32), np.float32)},
     "tie_word_embeddings=True: expected false, or lm_head.weight equal"),
])
def test_tensors_we_cannot_express_fail_naming_them(tmp_path, change, message):
  _, sd = smollm3_3b_like(str(tmp_path))
  sd = {k: v for k, v in {**sd, **change}.items() if v is not None}
  hf.write_safetensors(os.path.join(tmp_path, hf.WEIGHTS_FILE), sd)
  with pytest.raises(hf_import.HFImportError) as e:
    hf_import.read(str(tmp_path), BASE_MODEL)
  assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_weight_that_is_not_finite_fails_naming_it_and_its_count(tmp_path, dtype):
  _, sd = smollm3_3b_like(str(tmp_path), dtype=dtype)
  assert hf_import.read(str(tmp_path), BASE_MODEL).params  # Finite: imported as before.
  path = os.path.join(tmp_path, hf.WEIGHTS_FILE)
  q = sd["model.layers.2.self_attn.q_proj.weight"].copy()
  q[0, :3] = [np.nan, np.inf, -np.inf]
  hf.write_safetensors(path, {**sd, "model.layers.2.self_attn.q_proj.weight": q})
  with pytest.raises(hf_import.HFImportError) as e:
    hf_import.read(str(tmp_path), BASE_MODEL)
  assert str(e.value) == (
      f"tensor model.layers.2.self_attn.q_proj.weight (our params/blocks/2/attn/wq_DNH) of "
      f"{path} holds 3 non-finite values (NaN or inf) of 1024: the weights are broken, and a "
      f"model of them computes NaN")
  norm = sd["model.norm.weight"].copy()  # Tied: the folded final norm is read its own way.
  norm[5] = np.nan
  hf.write_safetensors(path, {**sd, "model.layers.2.self_attn.q_proj.weight": q,
                              "model.norm.weight": norm})
  with pytest.raises(hf_import.HFImportError) as e:
    hf_import.read(str(tmp_path), BASE_MODEL)
  assert str(e.value).startswith(
      f"tensor model.norm.weight (our params/final_norm/scale_D) of {path} holds 1 non-finite "
      f"values (NaN or inf) of 32; 1 more tensors hold some, e.g. "
      f"['model.layers.2.self_attn.q_proj.weight']:"), str(e.value)


def test_a_tied_lm_head_equal_to_the_embedding_and_an_old_rope_buffer_are_accepted(tmp_path):
  _, sd = smollm3_3b_like(str(tmp_path))
  sd = {**sd, "lm_head.weight": sd["model.embed_tokens.weight"],
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
  hf.write_safetensors(os.path.join(tmp_path, hf.WEIGHTS_FILE), sd)
  assert hf_import.read(str(tmp_path), BASE_MODEL).model["tie_embeddings"]


def test_a_bad_directory_or_config_json_names_itself(tmp_path):
  with pytest.raises(hf_import.HFImportError, match="expected a local directory"):
    hf_import.read(str(tmp_path / "missing"), BASE_MODEL)
  with pytest.raises(hf_import.HFImportError, match="config.json does not exist"):
    hf_import.read(str(tmp_path), BASE_MODEL)
  (tmp_path / "config.json").write_text("{")
  with pytest.raises(hf_import.HFImportError, match="config.json is not valid JSON"):
    hf_import.read(str(tmp_path), BASE_MODEL)
