"""What a checkpoint records of the data it was trained on, so a resume onto other data is seen.

The fingerprint is a flat {name: value} of JSON scalars. A resume compares it entry by entry
(`run.checkpoint.changed_data`): a different stdlib (another interpreter), a changed
data.path, data.domains, data.exclude_samples, seq_len, vocabulary, shuffle seed, a rewritten
shard or another eval set each change an entry, and the message names it; a text source
(jsonl, parquet, hf) adds its field, tokenizer, the sha1 of its documents' token counts and
each file's sha256 (text_rows.TextCorpus.fingerprint), so an edited file is named at resume.
"""
from __future__ import annotations

from hybrid_nope.data.sources import registry


def data_fingerprint(config, eval_batches: list[dict]) -> dict:
  """The training data's identity under `config`, and the eval set's (`eval_batches`, as the
  loop holds them): the keys every source shares, then the source's own (`Source.fingerprint`).
  Costs one sha1 over the stdlib corpus (~0.2 s), index.json reads for mds."""
  d = config.data
  out = {"data.source": d.source, "data.seq_len": d.seq_len, "data.seed": d.seed,
         "model.vocab_size": config.model.vocab_size,
         "eval.rows_sha1": registry.sha1(*[b[k] for b in eval_batches
                                           for k in ("inputs", "segment_ids")])}
  out.update(registry.named(config).fingerprint(config))
  return out
