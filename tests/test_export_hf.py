# Tiers (pytest.ini): the tests marked integration here export a run that tests/analysis_runs.py
# trains end to end (8 steps, once per process), or run launch/export_hf.py in a subprocess, so
# they are `make test-all` only; the mapping, config.json, safetensors and tokenizer checks on
# initialised parameters stay in `make test`.
# test-all only: an export of a trained checkpoint writes what hf_state_dict gives and refuses a
# taken or remote --out (test_export_writes_what_hf_state_dict_gives); launch/export_hf.py
# refuses a recurrent-only pattern before reading a checkpoint
# (test_cli_refuses_a_recurrent_only_pattern_in_one_line_before_reading_a_checkpoint), ends its
# errors in one line with exit code 2 (test_cli_errors_are_one_line), and refuses a flipped
# checkpoint in one line writing nothing (test_cli_refuses_a_flipped_checkpoint_in_one_line).
"""The Hugging Face export without torch: config.json (and auto_map with the remote-code files
for L and D layers), the safetensors file, the weight mapping (by a numpy re-implementation of
transformers' SmolLM3 forward and of modeling_hybrid_nope.py's recurrent mixers), the tokenizer
and the errors. tests/hf/check_hf.py (`make check-hf`) checks the same exports against
transformers itself."""
import ast
import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from configs import base, demo, gla_120m, nope_120m, nopeswa64_120m, swa256_120m
from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer
from hybrid_nope.errors import USAGE_EXIT_CODE
from hybrid_nope.export import hf
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.model import delta, gla
from hybrid_nope.model.definition import init_model
from hybrid_nope.model.layers import apply_rope
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.helpers import REPO, tiny_config
from tests.test_analysis_checkpoint_checkpoints import (FLIPPED_LEAF, flipped_copy, live_run,
                                                      unfinished_copy)


def _silu(x):
  return x / (1 + np.exp(-x))


