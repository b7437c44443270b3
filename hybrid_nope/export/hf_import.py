"""A transformers checkpoint of the SmolLM3 layout read back as our model: config.json → model.*,
the weights → our params tree. The inverse of hf.py; import_workdir.py writes the workdir.

  config.json                                         model.*
  hidden_size, intermediate_size, num_hidden_layers   d_model, mlp_dim, num_layers
  num_attention_heads, num_key_value_heads, head_dim  num_heads, num_kv_heads, head_dim
  vocab_size, rms_norm_eps, tie_word_embeddings       vocab_size, norm_eps, tie_embeddings
  rope_scaling / rope_parameters / rope_theta         rope_theta (rope_type "default" only)
  layer_types[i], no_rope_layers[i], sliding_window   pattern letter i, swa_pos / global_pos, window

The six sizes are required; other keys a config.json leaves out take SmolLM3Config's defaults
(transformers 5.23: DEFAULTS; head_dim = hidden_size // heads; no_rope_layers and layer_types
derived as its __post_init__ does; 1 = RoPE). Per layer: sliding_attention → S with window
sliding_window, full_attention → G. Our model has one swa_pos for its S layers and one
global_pos for its G layers. Where the full-attention layers differ and none slides (SmolLM3-3B:
RoPE in three layers of four, NoPE in the fourth), the RoPE ones become S layers with window
max_position_embeddings: full attention up to that length, the one transformers' RoPE model was
built for. The pattern is the shortest unit that repeats to the layers.

Weights (float32, bfloat16 or float16, kept as stored; analysis casts to the config's dtype):
the inverse of hf.hf_state_dict, a Linear [out, in] transposed and viewed with our head axes.
A tied head: ours is x Eᵀ/sqrt(D), transformers' x Eᵀ with 1/sqrt(D) folded into
model.norm.weight, so our final norm is that weight × sqrt(D), rounded once from float64. Our
own export also writes its model config and the unfolded gains into the safetensors metadata
(hf.round_trip_metadata); they are used where they export back to exactly what the directory
holds, so an export then an import is bit for bit.

What we cannot express fails before a weight is read, as an HFImportError naming the config.json
key (or the tensor) and what was expected; a weight holding NaN or inf fails once all are read,
naming the tensor, our parameter and the count.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import math
import os

import ml_collections
import ml_dtypes
import numpy as np

from hybrid_nope.errors import UserError
from hybrid_nope.export import hf
from hybrid_nope.export.safetensors_dir import Weights
from hybrid_nope.model.definition import abstract_params
from hybrid_nope.model.kind_specs import LETTER_OF_HF_ATTENTION

SIZES = {"vocab_size": "vocab_size", "hidden_size": "d_model", "intermediate_size": "mlp_dim",
         "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
         "num_key_value_heads": "num_kv_heads"}
DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "use_sliding_window": False, "sliding_window": None, "no_rope_layer_interval": 4,
            "attention_bias": False, "mlp_bias": False}
DEFAULT_ROPE_THETA = 2_000_000.0  # SmolLM3Config.default_theta
READ_KEYS = set(SIZES) | set(DEFAULTS) | {"model_type", "head_dim", "rope_scaling",
                                          "rope_parameters", "rope_theta", "no_rope_layers",
                                          "layer_types", "max_position_embeddings"}
# Keys that do not change the forward pass: names, special token ids, dtypes, training-only
# settings (dropout, init), and settings SmolLM3's modeling code never reads.
INERT_KEYS = {"architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
              "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
              "attention_dropout", "pretraining_tp", "max_window_layers", "output_attentions",
              "output_hidden_states", "return_dict", "use_bfloat16", "torchscript",
              "tokenizer_class", "id2label", "label2id"}
SILU = ("silu", "swish")  # transformers' names of x·sigmoid(x), our SwiGLU's activation.
IGNORED_TENSOR_SUFFIX = "rotary_emb.inv_freq"  # Old checkpoints' RoPE buffer: config-derived.


class HFImportError(UserError):
  """A Hugging Face directory, config.json key or tensor the import cannot read as our model."""


def _fail(key: str, value, expected: str):
  raise HFImportError(f"config.json {key}={value!r}: expected {expected}")


def read_config(hf_dir: str) -> dict:
  """DIR/config.json as a dict; a missing directory or file, or bad JSON, names itself."""
  if "://" in hf_dir or not os.path.isdir(hf_dir):
    raise HFImportError(f"--hf={hf_dir}: expected a local directory holding a transformers "
                        f"checkpoint (config.json and model.safetensors); nothing is downloaded")
  path = os.path.join(hf_dir, hf.CONFIG_FILE)
  try:
    with open(path) as f:
      config = json.load(f)
  except FileNotFoundError:
    raise HFImportError(f"{path} does not exist: expected the checkpoint's config.json") from None
  except json.JSONDecodeError as e:
    raise HFImportError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(config, dict):
    raise HFImportError(f"{path} holds a {type(config).__name__}, expected a JSON object")
  return config


def _int(config: dict, key: str, low: int = 1) -> int:
  value = config.get(key)
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    _fail(key, value, f"an integer >= {low}")
  return value


def _rope_theta(config: dict) -> float:
  """The RoPE base as transformers resolves it (convert_rope_params_to_dict: rope_scaling, else
  rope_parameters; rope_theta beside them, else the default); rope_type "default" only."""
  key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
  params = config.get(key) or {}
  if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
    _fail(key, params, "one dict of RoPE parameters (per-layer-type RoPE is not expressible)")
  kind = params.get("rope_type", params.get("type", "default"))
  if kind != "default":
    _fail(f"{key}.rope_type", kind, "'default': our RoPE has no scaling")
  extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
  if extra:
    _fail(f"{key}.{extra[0]}", params[extra[0]], "nothing beyond rope_type and rope_theta")
  theta = params.get("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA))
  if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
    _fail("rope_theta", theta, "a positive number")
  return float(theta)


def _layer_types(config: dict, num_layers: int) -> tuple[list[str], list[bool]]:
  """(layer_types, uses RoPE) per layer, derived as SmolLM3Config.__post_init__ does."""
  rope = config.get("no_rope_layers")
  if rope is None:
    interval = _int(config, "no_rope_layer_interval")
    rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
  if not (isinstance(rope, list) and len(rope) >= num_layers
          and all(v in (0, 1) for v in rope)):
    _fail("no_rope_layers", rope, f"a list of at least num_hidden_layers={num_layers} entries, "
          f"each 1 (RoPE) or 0 (NoPE)")
  rope = [bool(v) for v in rope[:num_layers]]
  sliding, window = config["use_sliding_window"], config["sliding_window"]
  types = config.get("layer_types")
  if types is None:
    types = ["sliding_attention" if sliding and window is not None and not r else
             "full_attention" for r in rope]
  known = ("sliding_attention", "full_attention")
  if not (isinstance(types, list) and len(types) == num_layers
          and all(t in known for t in types)):
    _fail("layer_types", types, f"num_hidden_layers={num_layers} entries from {known} (other "
          f"kinds, e.g. linear_attention, have no SmolLM3 counterpart)")
  if "sliding_attention" in types:
    if sliding is not True:
      _fail("use_sliding_window", sliding, "true where layer_types has sliding_attention "
            "(transformers' eager and sdpa attention slide there, flash-attention does not)")
    _int(config, "sliding_window")
  return types, rope


def _letters(config: dict, types: list[str], rope: list[bool]) -> tuple[str, dict, list[str]]:
  """(the layer letters, the model.* keys they fix: window, swa_pos, global_pos, notes)."""
  pos = lambda uses: "rope" if uses else "nope"
  slide = [i for i, t in enumerate(types) if t == "sliding_attention"]
  full = [i for i, t in enumerate(types) if t == "full_attention"]
  if len({rope[i] for i in slide}) > 1:
    _fail("no_rope_layers", [int(r) for r in rope], f"one value over the sliding layers {slide}: "
          f"our S layers share one model.swa_pos")
  keys = {}
  if slide:
    keys.update(window=config["sliding_window"], swa_pos=pos(rope[slide[0]]))
  if len({rope[i] for i in full}) <= 1:
    if full:
      keys["global_pos"] = pos(rope[full[0]])
    return "".join(LETTER_OF_HF_ATTENTION[t] for t in types), keys, []
  if slide:
    _fail("no_rope_layers", [int(r) for r in rope], "one value over the full-attention layers "
          f"{full} where layers {slide} slide: our G layers share one model.global_pos, and the "
          f"RoPE ones could be S layers only without a sliding window of their own")
  window = _int(config, "max_position_embeddings")
  # RoPE full attention is sliding attention whose window covers every position.
  letters = "".join(LETTER_OF_HF_ATTENTION["sliding_attention" if r else "full_attention"]
                    for r in rope)
  note = (f"full-attention layers with RoPE {[i for i in full if rope[i]]} are S layers with "
          f"window = max_position_embeddings = {window} (exactly full attention up to that "
          f"length); the NoPE ones {[i for i in full if not rope[i]]} are G layers")
  return letters, dict(window=window, swa_pos="rope", global_pos="nope"), [note]


def shortest_unit(letters: str) -> str:
  """The shortest string that repeats to `letters` ("SSSGSSSG" -> "SSSG")."""
  for n in range(1, len(letters) + 1):
    if len(letters) % n == 0 and letters[:n] * (len(letters) // n) == letters:
      return letters[:n]
  raise AssertionError("unreachable")


def model_keys(config: dict) -> tuple[dict, list[str]]:
  """(model.* values config.json fixes, notes); HFImportError for what we cannot express."""
  unknown = sorted(set(config) - READ_KEYS - INERT_KEYS)
  if unknown:
    raise HFImportError(
        f"config.json key {unknown[0]!r} is not known to the importer (hybrid_nope/export/"
        f"hf_import.py reads {sorted(READ_KEYS)} and ignores {sorted(INERT_KEYS)}): it may "
        f"change the forward pass, so the import stops rather than drop it")
  if config.get("model_type") != hf.MODEL_TYPE:
    _fail("model_type", config.get("model_type"), f"{hf.MODEL_TYPE!r} (SmolLM3's layout; our "
          f"exports with L or D layers, model_type {hf.REMOTE_MODEL_TYPE!r}, are not read back)")
  missing = [k for k in SIZES if k not in config]
  if missing:
    raise HFImportError(f"config.json has no {missing[0]!r}: expected every size written out "
                        f"({sorted(SIZES)})")
  config = {**DEFAULTS, **config}
  out = {ours: _int(config, key) for key, ours in SIZES.items()}
  if out["num_heads"] % out["num_kv_heads"]:
    _fail("num_key_value_heads", out["num_kv_heads"],
          f"a divisor of num_attention_heads={out['num_heads']}")
  out["head_dim"] = (_int(config, "head_dim") if config.get("head_dim") is not None
                     else out["d_model"] // out["num_heads"])
  for key in ("attention_bias", "mlp_bias"):
    if config[key] is not False:
      _fail(key, config[key], "false: our projections have no bias")
  if config["hidden_act"] not in SILU:
    _fail("hidden_act", config["hidden_act"], f"one of {SILU} (our MLP is SwiGLU)")
  eps = config["rms_norm_eps"]
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
    _fail("rms_norm_eps", eps, "a positive number")
  tied = config["tie_word_embeddings"]
  if not isinstance(tied, bool):
    _fail("tie_word_embeddings", tied, "true or false")
  out.update(norm_eps=float(eps), tie_embeddings=tied, rope_theta=_rope_theta(config))
  letters, keys, notes = _letters(config, *_layer_types(config, out["num_layers"]))
  out.update(pattern=shortest_unit(letters), **keys)
  return out, notes


def sources(num_layers: int, tied: bool) -> dict[str, tuple[str, int]]:
  """Our leaf ("blocks/0/attn/wq_DNH") → (its tensor, our leading input axes; 0 = as is)."""
  out = {"embed/embedding_VD": ("model.embed_tokens.weight", 0),
         "final_norm/scale_D": ("model.norm.weight", 0)}
  for i in range(num_layers):
    hf_layer, ours = f"model.layers.{i}.", f"blocks/{i}/"
    out.update({
        ours + "attn_norm/scale_D": (hf_layer + "input_layernorm.weight", 0),
        ours + "attn/wq_DNH": (hf_layer + "self_attn.q_proj.weight", 1),
        ours + "attn/wk_DKH": (hf_layer + "self_attn.k_proj.weight", 1),
        ours + "attn/wv_DKH": (hf_layer + "self_attn.v_proj.weight", 1),
        ours + "attn/wo_NHD": (hf_layer + "self_attn.o_proj.weight", 2),
        ours + "mlp_norm/scale_D": (hf_layer + "post_attention_layernorm.weight", 0),
        ours + "mlp/w_gate_DF": (hf_layer + "mlp.gate_proj.weight", 1),
        ours + "mlp/w_up_DF": (hf_layer + "mlp.up_proj.weight", 1),
        ours + "mlp/w_down_FD": (hf_layer + "mlp.down_proj.weight", 1)})
  if not tied:
    out["head_DV"] = ("lm_head.weight", 1)
  return out


def hf_shape(ours: tuple[int, ...], inputs: int) -> tuple[int, ...]:
  """The tensor's shape for our leaf's: as is, or a Linear [out, in] (hf._linear's)."""
  if not inputs:
    return tuple(ours)
  return (math.prod(ours[inputs:]), math.prod(ours[:inputs]))


def _exact_model(metadata: dict, config: dict, base_model: dict) -> dict | None:
  """Our export's model config from the metadata, if it exports to this config.json's
  forward-pass keys exactly (else None: the file was edited, or is not ours)."""
  try:
    stored = json.loads(metadata[hf.META_MODEL])
    model = ml_collections.ConfigDict({**base_model, **stored})
    written = hf.hf_config(ml_collections.ConfigDict({"model": model}))
  except (KeyError, TypeError, ValueError, AttributeError):
    return None  # No metadata, or a model config this version cannot export.
  keys = READ_KEYS - {"model_type", "max_position_embeddings", "no_rope_layer_interval"}
  same = all(written.get(k) == config[k] for k in keys if k in config)
  return model.to_dict() if same and set(stored) <= set(base_model) else None


def final_norm(weights: Weights, d_model: int) -> tuple[np.ndarray, bool]:
  """(our tied final norm's gains, whether exact): the export's unfolded ones where they fold
  to exactly this model.norm.weight, else that weight × sqrt(D) (float64, rounded once)."""
  metadata = weights.metadata
  folded_D = weights.get("model.norm.weight")
  if hf.META_FINAL_NORM in metadata and folded_D.dtype == np.float32:
    try:
      gains_D = np.frombuffer(base64.b64decode(metadata[hf.META_FINAL_NORM]), "<f4")
    except ValueError:
      gains_D = None
    if gains_D is not None and gains_D.shape == folded_D.shape and np.array_equal(
        (gains_D * np.float32(d_model ** -0.5)).view(np.uint32), folded_D.view(np.uint32)):
      return gains_D.astype(np.float32), True
  return (folded_D.astype(np.float64) * math.sqrt(d_model)).astype(np.float32), False


def check_names(weights: Weights, wanted: dict[str, tuple[str, int]]) -> None:
  """Every tensor the model needs is there and nothing else is (biases, other layers); a tied
  model's lm_head.weight may be (then read, and compared with the embedding)."""
  names = set(weights.file_of)
  needed = {name for name, _ in wanted.values()}
  missing = sorted(needed - names)
  if missing:
    raise HFImportError(f"tensor {missing[0]} is missing from the weights "
                        f"({len(missing)} of {len(needed)} the config's model needs)")
  extra = sorted(n for n in names - needed - {"lm_head.weight"}
                 if not n.endswith(IGNORED_TENSOR_SUFFIX))
  if extra:
    raise HFImportError(f"tensor {extra[0]} is not one the config's model has ({len(extra)} "
                        f"such, e.g. {extra[:3]}): biases or layers we cannot express")


@dataclasses.dataclass
class Imported:
  model: dict           # model.* (the base config's, with what config.json fixes)
  params: dict          # our params tree, numpy, dtypes as stored
  notes: list[str]
  exact: bool           # read back through our export's metadata (bit for bit)


def _check_shapes(weights: Weights, wanted: dict, flat: dict) -> None:
  """Each tensor's header shape is what config.json's sizes give our leaf (before any read)."""
  unknown = sorted(set(flat) - set(wanted))
  if unknown:
    raise HFImportError(f"our model has parameter {unknown[0]}, which the importer does not "
                        f"map (hybrid_nope/export/hf_import.py: sources)")
  for leaf, (name, inputs) in wanted.items():
    if weights.shape(name) != hf_shape(flat[leaf], inputs):
      raise HFImportError(f"tensor {name} has shape {list(weights.shape(name))} in "
                          f"{weights.file_of[name]}, but config.json's sizes make it "
                          f"{list(hf_shape(flat[leaf], inputs))}")


def _check_finite(weights: Weights, wanted: dict, leaves: dict[str, np.ndarray]) -> None:
  """Every weight is finite: a NaN or inf imports as a model whose every loss and logit is NaN
  (score prints nan, generate token 0). Names the first such tensor and how many others."""
  bad = [(leaf, int(np.count_nonzero(~np.isfinite(x))), x.size) for leaf, x in leaves.items()]
  bad = [b for b in bad if b[1]]
  if bad:
    (leaf, count, size), name = bad[0], wanted[bad[0][0]][0]
    more = (f"; {len(bad) - 1} more tensors hold some, e.g. "
            f"{[wanted[b[0]][0] for b in bad[1:4]]}" if len(bad) > 1 else "")
    raise HFImportError(f"tensor {name} (our params/{leaf}) of {weights.file_of[name]} holds "
                        f"{count} non-finite values (NaN or inf) of {size}{more}: the weights "
                        f"are broken, and a model of them computes NaN")


def read(hf_dir: str, base_model: dict) -> Imported:
  """The model in `hf_dir`. `base_model`: model.* of the config it joins (keys config.json
  cannot fix keep their values)."""
  config = read_config(hf_dir)
  fixed, notes = model_keys(config)
  with Weights(hf_dir) as weights:
    exact_model = _exact_model(weights.metadata, config, base_model)
    if exact_model is None and hf.META_MODEL in weights.metadata:
      notes.append(f"{hf.META_MODEL} in the safetensors metadata does not export to this "
                   f"config.json (edited after the export?): model.* derived from config.json")
    model = exact_model or {**base_model, **fixed}
    tied = model["tie_embeddings"]
    wanted = sources(model["num_layers"], tied)
    check_names(weights, wanted)
    flat = _flat_shapes(abstract_params(ml_collections.ConfigDict(model)))
    _check_shapes(weights, wanted, flat)
    leaves, exact = {}, exact_model is not None
    for leaf, (name, inputs) in wanted.items():
      if leaf == "final_norm/scale_D" and tied:
        leaves[leaf], exact_norm = final_norm(weights, model["d_model"])
        exact = exact and exact_norm
      else:  # Transposed and viewed: the copy is made contiguous one tensor at a time.
        w = weights.get(name)
        leaves[leaf] = np.ascontiguousarray(w if not inputs else w.T.reshape(flat[leaf]))
    _check_finite(weights, wanted, leaves)
    if tied and "lm_head.weight" in weights.file_of and not np.array_equal(
        weights.get("lm_head.weight"), leaves["embed/embedding_VD"]):
      _fail("tie_word_embeddings", True, "false, or lm_head.weight equal to "
            "model.embed_tokens.weight (they differ)")
  if exact and model.get("param_dtype") == "bfloat16":
    # The export widened bfloat16 storage to float32 exactly; narrowing restores the bits.
    leaves = {k: v.astype(ml_dtypes.bfloat16) for k, v in leaves.items()}
  return Imported(model=model, params=_unflat(leaves), notes=notes, exact=exact)


def _flat_shapes(tree, prefix: str = "") -> dict[str, tuple[int, ...]]:
  """{"blocks/0/attn/wq_DNH": shape} of a params tree (dicts, int or str keys)."""
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    out.update(_flat_shapes(value, name + "/") if isinstance(value, dict) else
               {name: tuple(value.shape)})
  return out


def _unflat(leaves: dict[str, np.ndarray]) -> dict:
  """The params tree of init_model (blocks keyed by int) from "a/b/c" names."""
  tree = {}
  for name, value in leaves.items():
    *parents, last = [int(p) if p.isdigit() else p for p in name.split("/")]
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[last] = value
  return tree
