"""What a checkpoint records of the data it was trained on, so a resume onto other data is seen.

The fingerprint is a flat {name: value} of JSON scalars. A resume compares it entry by entry
(`run.checkpoint.changed_data`): a different stdlib (another interpreter), a changed
data.path, data.domains, data.exclude_samples, seq_len, vocabulary, shuffle seed, a rewritten
shard or another eval set each change an entry, and the message names it; a text source
(jsonl, parquet, hf) adds its field, tokenizer, the sha1 of its documents' token counts and
each file's sha256 (text_rows.TextCorpus.fingerprint), so an edited file is named at resume.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.data import mds, mixture, pipeline


def _sha1(*arrays: np.ndarray) -> str:
  h = hashlib.sha1()
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def _mds_domains(config) -> dict:
  """Per domain read: the sha1 of its index.json (shard names, sizes, hashes, sample counts)
  and its sample count; the samples data.exclude_samples skips."""
  out = {"data.path": _where(config.data.path)}
  excluded = config_values.exclude_samples(config)
  if excluded:  # Absent when empty, as in fingerprints written before the key existed.
    out["data.exclude_samples"] = ",".join(sorted(excluded))
  for spec in mixture.parse_domains(config.data.domains):
    if spec.weight == 0:
      continue
    raw = storage.read_bytes(storage.join(config.data.path, spec.name, mds.INDEX_BASENAME))
    out[f"domain.{spec.name}.weight"] = spec.weight
    out[f"domain.{spec.name}.index_sha1"] = hashlib.sha1(raw).hexdigest()
    out[f"domain.{spec.name}.samples"] = sum(int(s.get("samples", 0))
                                             for s in json.loads(raw).get("shards", []))
  return out


def data_fingerprint(config, eval_batches: list[dict]) -> dict:
  """The training data's identity under `config`, and the eval set's (`eval_batches`, as the
  loop holds them). Costs one sha1 over the stdlib corpus (~0.2 s), index.json reads for mds."""
  d = config.data
  out = {"data.source": d.source, "data.seq_len": d.seq_len, "data.seed": d.seed,
         "model.vocab_size": config.model.vocab_size,
         "eval.rows_sha1": _sha1(*[b[k] for b in eval_batches for k in ("inputs", "segment_ids")])}
  if d.source in config_values.IN_MEMORY_SOURCES:  # The rows themselves identify them.
    rows = pipeline.packed_rows(config, "train")
    out.update({"train.rows": len(rows["inputs"]),
                "train.tokens_sha1": _sha1(rows["inputs"], rows["segment_ids"])})
    if d.source == "stdlib":
      out["data.eval_fraction"] = d.eval_fraction
  elif d.source in config_values.TEXT_SOURCES:
    from hybrid_nope.data import text_rows  # pylint: disable=g-import-not-at-top
    out.update({"data.document_masking": d.document_masking, "data.eval_fraction":
                d.eval_fraction, "data.path": _where(d.path),
                **text_rows.corpus(config).fingerprint()})
  else:
    out.update({"data.document_masking": d.document_masking, "eval.path": config.eval.path,
                **_mds_domains(config)})
  return out


def _where(path: str) -> str:
  """A local path made absolute (a relative one names other data from another directory)."""
  return path if storage.is_url(path) else os.path.abspath(path)
