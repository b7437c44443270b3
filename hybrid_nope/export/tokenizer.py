"""The tokenizer files that go with an exported model, chosen from the run's own config by `plan`.

- byte-tokenised runs (registry.byte_tokenised: data.source=stdlib, or a text source with
  data.tokenizer="byte"): our byte tokenizer (data/tokenization/tokenizer.py: ids 0..255 = bytes, BOS 256,
  EOS 257) has an exact Hugging Face form: a byte-level BPE with no merges whose vocabulary
  lists the 256 byte symbols in byte order, BOS/EOS as special tokens, and a post-processor
  that starts each text with BOS as our documents start. It is built here.
- text sources with data.tokenizer a tokenizer.json (local or a URL): that file, copied byte for
  byte, with the tokenizer_config.json and special_tokens_map.json beside it where there are
  any (else a tokenizer_config.json naming the fast tokenizer class, and no BOS/EOS guessed).
- documents (a prepared corpus such as the English prose one): the tokenizer.json it holds
  (hybrid_nope.data.tokenization.bpe), copied, with a tokenizer_config.json naming its BOS and EOS.
- mds (ProLong): the data came tokenised and the run's config names no tokenizer, so none is
  guessed: --tokenizer=PATH (a tokenizer.json, or a directory holding one and optionally
  tokenizer_config.json / special_tokens_map.json) copies it, checked against model.vocab_size;
  without it the export says it has no tokenizer. An imported run's carried tokenizer is passed
  the same way.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.data.sources import registry
from hybrid_nope.data.tokenization import tokenizer as byte_tokenizer
from hybrid_nope.errors import UserError

BOS_TOKEN, EOS_TOKEN = "<|bos|>", "<|eos|>"
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TokenizerError(UserError):
  """A --tokenizer path, or a run, whose tokenizer the export cannot write."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """What goes with the model: `write(out)` writes it and returns the paths; `note` says it."""
  note: str
  write: Callable[[str], list[str]]
  bos_id: int | None = None
  eos_id: int | None = None


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte → printable character map, the alphabet of HF's ByteLevel pre-tokenizer."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


def byte_level_tokenizer():
  """A `tokenizers.Tokenizer` giving exactly ByteTokenizer.encode(text, add_eos=False)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, processors

  vocab = {char: b for b, char in bytes_to_unicode().items()}  # Id = byte value.
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  # No regex split and no prefix space: every byte of the text, as is, becomes one token.
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(BOS_TOKEN, special=True),
                          tokenizers.AddedToken(EOS_TOKEN, special=True)])
  assert tok.token_to_id(BOS_TOKEN) == byte_tokenizer.BOS_ID, tok.token_to_id(BOS_TOKEN)
  assert tok.token_to_id(EOS_TOKEN) == byte_tokenizer.EOS_ID, tok.token_to_id(EOS_TOKEN)
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
      special_tokens=[(BOS_TOKEN, byte_tokenizer.BOS_ID)])
  return tok


def _fast_tokenizer_config(out: str, special: dict) -> str:
  """A tokenizer_config.json for a tokenizer.json in OUT: the fast class, and `special`."""
  path = os.path.join(out, "tokenizer_config.json")
  with open(path, "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **special,
               "clean_up_tokenization_spaces": False, "model_max_length": int(1e30)}, f,
              indent=2)
  return path


def _write_byte_tokenizer(out: str) -> list[str]:
  json_path = os.path.join(out, "tokenizer.json")
  byte_level_tokenizer().save(json_path)
  return [json_path, _fast_tokenizer_config(out, {"bos_token": BOS_TOKEN,
                                                   "eos_token": EOS_TOKEN})]


def _given_files(path: str) -> tuple[str, list[str]]:
  """(the tokenizers JSON file, the HF files beside it) that --tokenizer=PATH names."""
  if os.path.isdir(path):
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
      raise TokenizerError(f"--tokenizer={path} is a directory without tokenizer.json")
    extras = [os.path.join(path, name) for name in COPIED_FILES[1:]
              if os.path.isfile(os.path.join(path, name))]
    return os.path.join(path, "tokenizer.json"), extras
  if not os.path.isfile(path) or not path.endswith(".json") or \
      os.path.basename(path) in COPIED_FILES[1:]:
    raise TokenizerError(f"--tokenizer={path}: expected a tokenizer.json file or a directory "
                         f"holding one")
  return path, []


def _special_ids(extras: list[str], tok) -> tuple[int | None, int | None]:
  """BOS/EOS ids named by a tokenizer_config.json beside the tokenizer, if there is one."""
  config = [f for f in extras if f.endswith("tokenizer_config.json")]
  if not config:
    return None, None
  values = json.loads(storage.read_text(config[0]))
  ids = []
  for key in ("bos_token", "eos_token"):
    token = values.get(key)
    token = token.get("content") if isinstance(token, dict) else token
    ids.append(tok.token_to_id(token) if isinstance(token, str) else None)
  return ids[0], ids[1]