def _recurrent_numpy(cfg: dict, w, kind: str, h: np.ndarray) -> np.ndarray:
  """modeling_hybrid_nope.py's L (GLA) or D (gated delta rule) mixer on one row h [T, D],
  transcribed into float64 numpy from its docstring's formulas; w(name) is self_attn.<name>."""
  T, N, K, H = len(h), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
  q, k, v = (h @ w(f"{n}_proj.weight").T for n in "qkv")
  gate = (h @ w("gate_down_proj.weight").T) @ w("gate_up_proj.weight").T + w("gate_up_proj.bias")
  alpha = np.exp(-np.logaddexp(0, -gate) / cfg["gate_temperature"]).reshape(T, K, -1)
  out = np.zeros((T, K, N // K, H))
  if kind == "L":
    q = q.reshape(T, K, N // K, H)
    k, v, S = k.reshape(T, K, H), v.reshape(T, K, H), np.zeros((K, H, H))  # S [key, value]
    for t in range(T):
      S = alpha[t][..., None] * S + k[t][:, :, None] * v[t][:, None, :]
      out[t] = np.einsum("kgh,khv->kgv", q[t], S) / np.sqrt(H)
  else:
    width = cfg["conv_width"]
    def conv(x, weight_C1W):  # Causal, depthwise, taps oldest first; zeros before the row.
      padded = np.concatenate([np.zeros((width - 1, x.shape[1])), x])
      return _silu(sum(weight_C1W[:, 0, j] * padded[j:j + T] for j in range(width)))
    l2 = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    q = l2(conv(q, w("q_conv1d.weight")).reshape(T, K, N // K, H))
    k = l2(conv(k, w("k_conv1d.weight")).reshape(T, K, H))
    v = conv(v, w("v_conv1d.weight")).reshape(T, K, H)
    beta, S = 1 / (1 + np.exp(-h @ w("beta_proj.weight").T)), np.zeros((K, H, H))  # S [v, k]
    for t in range(T):
      S = S * alpha[t][:, None, :]
      S = S + beta[t][:, None, None] * (v[t] - np.einsum("kvd,kd->kv", S, k[t]))[..., None] * (
          k[t][:, None, :])
      out[t] = np.einsum("kvd,kgd->kgv", S, q[t])
  out = out.reshape(T, N, H)
  normed = out / np.sqrt(np.mean(out * out, -1, keepdims=True) + cfg["rms_norm_eps"])
  y = normed * w("out_norm.weight") * _silu(h @ w("out_gate_proj.weight").T).reshape(T, N, H)
  return y.reshape(T, -1) @ w("o_proj.weight").T


def _hf_numpy_logits(cfg: dict, sd: dict, tokens_T: np.ndarray) -> np.ndarray:
  """transformers' SmolLM3ForCausalLM forward (eager attention), transcribed into numpy from
  modeling_smollm3.py and masking_utils.py, with modeling_hybrid_nope.py's mixers in its
  "linear_attention" layers: what the exported files mean to transformers."""
  f64 = lambda name: sd[name].astype(np.float64)
  T, H, eps = len(tokens_T), cfg["head_dim"], cfg["rms_norm_eps"]
  norm = lambda x, w: w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
  inv_freq = 1.0 / cfg["rope_parameters"]["rope_theta"] ** (np.arange(0, H, 2) / H)
  emb = np.concatenate([np.arange(T)[:, None] * inv_freq] * 2, -1)  # cat((freqs, freqs))
  rotate_half = lambda x: np.concatenate([-x[..., H // 2:], x[..., :H // 2]], -1)
  rope = lambda x: x * np.cos(emb) + rotate_half(x) * np.sin(emb)
  q_idx, kv_idx = np.arange(T)[:, None], np.arange(T)[None, :]
  x = f64("model.embed_tokens.weight")[tokens_T]
  for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = norm(x, f64(p + "input_layernorm.weight"))
    if cfg["layer_types"][i] == "linear_attention":
      x = x + _recurrent_numpy(cfg, lambda n: f64(p + "self_attn." + n), cfg["layer_kinds"][i], h)
    else:
      q, k, v = (h @ f64(p + f"self_attn.{n}_proj.weight").T for n in "qkv")
      q, k, v = (y.reshape(T, -1, H).transpose(1, 0, 2) for y in (q, k, v))  # [heads, T, H]
      if cfg["no_rope_layers"][i]:
        q, k = rope(q), rope(k)
      groups = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
      k, v = np.repeat(k, groups, 0), np.repeat(v, groups, 0)  # repeat_kv
      allowed = kv_idx <= q_idx
      if cfg["layer_types"][i] == "sliding_attention":
        allowed &= kv_idx > q_idx - cfg["sliding_window"]  # sliding_window_overlay
      scores = np.where(allowed, q @ k.transpose(0, 2, 1) * H ** -0.5, -np.inf)
      probs = np.exp(scores - scores.max(-1, keepdims=True))
      out = (probs / probs.sum(-1, keepdims=True)) @ v
      x = x + out.transpose(1, 0, 2).reshape(T, -1) @ f64(p + "self_attn.o_proj.weight").T
    h = norm(x, f64(p + "post_attention_layernorm.weight"))
    gate, up = h @ f64(p + "mlp.gate_proj.weight").T, h @ f64(p + "mlp.up_proj.weight").T
    x = x + (_silu(gate) * up) @ f64(p + "mlp.down_proj.weight").T
  head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
  return norm(x, f64("model.norm.weight")) @ f64(head).T


@pytest.mark.parametrize("overrides", [
    {},                                                     # RoPE-in-SWA, GQA, tied
    {"model__swa_pos": "nope", "model__tie_embeddings": False},
    {"model__global_pos": "rope", "model__pattern": "SSG", "model__num_layers": 3,
     "model__head_dim": 16, "model__num_kv_heads": 1},       # head_dim != d_model / heads
    {"model__pattern": "G"},
    {"model__pattern": "LG"},                               # GLA
    {"model__pattern": "DG", "model__tie_embeddings": False},  # gated delta rule, per-head gate
    {"model__pattern": "SDLG", "model__num_layers": 4, "model__delta_gate": "channel"},
], ids=["rope_swa_gqa_tied", "nope_swa_untied", "rope_global_ssg_mqa", "nope_only", "gla_lg",
        "delta_dg", "sdlg_channel_gate"])
def test_hf_forward_on_the_export_matches_ours(overrides):
  config = tiny_config(**overrides)
  _, params = init_model(config.model, seed=1)
  cfg, sd = hf.hf_config(config), hf.hf_state_dict(params, config.model)
  tokens_T = np.random.default_rng(0).integers(0, 258, 40)  # 10x the window of 4
  ours = np.asarray(init_model(config.model, seed=1)[0].bind(params)(jnp.asarray(tokens_T[None])))
  np.testing.assert_allclose(_hf_numpy_logits(cfg, sd, tokens_T), ours[0], atol=2e-5, rtol=0)
  if "S" in config.model.pattern:  # The window is exactly ours: w - 1 and w + 1 are not.
    for window in (config.model.window - 1, config.model.window + 1):
      other = _hf_numpy_logits({**cfg, "sliding_window": window}, sd, tokens_T)
      assert np.abs(other - ours[0]).max() > 1e-2


def test_rope_needs_no_permutation_of_q_rows():
  """HF's rotate_half on q_proj rows, viewed [N, H], equals our apply_rope on wq_DNH."""
  rng = np.random.default_rng(0)
  D, N, H, T, theta = 12, 3, 8, 9, 500.0
  x_TD, wq_DNH = rng.normal(size=(T, D)), rng.normal(size=(D, N, H))
  ours_TNH = np.asarray(apply_rope(jnp.asarray(np.einsum("td,dnh->tnh", x_TD, wq_DNH))[None],
                                   jnp.arange(T)[None], theta))[0]
  q_proj = wq_DNH.reshape(D, N * H).T  # What hf_state_dict writes.
  q_TNH = (x_TD @ q_proj.T).reshape(T, N, H)
  freqs_TF = np.arange(T)[:, None] / theta ** (np.arange(0, H, 2) / H)
  cos, sin = (f(np.concatenate([freqs_TF] * 2, -1))[:, None] for f in (np.cos, np.sin))
  hf_TNH = q_TNH * cos + np.concatenate([-q_TNH[..., H // 2:], q_TNH[..., :H // 2]], -1) * sin
  np.testing.assert_allclose(hf_TNH, ours_TNH, atol=1e-5)
  # An interleaved (GPT-J) rotation would not match: the check can fail.
  pairs = q_TNH.reshape(T, N, H // 2, 2)
  angle = freqs_TF[:, None]
  gptj = np.stack([pairs[..., 0] * np.cos(angle) - pairs[..., 1] * np.sin(angle),
                   pairs[..., 1] * np.cos(angle) + pairs[..., 0] * np.sin(angle)], -1)
  assert np.abs(gptj.reshape(T, N, H) - ours_TNH).max() > 1e-2


@pytest.mark.parametrize("module, pattern, types, rope", [
    (demo, "SGSG", ["sliding_attention", "full_attention"] * 2, [1, 0, 1, 0]),
    (swa256_120m, "SG" * 6, ["sliding_attention", "full_attention"] * 6, [1, 0] * 6),
    (nopeswa64_120m, "SG" * 6, ["sliding_attention", "full_attention"] * 6, [0] * 12),
    (nope_120m, "G" * 12, ["full_attention"] * 12, [0] * 12),
])
def test_config_json_of_named_configs(module, pattern, types, rope):
  config = module.get_config()
  cfg = hf.hf_config(config)
  m = config.model
  assert cfg["layer_types"] == types and cfg["no_rope_layers"] == rope
  assert (cfg["architectures"], cfg["model_type"]) == (["SmolLM3ForCausalLM"], "smollm3")
  sliding = "S" in pattern
  assert cfg["use_sliding_window"] is sliding
  assert cfg["sliding_window"] == (m.window if sliding else None)
  assert {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                              "head_dim", "rms_norm_eps", "tie_word_embeddings",
                              "max_position_embeddings")} == {
      "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.mlp_dim,
      "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
      "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
      "rms_norm_eps": m.norm_eps, "tie_word_embeddings": m.tie_embeddings,
      "max_position_embeddings": hf.UNCAPPED_POSITIONS}
  assert hf.UNCAPPED_POSITIONS > 64 * config.data.seq_len  # No cap on a length-extrapolation eval.
  assert hf.hf_config(config, max_position_embeddings=4096)["max_position_embeddings"] == 4096
  assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": m.rope_theta}
  assert cfg["pad_token_id"] is None and cfg["hidden_act"] == "silu"
  json.dumps(cfg)  # Plain JSON values only.


def test_state_dict_names_shapes_and_tied_head():
  config = tiny_config()  # D 32, N 4, K 2, H 8, F 64, V 258, 2 layers, tied
  _, params = init_model(config.model, seed=0)
  sd = hf.hf_state_dict(params, config.model)
  per_layer = {"input_layernorm.weight": (32,), "self_attn.q_proj.weight": (32, 32),
               "self_attn.k_proj.weight": (16, 32), "self_attn.v_proj.weight": (16, 32),
               "self_attn.o_proj.weight": (32, 32), "post_attention_layernorm.weight": (32,),
               "mlp.gate_proj.weight": (64, 32), "mlp.up_proj.weight": (64, 32),
               "mlp.down_proj.weight": (32, 64)}
  expected = {"model.embed_tokens.weight": (258, 32), "model.norm.weight": (32,),
              **{f"model.layers.{i}.{k}": s for i in range(2) for k, s in per_layer.items()}}
  assert {k: v.shape for k, v in sd.items()} == expected
  assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in sd.values())
  np.testing.assert_array_equal(sd["model.layers.1.self_attn.k_proj.weight"][8:16],
                                np.asarray(params["blocks"][1]["attn"]["wk_DKH"])[:, 1].T)
  np.testing.assert_allclose(sd["model.norm.weight"],
                             np.asarray(params["final_norm"]["scale_D"]) / np.sqrt(32))

  untied = tiny_config(model__tie_embeddings=False)
  _, params = init_model(untied.model, seed=0)
  sd = hf.hf_state_dict(params, untied.model)
  np.testing.assert_array_equal(sd["lm_head.weight"], np.asarray(params["head_DV"]).T)
  np.testing.assert_array_equal(sd["model.norm.weight"],
                                np.asarray(params["final_norm"]["scale_D"]))


def test_safetensors_header_and_bytes_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {"b.weight": rng.normal(size=(3, 5)).astype(np.float32),
             "a.bias": rng.normal(size=(7,)).astype(ml_dtypes.bfloat16),
             "c.ids": np.arange(6, dtype=np.int64).reshape(2, 3)}
  path = str(tmp_path / "x.safetensors")
  hf.write_safetensors(path, tensors, metadata={"format": "pt"})
  raw = open(path, "rb").read()
  (length,) = struct.unpack("<Q", raw[:8])
  assert length % 8 == 0
  header = json.loads(raw[8:8 + length])
  assert header.pop("__metadata__") == {"format": "pt"}
  assert {k: (v["dtype"], v["shape"]) for k, v in header.items()} == {
      "a.bias": ("BF16", [7]), "b.weight": ("F32", [3, 5]), "c.ids": ("I64", [2, 3])}
  spans = sorted(tuple(v["data_offsets"]) for v in header.values())
  assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - length
  assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # Contiguous, no gaps.
  begin, end = header["b.weight"]["data_offsets"]
  assert raw[8 + length + begin:8 + length + end] == tensors["b.weight"].astype("<f4").tobytes()
  _, arrays = hf.read_safetensors(path)
  for name, array in tensors.items():
    assert arrays[name].dtype == array.dtype
    np.testing.assert_array_equal(arrays[name], array)
  assert not os.path.exists(path + ".partial")


def test_byte_tokenizer_export_encodes_like_ours(tmp_path):
  import tokenizers
  texts = ["def f(x):\n\treturn x  ", "héllo ✓ 😀", "".join(map(chr, range(1, 256)))]
  files = export_tokenizer.plan(demo.get_config(), None).write(str(tmp_path))
  assert sorted(os.path.basename(f) for f in files) == ["tokenizer.json", "tokenizer_config.json"]
  tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert tok.get_vocab_size() == 258
  for text in texts:
    ids = tok.encode(text).ids
    assert ids == ByteTokenizer().encode(text, add_eos=False).tolist()
    assert tok.decode(ids) == text
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  assert tok.token_to_id(config["bos_token"]) == 256 and tok.token_to_id(config["eos_token"]) == 257


def test_mds_runs_need_a_given_tokenizer(tmp_path):
  config = base.get_config()
  plan = export_tokenizer.plan(config, None)
  assert "no tokenizer written" in plan.note and "--tokenizer" in plan.note
  assert plan.write(str(tmp_path)) == [] and plan.bos_id is None
  given = tmp_path / "given"
  given.mkdir()
  export_tokenizer.byte_level_tokenizer().save(str(given / "tokenizer.json"))
  (given / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>",
                                                           "eos_token": {"content": "<|eos|>"}}))
  plan = export_tokenizer.plan(config, str(given))
  assert (plan.bos_id, plan.eos_id) == (256, 257)
  out = tmp_path / "out"
  out.mkdir()
  assert sorted(os.path.basename(f) for f in plan.write(str(out))) == [
      "tokenizer.json", "tokenizer_config.json"]
  config.model.vocab_size = 100
  with pytest.raises(export_tokenizer.TokenizerError, match="has 258 tokens but the model's "
                     "config.model.vocab_size is 100"):
    export_tokenizer.plan(config, str(given / "tokenizer.json"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(export_tokenizer.TokenizerError, match="directory without tokenizer.json"):
    export_tokenizer.plan(config, str(tmp_path / "empty"))
  with pytest.raises(export_tokenizer.TokenizerError, match="expected a tokenizer.json file"):
    export_tokenizer.plan(config, str(given / "tokenizer_config.json"))
  (tmp_path / "bad.json").write_text("{}")
  with pytest.raises(export_tokenizer.TokenizerError, match="is not a tokenizers JSON file"):
    export_tokenizer.plan(config, str(tmp_path / "bad.json"))
  with pytest.raises(export_tokenizer.TokenizerError, match="data.source=stdlib"):
    export_tokenizer.plan(demo.get_config(), str(given))


@pytest.mark.parametrize("overrides, kinds", [
    ({"model__pattern": "LG"}, "LG"),
    ({"model__pattern": "SDLG", "model__num_layers": 8, "model__delta_gate": "channel"},
     "SDLG" * 2),
])
def test_config_json_of_recurrent_hybrids_names_the_remote_code(overrides, kinds):
  config = tiny_config(**overrides)
  cfg = hf.hf_config(config)
  assert (cfg["architectures"], cfg["model_type"]) == (["HybridNopeForCausalLM"], "hybrid_nope")
  assert cfg["auto_map"] == {"AutoConfig": "configuration_hybrid_nope.HybridNopeConfig",
                             "AutoModel": "modeling_hybrid_nope.HybridNopeModel",
                             "AutoModelForCausalLM": "modeling_hybrid_nope.HybridNopeForCausalLM"}
  types = {"S": "sliding_attention", "G": "full_attention", "L": "linear_attention",
           "D": "linear_attention"}
  assert cfg["layer_kinds"] == kinds and cfg["layer_types"] == [types[k] for k in kinds]
  assert cfg["no_rope_layers"] == [int(k == "S") for k in kinds]  # RoPE in SWA only (demo's).
  assert (cfg["gate_rank"], cfg["gate_temperature"]) == (gla.GATE_RANK, gla.GATE_TEMPERATURE)
  if "D" in kinds:
    assert (cfg["delta_gate"], cfg["conv_width"]) == ("channel", delta.CONV_WIDTH)
  else:
    assert "delta_gate" not in cfg and "conv_width" not in cfg
  json.dumps(cfg)


def test_named_gla_config_exports_with_remote_code():
  cfg = hf.hf_config(gla_120m.get_config())
  assert cfg["layer_kinds"] == "LG" * 6 and cfg["model_type"] == "hybrid_nope"
  assert cfg["use_sliding_window"] is False and cfg["sliding_window"] is None


def _classes(path: str) -> set[str]:
  tree = ast.parse(open(path, encoding="utf-8").read())
  return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_remote_code_is_copied_as_it_is_and_auto_map_names_its_classes(tmp_path):
  assert hf.write_remote_code(str(tmp_path), "SGSG") == []  # SmolLM3 needs no code.
  assert not os.listdir(tmp_path)
  written = hf.write_remote_code(str(tmp_path), "LGLG")
  assert sorted(os.path.basename(f) for f in written) == sorted(hf.REMOTE_CODE_FILES)
  source = os.path.join(REPO, "hybrid_nope", "export")
  for name in hf.REMOTE_CODE_FILES:
    assert (tmp_path / name).read_bytes() == open(os.path.join(source, name), "rb").read()
  for entry in hf.AUTO_MAP.values():  # "module.Class": the class is defined in the copied file.
    module, cls = entry.split(".")
    assert cls in _classes(str(tmp_path / f"{module}.py")), entry
  modeling = (tmp_path / "modeling_hybrid_nope.py").read_text()
  # transformers copies a remote module's relative imports along with it: the config must be one.
  assert "from .configuration_hybrid_nope import HybridNopeConfig" in modeling
  assert f'model_type = "{hf.REMOTE_MODEL_TYPE}"' in (
      tmp_path / "configuration_hybrid_nope.py").read_text()


@pytest.mark.parametrize("key, value, match", [
    ("pattern", "SX", r"config.model.pattern='SX' has 'X' \(an unknown layer kind\), which the "
                      r"exporter cannot write"),
    ("pattern", "L", r"config.model.pattern='L' has no attention layer \(S or G\)"),
    ("pattern", "DL", r"config.model.pattern='DL' has no attention layer \(S or G\)"),
    ("swa_pos", "alibi", r"config.model.swa_pos='alibi': expected one of \('rope', 'nope'\)"),
    ("num_layers", 3, r"config.model.num_layers=3 is invalid"),
    ("qk_norm", True, r"config.model.qk_norm is not known to the Hugging Face exporter"),
])
def test_unexportable_configs_name_the_key(key, value, match):
  config = tiny_config()
  config.model[key] = value
  with pytest.raises(hf.ExportError, match=match):
    hf.hf_config(config)


@pytest.mark.integration
def test_cli_refuses_a_recurrent_only_pattern_in_one_line_before_reading_a_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()  # A config and no checkpoint: the refusal comes first.
  (workdir / "config.json").write_text(tiny_config(model__pattern="L").to_json_best_effort())
  proc = subprocess.run([sys.executable, "launch/export_hf.py", f"--workdir={workdir}",
                         f"--out={tmp_path / 'hf'}"], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
  assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "export_hf.py: config.model.pattern='L' has no attention layer (S or G): transformers "
      "counts the tokens"), proc.stderr[-2000:]
  assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


@pytest.mark.integration
def test_export_writes_what_hf_state_dict_gives(run, tmp_path):
  from hybrid_nope.run import checkpoints
  from hybrid_nope.model import checkpointed
  out = str(tmp_path / "hf")
  result = hf.export(open_readonly(run), out, step=4)
  assert result["step"] == 4 and "byte tokenizer" in result["tokenizer"]
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json",
                                     "tokenizer_config.json"]
  config = checkpoints.load_config(run)
  _, _, params = checkpointed.restore_params(open_readonly(run, config), step=4)
  header, arrays = hf.read_safetensors(os.path.join(out, "model.safetensors"))
  assert header["__metadata__"] == {"format": "pt", **hf.round_trip_metadata(params,
                                                                            config.model)}
  expected = hf.hf_state_dict(params, config.model)
  assert arrays.keys() == expected.keys()
  for name in expected:
    np.testing.assert_array_equal(arrays[name], expected[name], name)
  cfg = json.loads(open(os.path.join(out, "config.json")).read())
  assert cfg == hf.hf_config(config, bos_token_id=256, eos_token_id=257)
  with pytest.raises(hf.ExportError, match="exists and is not an empty directory"):
    hf.export(open_readonly(run), out)
  with pytest.raises(hf.ExportError, match="expected a local directory"):
    hf.export(open_readonly(run), "gs://bucket/x")


@pytest.mark.integration
def test_cli_errors_are_one_line(run, tmp_path):
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "x").write_text("")
  proc = subprocess.run([sys.executable, "launch/export_hf.py", f"--workdir={run}",
                         f"--out={tmp_path / 'taken'}"], cwd=REPO, capture_output=True,
                        text=True, env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"export_hf.py: --out={tmp_path / 'taken'} exists and is not an empty directory: remove "
      f"it or name a new one")


@pytest.mark.integration
def test_cli_refuses_a_flipped_checkpoint_in_one_line(run, tmp_path):
  workdir = flipped_copy(run, str(tmp_path))
  out = tmp_path / "hf"
  proc = subprocess.run([sys.executable, "launch/export_hf.py", f"--workdir={workdir}",
                         f"--out={out}"], cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
  assert proc.returncode == USAGE_EXIT_CODE, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"export_hf.py: checkpoint step 8 is corrupt: 1 leaves of {workdir}/checkpoints/8/state "
      f"differ from the checksums saved with them (first: {FLIPPED_LEAF}); other steps with a "
      f"checkpoint: [4] (--step=N picks one)")
  assert not out.exists()  # Nothing written from a corrupt checkpoint.


def test_export_beside_a_live_save_writes_the_newest_finished_step(tmp_path, caplog):
  workdir = live_run(str(tmp_path))
  unfinished_copy(workdir, of=2, step=3)
  result = hf.export(open_readonly(workdir), str(tmp_path / "hf"))
  assert result["step"] == 2 and (tmp_path / "hf" / "model.safetensors").exists()
  assert "step 3 is being written; reading step 2" in caplog.text
