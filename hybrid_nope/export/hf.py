"""A run's checkpoint as a Hugging Face model: the SmolLM3 layout of `transformers`, and for
hybrids with recurrent layers (L, D) a trust_remote_code model built on it.

  python launch/export_hf.py --workdir=DIR [--step=N] --out=OUT [--tokenizer=PATH]

writes OUT/config.json and OUT/model.safetensors (float32), which
`transformers.SmolLM3ForCausalLM.from_pretrained(OUT)` loads, and a tokenizer (tokenizer.py).
SmolLM3 is a Llama block with a per-layer choice of RoPE or NoPE and of sliding-window or full
attention, so each attention layer of ours maps onto one of its layers:

  S → layer_types "sliding_attention", G → "full_attention";
  no_rope_layers[i] = 1 where layer i uses RoPE (model.swa_pos / model.global_pos == "rope"), 0 for
  NoPE — SmolLM3's own meaning (1 = rotary on), so NoPE-in-SWA and RoPE-in-global export too.

A pattern with L (gated linear attention) or D (gated delta rule) layers also gets
configuration_hybrid_nope.py and modeling_hybrid_nope.py (this directory) copied into OUT and
named in config.json's auto_map: model_type "hybrid_nope", SmolLM3's config plus `layer_kinds`
(the pattern repeated) and the gate's constants; those layers are layer_types
"linear_attention" (transformers' recurrent-state cache layer), and
`AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)` loads it. Their weights keep
the block's `self_attn.` prefix: q/k/v/o_proj as attention's, gate_down_proj, gate_up_proj (with
bias), out_gate_proj, out_norm, and for D q/k/v_conv1d ([channels, 1, width], taps oldest first)
and beta_proj.

Conventions, each checked against transformers 5.23 by tests/hf/check_hf.py (`make check-hf`):
- Linear weights are [out, in]: q_proj = wq_DNH viewed [D, N·H], transposed; head-major rows
  (n, h), as HF views q [.., N, H]. GQA: both send query head n to kv head n // (N/K).
- RoPE: ours (layers.apply_rope) and HF's rotate_half both pair dimension j with j + H/2, with
  inv_freq = θ^(−2j/H), so q/k rows need no permutation.
- Sliding window: HF's mask (masking_utils.sliding_window_overlay; eager, sdpa) lets query i
  see keys j with i − w < j ≤ i, our contract exactly, so `sliding_window` = model.window with
  no off-by-one; flash-attention's window_size (w − 1, ·) and the sliding KV cache (w − 1 past
  keys) agree. check_hf also exports w − 1 and w + 1 and shows that both differ.
- RMSNorm: weight · x / sqrt(mean(x²) + eps), gains start at 1, as ours; rms_norm_eps = norm_eps.
  Attention scale 1/sqrt(head_dim) in both; head_dim is written explicitly.
- Tied head: ours is logits = x Eᵀ / sqrt(D); HF ties lm_head to the embedding unscaled, so the
  1/sqrt(D) is folded into the final norm's gain (exact: that norm feeds only the head). HF's
  last_hidden_state is therefore ours / sqrt(D). An untied head is written as lm_head.
- Positions: ours are per document; HF takes position_ids and, given positions that restart
  without an attention_mask, masks across the restarts as our segment_ids do; L and D states
  (and D's convolution windows) start empty there in modeling_hybrid_nope.py.
Anything the export cannot express (an unknown layer kind, a model key this file does not know)
fails with an ExportError naming the config key.

model.safetensors' metadata also holds what an import (hf_import.py) needs to read the export
back bit for bit (`round_trip_metadata`): our model config (config.json cannot say, e.g., the
window of a pattern without S) and, with a tied head, the final norm's gains before the fold
(float32 g·D^(−1/2) is not invertible: D^(−1/2) is no power of two, so two gains can round to
one). transformers ignores both.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import struct

import ml_dtypes
import numpy as np

from hybrid_nope.errors import UserError
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.model import gla
from hybrid_nope.model.kind_specs import KINDS
from hybrid_nope.model.pattern import layer_kinds
from hybrid_nope.run.reader import RunReader

ARCHITECTURE = "SmolLM3ForCausalLM"
MODEL_TYPE = "smollm3"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
REMOTE_ARCHITECTURE = "HybridNopeForCausalLM"
REMOTE_MODEL_TYPE = "hybrid_nope"
REMOTE_CODE_FILES = ("configuration_hybrid_nope.py", "modeling_hybrid_nope.py")
AUTO_MAP = {"AutoConfig": "configuration_hybrid_nope.HybridNopeConfig",
            "AutoModel": "modeling_hybrid_nope.HybridNopeModel",
            "AutoModelForCausalLM": "modeling_hybrid_nope.HybridNopeForCausalLM"}
POSITION_ENCODINGS = ("rope", "nope")
# model.* keys this exporter maps into SmolLM3, and those that only choose how ours computes.
MAPPED_KEYS = {"pattern", "num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim",
               "mlp_dim", "window", "swa_pos", "global_pos", "rope_theta", "vocab_size",
               "tie_embeddings", "norm_eps", "delta_gate"}
# logits_dtype: the head's matmul precision (transformers runs it in its own dtype);
# param_dtype: the arrays are written as stored (BF16 in safetensors) and read back as such;
# loss_block: how training computes the loss (in blocks of positions), not what the model is.
COMPUTE_KEYS = {"dtype", "remat", "attention_impl", "linear_impl", "delta_impl", "logits_dtype",
                "param_dtype", "loss_block"}
# model.* keys the export writes at one value only: the layer kinds' (their specs' hf_fixed_keys).
FIXED_KEYS = {key for spec in KINDS.values() for key in spec.hf_fixed_keys}
# model.safetensors' metadata keys of `round_trip_metadata`.
META_MODEL = "hybrid_nope.model"
META_FINAL_NORM = "hybrid_nope.final_norm.scale_D"
SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                      np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.int32): "I32",
                      np.dtype(np.int64): "I64"}


class ExportError(UserError):
  """A run, config or output directory the exporter cannot turn into a Hugging Face model."""


def check_exportable(model_cfg) -> str:
  """The layer kinds (pattern repeated to num_layers), or an ExportError naming the model.* key
  the export cannot represent."""
  unknown = sorted(set(model_cfg.keys()) - MAPPED_KEYS - COMPUTE_KEYS - FIXED_KEYS)
  if unknown:
    raise ExportError(
        f"config.model.{unknown[0]} is not known to the Hugging Face exporter (hybrid_nope/"
        f"export/hf.py maps {sorted(MAPPED_KEYS)}): it may change the forward pass in a way the "
        f"export cannot represent, so the export stops rather than drop it")
  pattern = model_cfg.pattern
  exportable = sorted(k for k, spec in KINDS.items() if spec.hf_layer_type)
  foreign = [k for k in dict.fromkeys(pattern) if k not in exportable]
  if foreign:
    name = KINDS[foreign[0]].description if foreign[0] in KINDS else "an unknown layer kind"
    raise ExportError(
        f"config.model.pattern={pattern!r} has {foreign[0]!r} ({name}), which the exporter "
        f"cannot write: it expects letters from {exportable}")
  try:
    kinds = layer_kinds(pattern, model_cfg.num_layers)
  except ValueError as e:
    raise ExportError(str(e)) from None
  for spec in (KINDS[k] for k in dict.fromkeys(kinds)):
    fixed = spec.hf_fixed_keys
    for key, first in fixed.items():
      if model_cfg.get(key, first) != first:
        raise ExportError(
            f"config.model.{key}={model_cfg[key]!r}: the exporter writes the {spec.letter} "
            f"layer's first form only ({', '.join(f'{k}={v!r}' for k, v in fixed.items())}); the "
            f"published forms have no remote-code counterpart in modeling_hybrid_nope.py yet")
  if all(KINDS[k].recurrent for k in kinds):
    raise ExportError(
        f"config.model.pattern={pattern!r} has no attention layer (S or G): transformers counts "
        f"the tokens a cache has seen on its attention layers (DynamicCache.get_seq_length), so "
        f"an export of recurrent layers only could not run or generate with a cache")
  for key in ("swa_pos", "global_pos"):
    if model_cfg[key] not in POSITION_ENCODINGS:
      raise ExportError(f"config.model.{key}={model_cfg[key]!r}: expected one of "
                        f"{POSITION_ENCODINGS}")
  windowed = any(KINDS[k].windowed for k in kinds)
  if windowed and not (isinstance(model_cfg.window, int) and model_cfg.window >= 1):
    raise ExportError(f"config.model.window={model_cfg.window!r}: sliding-window layers need a "
                      f"positive int window")
  if model_cfg.num_heads % model_cfg.num_kv_heads:
    raise ExportError(f"config.model.num_heads={model_cfg.num_heads} is not a multiple of "
                      f"config.model.num_kv_heads={model_cfg.num_kv_heads}")
  return kinds


def uses_rope(kind: str, model_cfg) -> bool:
  """Whether the layer rotates q and k: an attention layer per its *_pos key; a recurrent
  layer (L, D) never."""
  return KINDS[kind].position(model_cfg) == "rope"


def needs_remote_code(kinds: str) -> bool:
  return any(KINDS[k].recurrent for k in kinds)


def remote_code_config(kinds: str, model_cfg) -> dict:
  """What config.json adds for modeling_hybrid_nope.py (HybridNopeConfig's fields)."""
  out = {"architectures": [REMOTE_ARCHITECTURE], "model_type": REMOTE_MODEL_TYPE,
         "auto_map": dict(AUTO_MAP), "layer_kinds": kinds, "gate_rank": gla.GATE_RANK,
         "gate_temperature": float(gla.GATE_TEMPERATURE)}
  for kind in dict.fromkeys(kinds):
    out.update(KINDS[kind].hf_remote_config(model_cfg))
  return out


# What config.json's max_position_embeddings says by default: no limit an evaluation would hit.
# Neither layer has one: global NoPE layers see no positions, and RoPE in SWA layers only ever
# rotates by distances under the window (q and k at any absolute position turn alike). The
# training length there would make lm-evaluation-harness score in windows of that length, so a
# length-extrapolation eval would silently never go past it.
UNCAPPED_POSITIONS = 2**20


def hf_config(config, *, bos_token_id: int | None = None, eos_token_id: int | None = None,
              max_position_embeddings: int = UNCAPPED_POSITIONS) -> dict:
  """The config.json of the Hugging Face model equivalent to the run's `config.model`."""
  m = config.model
  kinds = check_exportable(m)
  sliding = any(KINDS[k].windowed for k in kinds)
  out = {
      "architectures": [ARCHITECTURE],
      "model_type": MODEL_TYPE,
      "vocab_size": m.vocab_size,
      "hidden_size": m.d_model,
      "intermediate_size": m.mlp_dim,
      "num_hidden_layers": m.num_layers,
      "num_attention_heads": m.num_heads,
      "num_key_value_heads": m.num_kv_heads,
      "head_dim": m.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": m.norm_eps,
      # rope_parameters for transformers 5, rope_theta for 4.x (5 accepts both).
      "rope_parameters": {"rope_type": "default", "rope_theta": float(m.rope_theta)},
      "rope_theta": float(m.rope_theta),
      "layer_types": [KINDS[k].hf_layer_type for k in kinds],
      "no_rope_layers": [int(uses_rope(k, m)) for k in kinds],
      "use_sliding_window": sliding,
      "sliding_window": m.window if sliding else None,
      "max_position_embeddings": int(max_position_embeddings),
      "tie_word_embeddings": bool(m.tie_embeddings),
      "attention_bias": False,
      "mlp_bias": False,
      "attention_dropout": 0.0,
      "bos_token_id": bos_token_id,
      "eos_token_id": eos_token_id,
      # None: SmolLM3's default (128004) would be an embedding padding_idx outside small vocabs.
      "pad_token_id": None,
      "torch_dtype": "float32",
      "use_cache": True,
  }
  if needs_remote_code(kinds):
    out.update(remote_code_config(kinds, m))
  return out


def _item(tree, index: int):
  """blocks[i] of a params dict, whether its keys are ints (init) or strings (some restores)."""
  return tree[index] if index in tree else tree[str(index)]


def _linear(w_IO: np.ndarray, inputs: int = 1) -> np.ndarray:
  """A torch Linear weight [out, in] from ours [*in, *out] with `inputs` leading input axes."""
  return w_IO.reshape(int(np.prod(w_IO.shape[:inputs])), -1).T


def _recurrent_mixer(attn: dict, f32) -> dict[str, np.ndarray]:
  """self_attn.* of an L or D layer (modeling_hybrid_nope.RecurrentMixer and its subclasses)."""
  up = next(k for k in attn if k.startswith("w_gate_up_"))  # RKH, or RK for D's per-head gate
  bias = next(k for k in attn if k.startswith("gate_bias_"))
  out = {"gate_down_proj.weight": _linear(f32(attn["w_gate_down_DR"])),
         "gate_up_proj.weight": _linear(f32(attn[up])),
         "gate_up_proj.bias": f32(attn[bias]).ravel(),
         "out_gate_proj.weight": _linear(f32(attn["w_out_gate_DNH"])),
         "out_norm.weight": f32(attn["out_norm_scale_H"])}
  if "w_beta_DK" in attn:  # D: the short convolutions and the write strength β.
    out["beta_proj.weight"] = _linear(f32(attn["w_beta_DK"]))
    for name in ("q", "k", "v"):
      w_WXH = f32(attn[f"w_conv_{name}_W{'N' if name == 'q' else 'K'}H"])
      out[f"{name}_conv1d.weight"] = w_WXH.reshape(w_WXH.shape[0], -1).T[:, None, :]
  return out


def hf_state_dict(params: dict, model_cfg) -> dict[str, np.ndarray]:
  """The exported model's state dict (float32 numpy, [out, in] linears) from our params dict."""
  kinds = check_exportable(model_cfg)
  f32 = lambda x: np.asarray(x, np.float32)
  D = model_cfg.d_model
  out = {"model.embed_tokens.weight": f32(params["embed"]["embedding_VD"])}
  for i, kind in enumerate(kinds):
    block, prefix = _item(params["blocks"], i), f"model.layers.{i}."
    attn, mlp = block["attn"], block["mlp"]
    out[prefix + "input_layernorm.weight"] = f32(block["attn_norm"]["scale_D"])
    for name in ("q", "k", "v"):
      w_DXH = f32(attn[f"w{name}_D{'N' if name == 'q' else 'K'}H"])
      out[prefix + f"self_attn.{name}_proj.weight"] = _linear(w_DXH)
    out[prefix + "self_attn.o_proj.weight"] = _linear(f32(attn["wo_NHD"]), inputs=2)
    if KINDS[kind].recurrent:
      out.update({prefix + "self_attn." + k: v for k, v in _recurrent_mixer(attn, f32).items()})
    out[prefix + "post_attention_layernorm.weight"] = f32(block["mlp_norm"]["scale_D"])
    out[prefix + "mlp.gate_proj.weight"] = f32(mlp["w_gate_DF"]).T
    out[prefix + "mlp.up_proj.weight"] = f32(mlp["w_up_DF"]).T
    out[prefix + "mlp.down_proj.weight"] = f32(mlp["w_down_FD"]).T
  final_D = f32(params["final_norm"]["scale_D"])
  if model_cfg.tie_embeddings:
    # HF's tied lm_head has no 1/sqrt(D) (ours: Embed.attend); the norm feeds only the head.
    out["model.norm.weight"] = final_D * np.float32(D ** -0.5)
  else:
    out["model.norm.weight"] = final_D
    out["lm_head.weight"] = f32(params["head_DV"]).T
  return {name: np.ascontiguousarray(x) for name, x in out.items()}


def round_trip_metadata(params: dict, model_cfg) -> dict[str, str]:
  """What an import needs beyond the weights to give back `params` and `model_cfg` exactly:
  model.* as JSON and, with a tied head, the final norm's float32 gains (little-endian bytes,
  base64) before hf_state_dict folds 1/sqrt(D) into them."""
  out = {META_MODEL: json.dumps(model_cfg.to_dict(), sort_keys=True)}
  if model_cfg.tie_embeddings:
    gains_D = np.asarray(params["final_norm"]["scale_D"], np.float32).astype("<f4")
    out[META_FINAL_NORM] = base64.b64encode(gains_D.tobytes()).decode("ascii")
  return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
  """The safetensors format: u64 little-endian header length, the JSON header (name → dtype,
  shape, [begin, end) byte offsets into the data; padded with spaces to 8 bytes), then the
  little-endian C-order bytes of each tensor, in header order with no gaps."""
  header, arrays, offset = {}, [], 0
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    if array.dtype not in SAFETENSORS_DTYPES:
      raise ValueError(f"tensor {name}: dtype {array.dtype} has no safetensors name here")
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    arrays.append(array)
    offset += array.nbytes
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
  blob += b" " * (-len(blob) % 8)
  partial = path + ".partial"  # Renamed when complete: no half-written file under the real name.
  with open(partial, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for array in arrays:
      f.write(array.tobytes())
  os.replace(partial, path)


def read_safetensors(path: str) -> tuple[dict, dict[str, np.ndarray]]:
  """(header, name → array) of a safetensors file; the inverse of write_safetensors."""
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    data = f.read()
  by_name = {v: k for k, v in SAFETENSORS_DTYPES.items()}
  arrays = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    begin, end = entry["data_offsets"]
    dtype = by_name[entry["dtype"]].newbyteorder("<")
    arrays[name] = np.frombuffer(data[begin:end], dtype).reshape(entry["shape"])
  return header, arrays


def check_out_dir(out: str) -> None:
  """OUT must be a local directory that is new or empty: an export never mixes with old files."""
  if "://" in out:
    raise ExportError(f"--out={out}: expected a local directory (transformers loads from one); "
                      f"copy it to remote storage afterwards")
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ExportError(f"--out={out} exists and is not an empty directory: remove it or name a "
                      f"new one")


def write_remote_code(out: str, kinds: str) -> list[str]:
  """Copies REMOTE_CODE_FILES (this directory's sources, as they are) into OUT when the layer
  kinds need them; returns the paths written."""
  if not needs_remote_code(kinds):
    return []
  here = os.path.dirname(os.path.abspath(__file__))
  return [shutil.copy(os.path.join(here, name), out) for name in REMOTE_CODE_FILES]


def write_model(out: str, config, params: dict, plan: export_tokenizer.Plan,
                max_position_embeddings: int = UNCAPPED_POSITIONS) -> tuple[list[str], dict]:
  """Writes the model `params` of `config` and the tokenizer `plan` into the directory OUT
  (made if absent); returns (the paths written, the tensors)."""
  kinds = check_exportable(config.model)
  os.makedirs(out, exist_ok=True)
  tensors = hf_state_dict(params, config.model)
  config_path, weights_path = os.path.join(out, CONFIG_FILE), os.path.join(out, WEIGHTS_FILE)
  write_safetensors(weights_path, tensors,
                    metadata={"format": "pt", **round_trip_metadata(params, config.model)})
  with open(config_path, "w") as f:
    json.dump(hf_config(config, bos_token_id=plan.bos_id, eos_token_id=plan.eos_id,
                        max_position_embeddings=max_position_embeddings), f, indent=2)
    f.write("\n")
  return [config_path, weights_path] + plan.write(out) + write_remote_code(out, kinds), tensors


def export(run: RunReader, out: str, *, step: int | None = None, tokenizer: str | None = None,
           max_position_embeddings: int = UNCAPPED_POSITIONS) -> dict:
  """Writes the run's checkpoint `step` (None = latest) to OUT; returns what it wrote: step,
  files, tensors, bytes, and a line about the tokenizer."""
  from hybrid_nope.model import checkpointed  # orbax: only when a checkpoint is read.

  config = run.config
  check_exportable(config.model)  # Before any checkpoint is read.
  carried = run.tokenizer_path()  # An imported model's, with the files beside it.
  plan = export_tokenizer.plan(config, tokenizer or (carried and os.path.dirname(carried)))
  check_out_dir(out)
  step, _, params = checkpointed.restore_params(run, step)
  # OUT only once the checkpoint is read: no empty OUT on failure.
  files, tensors = write_model(out, config, params, plan, max_position_embeddings)
  return {"step": step, "out": out, "files": files, "tensors": len(tensors),
          "bytes": sum(x.nbytes for x in tensors.values()), "tokenizer": plan.note}