def _copy_plan(path: str, vocab_size: int) -> Plan:
  import tokenizers  # pylint: disable=g-import-not-at-top
  json_file, extras = _given_files(path)
  try:
    tok = tokenizers.Tokenizer.from_file(json_file)
  except Exception as e:  # tokenizers raises its own exception types for a bad file.
    raise TokenizerError(f"--tokenizer: {json_file} is not a tokenizers JSON file: {e}") from None
  size = tok.get_vocab_size(with_added_tokens=True)
  if size > vocab_size:
    raise TokenizerError(f"--tokenizer: {json_file} has {size} tokens but the model's "
                         f"config.model.vocab_size is {vocab_size}: not the run's tokenizer")
  bos, eos = _special_ids(extras, tok)

  def write(out):
    copies = [(json_file, "tokenizer.json")] + [(f, os.path.basename(f)) for f in extras]
    return [shutil.copyfile(src, os.path.join(out, name)) for src, name in copies]
  return Plan(f"tokenizer copied from {path} ({size} tokens)", write, bos, eos)


def _documents_plan(config) -> Plan:
  from hybrid_nope.data.tokenization import bpe
  from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
  try:
    tok = documents.read_tokenizer(config.data.path)
  except UserError as e:
    raise TokenizerError(f"the run's tokenizer (data.source=documents): {e}") from None
  if tok.vocab_size > config.model.vocab_size:
    raise TokenizerError(f"config.model.vocab_size={config.model.vocab_size} is below the "
                         f"{tok.vocab_size} ids of {config.data.path}'s {documents.TOKENIZER}")
  json_file = os.path.join(config.data.path, documents.TOKENIZER)

  def write(out):
    return [shutil.copyfile(json_file, os.path.join(out, "tokenizer.json")),
            _fast_tokenizer_config(out, {"bos_token": bpe.BOS_TOKEN, "eos_token": bpe.EOS_TOKEN})]
  return Plan(f"tokenizer copied from {json_file} ({tok.vocab_size} tokens, data.source="
              f"documents)", write, tok.bos_id, tok.eos_id)


def _data_tokenizer_plan(config, path: str | None) -> Plan:
  """A text source's data.tokenizer (a tokenizer.json path or URL), copied byte for byte."""
  source, name = config.data.source, config_values.text_tokenizer(config)
  if path:
    raise TokenizerError(f"--tokenizer={path}: the run tokenised data.source={source} with "
                         f"config.data.tokenizer={name}, which the export copies itself; drop "
                         f"--tokenizer")
  if not storage.exists(name):
    raise TokenizerError(f"config.data.tokenizer={name} does not exist: the run's tokenizer is "
                         f"needed beside the export; restore the file, or pass "
                         f"--config.data.tokenizer= to where it is now")
  import tokenizers  # pylint: disable=g-import-not-at-top
  data = storage.read_bytes(name)
  try:
    tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
  except Exception as e:  # tokenizers raises its own exception types for a bad file.
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise TokenizerError(f"config.data.tokenizer={name} is not a tokenizers JSON file: "
                         f"{reason}") from None
  size = tok.get_vocab_size(with_added_tokens=True)
  if size > config.model.vocab_size:
    raise TokenizerError(f"config.model.vocab_size={config.model.vocab_size} is below the "
                         f"{size} ids of config.data.tokenizer={name}")
  base = name[:-len(os.path.basename(name))]  # Its directory, local or a URL, with the "/".
  beside = {n: base + n for n in COPIED_FILES[1:] if base + n != name and storage.exists(base + n)}
  bos, eos = _special_ids([p for n, p in beside.items() if n == "tokenizer_config.json"], tok)

  def write(out):
    written = [os.path.join(out, "tokenizer.json")]
    storage.write_bytes(written[0], data)
    for n, src in beside.items():
      written.append(os.path.join(out, n))
      storage.write_bytes(written[-1], storage.read_bytes(src))
    if "tokenizer_config.json" not in beside:
      written.append(_fast_tokenizer_config(out, {}))
    return written
  return Plan(f"tokenizer copied from {name} (config.data.tokenizer, {size} tokens)", write,
              bos, eos)


def plan(config, path: str | None) -> Plan:
  """What the run's tokenizer is, decided from its config (module docstring) and checked before
  anything is written; `path` (--tokenizer, or an imported run's carried tokenizer) names one
  for a run whose config names none."""
  source = config.data.source
  kind = registry.named(config)
  if registry.byte_tokenised(config):
    if path:
      raise TokenizerError(f"--tokenizer={path}: the run trained on data.source={source} with "
                           f"the byte tokenizer, which the export writes itself; drop "
                           f"--tokenizer")
    if config.model.vocab_size < byte_tokenizer.VOCAB_SIZE:
      raise TokenizerError(f"config.model.vocab_size={config.model.vocab_size} is below the "
                           f"byte tokenizer's {byte_tokenizer.VOCAB_SIZE} ids")
    named = "" if kind.byte_tokens else ", data.tokenizer=byte"
    return Plan(f"byte tokenizer (data.source={source}{named}) written as a byte-level "
                f"tokenizer.json", _write_byte_tokenizer, byte_tokenizer.BOS_ID,
                byte_tokenizer.EOS_ID)
  if kind.text:
    return _data_tokenizer_plan(config, path)
  if kind.prepared and not path:
    return _documents_plan(config)
  if path:
    return _copy_plan(path, config.model.vocab_size)
  return Plan(f"no tokenizer written: data.source={source} came tokenised and the run's config "
              f"names no tokenizer (ProLong's is Llama-3's); pass --tokenizer=PATH to a "
              f"tokenizer.json or its directory to include it", lambda out: [])
