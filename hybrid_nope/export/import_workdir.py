"""A transformers checkpoint of the SmolLM3 layout written as a workdir that launch/analyze.py,
score.py, generate.py and export_hf.py read (launch/import_hf.py; hf_import.py maps the model):

  WORKDIR/checkpoints/1/   the params, by the trainer's own Checkpointer (run/imported.py:
                           a checksum of every leaf in meta, which every reader verifies); the
                           TrainState has no optimizer state, so it is not a run to resume
  WORKDIR/tokenizer/       the directory's tokenizer files (run_dir.TOKENIZER), unless they are
                           our byte tokenizer
  WORKDIR/config.json      the given config (configs/base.py and --config.* overrides) with
                           model.* from the directory; written last, so a cut import is no
                           workdir a reader takes for whole

The step is IMPORTED_STEP, not 0: step 0 names the initialisation in every record, and analyze
sets the imported model beside a fresh initialisation of its shape.

The tokenizer decides data.source: a tokenizer.json that tokenises as our byte tokenizer (our
export of a byte-level run) gives "stdlib", the embedded corpus as eval data; any other, or none,
gives "mds", whose eval data (eval.path) is TextbookChapters, or any .txt/.jsonl/.parquet text,
prepared with the carried tokenizer by `python -m hybrid_nope.data.sources.textbook_chapters`
(docs/analysis.md). A byte source (stdlib, documents) with another tokenizer is refused: its token
ids would not be the model's.
"""
from __future__ import annotations

import os

import jax
import ml_collections

from hybrid_nope.run import run_dir, storage
from hybrid_nope.data.sources import registry
from hybrid_nope.data.tokenization import tokenizer as byte_tokenizer
from hybrid_nope.export import hf_import
from hybrid_nope.export import tokenizer as export_tokenizer

IMPORTED_STEP = 1
BYTE_PROBE = "def f(x):\n    return x + 1  # héllo ✓ 😀\t\x00\xff"  # Every byte class.


def is_byte_tokenizer(path: str) -> bool:
  """Whether the tokenizer.json at `path` is ours (export/tokenizer.py): the same vocabulary and
  the same ids for a probe text as ByteTokenizer with BOS."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # tokenizers raises its own kinds for a bad file.
    raise hf_import.HFImportError(f"{path} is not a tokenizers JSON file: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e)}") from None
  ours = export_tokenizer.byte_level_tokenizer()
  if tok.get_vocab(with_added_tokens=True) != ours.get_vocab(with_added_tokens=True):
    return False
  want = byte_tokenizer.ByteTokenizer().encode(BYTE_PROBE, add_eos=False).tolist()
  return tok.encode(BYTE_PROBE).ids == want


def tokenizer_plan(hf_dir: str, source: str | None, vocab_size: int) -> tuple[str, list[str],
                                                                             str]:
  """(data.source, the tokenizer files to carry, a note): `source` as the command line set it,
  or None for the import's choice (module docstring); a byte source with another tokenizer
  is refused."""
  json_file = os.path.join(hf_dir, export_tokenizer.COPIED_FILES[0])
  if not os.path.isfile(json_file):
    source = source or "mds"
    return source, [], (f"no tokenizer.json in {hf_dir}: score and generate need "
                        f"--tokenizer=; analyze reads eval data tokenised already "
                        f"(data.source={source})")
  if is_byte_tokenizer(json_file):
    source = source or "stdlib"
    return source, [], f"byte tokenizer (ours): data.source={source}"
  source = source or "mds"
  known = registry.lookup(source)
  if known and known.byte_tokens:
    raise hf_import.HFImportError(
        f"config.data.source={source!r} tokenises with our byte tokenizer, but {json_file} is "
        f"another: its token ids would not be the model's (leave data.source to the import, "
        f"or set it to 'mds' with eval.path prepared with this tokenizer)")
  import tokenizers  # pylint: disable=g-import-not-at-top
  size = tokenizers.Tokenizer.from_file(json_file).get_vocab_size(with_added_tokens=True)
  if size > vocab_size:
    raise hf_import.HFImportError(f"{json_file} has {size} tokens but config.json's vocab_size "
                                  f"is {vocab_size}: not this model's tokenizer")
  files = [p for p in (os.path.join(hf_dir, n) for n in export_tokenizer.COPIED_FILES)
           if os.path.isfile(p)]
  return source, files, (f"{json_file} ({size} tokens) carried into {run_dir.TOKENIZER}/; "
                         f"data.source={source}")


def _check_out(out: str) -> None:
  if storage.exists(out) and (not storage.isdir(out) or storage.listdir(out)):
    raise hf_import.HFImportError(f"--out={out} exists and is not an empty directory: an import "
                                  f"writes a new workdir; remove it or name a new one")


def import_hf(hf_dir: str, out: str, config: ml_collections.ConfigDict,
              overridden: list[str] = ()) -> dict:
  """Writes the workdir `out` from `hf_dir`; `config` is the config it joins (model.* is
  replaced), `overridden` the keys the command line set (model.* ones are refused). Returns
  {"out", "files", "model", "notes", "exact", "tensors", "bytes"}."""
  model_keys = sorted(k for k in overridden if k.startswith("model."))
  if model_keys:
    raise hf_import.HFImportError(f"--config.{model_keys[0]}: model.* comes from the Hugging "
                                  f"Face config.json and cannot be overridden")
  _check_out(out)
  config = ml_collections.ConfigDict(config.to_dict())
  vocab = hf_import.model_keys(hf_import.read_config(hf_dir))[0]["vocab_size"]
  source, carried, note = tokenizer_plan(
      hf_dir, config.data.source if "data.source" in overridden else None, vocab)
  imported = hf_import.read(hf_dir, config.model.to_dict())
  config.model = ml_collections.ConfigDict(imported.model)
  config.data.source = source

  # The workdir is run/'s to write; orbax is imported only now an import is written.
  from hybrid_nope.run.imported import write_imported  # pylint: disable=g-import-not-at-top
  files = write_imported(out, config, imported.params, step=IMPORTED_STEP,
                         meta={"imported_from": os.path.abspath(hf_dir)},
                         tokenizer_files=carried or ())
  leaves = jax.tree.leaves(imported.params)
  return {"out": out, "files": files, "model": imported.model, "exact": imported.exact,
          "notes": imported.notes + [note], "tensors": len(leaves),
          "bytes": sum(x.nbytes for x in leaves)}


def summary(result: dict) -> str:
  """What the import wrote, for the terminal."""
  m = result["model"]
  lines = [f"imported {result['tensors']} tensors ({result['bytes'] / 2**20:.1f} MiB) as "
           f"checkpoint step {IMPORTED_STEP}: pattern {m['pattern']!r} x{m['num_layers']} "
           f"layers, d_model {m['d_model']}, heads {m['num_heads']}/{m['num_kv_heads']} kv, "
           f"swa_pos {m['swa_pos']}, global_pos {m['global_pos']}"
           + (" (bit for bit: our export's metadata)" if result["exact"] else "")]
  lines += [f"  {note}" for note in result["notes"]]
  lines += [f"  wrote {path}" for path in result["files"]]
  return "\n".join(lines)
