"""Rows of a text source (data.source jsonl, parquet or hf): documents read where users keep
them (text_files), tokenised with data.tokenizer once, when the length index is built (their ids
cached beside it, text_ids; the byte tokenizer's on the fly), packed as MDS raw domains are.

The documents of data.path, files in sorted order and records in file order, are split by the
stdlib corpus's rule on the name "<file basename>:<record number>": a document is eval iff
crc32(name) < data.eval_fraction * 2**32 (fixed by the names alone, so it does not move when
files are added or the data is copied elsewhere). Each split is one stream of its documents in
order, cut into rows by packing.StreamRows (segment ids, positions and weights per document;
the last row padded): the train split's rows shuffled by grain every epoch (data.seed), the
eval split's in order. Row k is a pure function of k: the trainer's data position (rows
consumed) resumes it exactly, and process p of n reads only rows p, p + n, ...
(pipeline.train_dataset). Where a row starts is known from the length index (text_index).

A document tokenised on the fly whose tokens no longer match the index (its file rewritten in
place under an unchanged size and time) fails naming the file and record. The fingerprint
names each file's sha256 (recorded with the index, as the cached ids are), so a file edited,
truncated or replaced since a checkpoint, even under the same token counts, is refused at
resume naming the file and both hashes.
"""
from __future__ import annotations

import functools
import hashlib
import posixpath

import grain
import numpy as np

from hybrid_nope import config_values
from hybrid_nope.data.pipeline import packing
from hybrid_nope.data.formats import text_files, text_index
from hybrid_nope.data.formats.mds import default_cache_dir
from hybrid_nope.data.sources.stdlib_corpus import is_eval_path
from hybrid_nope.data.tokenization.tokenizer import text_tokenizer
from hybrid_nope.errors import ConfigError

SPLITS = ("train", "eval")
_DOCUMENTS_KEPT = 16  # Tokenised documents a corpus keeps: a long one spans several rows.


class TextCorpus:
  """The documents of one text source, their index and their split."""

  def __init__(self, source: str, path: str, field: str, tokenizer: str, cache_dir: str,
               eval_fraction: float, verify_hashes: bool | str):
    self.source, self.path, self.field = source, path, field
    self.readers = text_files.readers(source, path, field)
    self.tokenizer = text_tokenizer(tokenizer)
    self.index = text_index.index(self.readers, self.tokenizer, field, cache_dir,
                                  verify_hashes=verify_hashes)
    names = [f"{posixpath.basename(r.name)}:{i}"
             for r, count in zip(self.readers, self.index.counts) for i in range(count)]
    is_eval = np.array([is_eval_path(n, eval_fraction) for n in names], bool)
    self.documents = {"train": np.flatnonzero(~is_eval), "eval": np.flatnonzero(is_eval)}
    for split, docs in self.documents.items():
      if not docs.size:
        raise ConfigError(f"config.data.eval_fraction={eval_fraction} leaves the {split} split "
                          f"of the {is_eval.size} documents in config.data.path={path!r} empty")
    self._token_starts = self.index.token_starts
    self.tokens = functools.lru_cache(maxsize=_DOCUMENTS_KEPT)(self._tokens)

  def _tokens(self, doc: int) -> np.ndarray:
    """int32 [length] tokens of document `doc` (of all files), checked against the index."""
    f = int(np.searchsorted(self.index.file_starts, doc, side="right")) - 1
    i = doc - int(self.index.file_starts[f])
    ids = self.tokenizer.encode(self.readers[f].text(i))
    if ids.size != self.index.lengths[doc]:
      raise text_files.TextDataError(
          f"{self.readers[f].where(i)} tokenises to {ids.size} tokens, but its index says "
          f"{self.index.lengths[doc]}: the file changed in place since the index was built; "
          f"restore it, or touch it (a new modification time builds a new index)")
    return ids

  def read(self, doc: int, lo: int, hi: int) -> np.ndarray:
    """Tokens [lo, hi) of document `doc` (of all files): a slice of the cached ids where the
    index has them (text_ids), else tokenised now."""
    if self.index.ids is None:
      return self.tokens(doc)[lo:hi]
    start = int(self._token_starts[doc])
    return self.index.ids[start + lo:start + hi]

  def rows(self, split: str, seq_len: int, document_masking: bool) -> packing.StreamRows:
    docs = self.documents[split]
    return packing.StreamRows(self.index.lengths[docs],
                              lambda d, lo, hi: self.read(int(docs[d]), lo, hi),
                              seq_len=seq_len, document_masking=document_masking)

  def fingerprint(self) -> dict:
    """What identifies the data: the documents' token counts, file names and field, and one
    entry per file, "text.sha256.<file>", its content's hash: a resume's message names the
    edited file (and an added or removed one) with the hash saved and the hash found."""
    h = hashlib.sha1()
    for r in self.readers:
      h.update(r.name.encode() + b"\0")
    h.update(self.index.counts.tobytes() + self.index.lengths.tobytes())
    return {"data.text_field": self.field, "data.tokenizer": self.tokenizer.identity,
            "text.files": len(self.readers), "text.documents": int(self.index.lengths.size),
            "text.tokens": int(self.index.lengths.sum()), "text.index_sha1": h.hexdigest(),
            **{f"text.{text_index.HASH}.{r.name}": digest
               for r, digest in zip(self.readers, self.index.hashes)}}


@functools.lru_cache(maxsize=2)  # The trainer asks for train, eval and probe rows: one index.
def _cached_corpus(source, path, field, tokenizer, cache_dir, eval_fraction, verify_hashes,
                   identities):
  del identities  # In the key only: a file changed since builds a new corpus.
  return TextCorpus(source, path, field, tokenizer, cache_dir, eval_fraction, verify_hashes)


def corpus(config) -> TextCorpus:
  """The TextCorpus config.data names (a text source: sources/registry.py dispatches here)."""
  source = config_values.value(config, "data.source")
  path = config_values.string(config, "data.path", "a file, glob or directory of "
                              f"data.source={source} files (local or a URL)", nonempty=True)
  field = config_values.string(config, "data.text_field", "the field holding each document's "
                               "text, e.g. 'text'", nonempty=True)
  tokenizer = config_values.text_tokenizer(config)
  cache_dir = config_values.string(config, "data.cache_dir", "a path or '' (the default cache)")
  identities = tuple((p, fs.ukey(p)) for fs, p in text_files.files(source, path))
  return _cached_corpus(source, path, field, tokenizer, cache_dir or default_cache_dir(),
                        config_values.eval_fraction(config),
                        config_values.verify_hashes(config), identities)


def text_rows(config, split: str, num_rows_key: str | None = None):
  """Train: an infinite grain MapDataset of rows, reshuffled every epoch (data.seed). Eval: the
  first rows of the eval stream in order, in memory: as many as the eval batches need, or the
  int at `num_rows_key` (fewer where the split has fewer; the caller names the key)."""
  rows = corpus(config).rows(split, config_values.positive_int(config, "data.seq_len"),
                             config_values.boolean(config, "data.document_masking"))
  if split == "train":
    if not len(rows):
      raise ConfigError(f"the train split of config.data.path={config.data.path!r} holds "
                        f"{rows.num_tokens} tokens: too few for one row")
    return grain.MapDataset.source(rows).shuffle(seed=config_values.data_seed(config)).repeat()
  if split != "eval":
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if num_rows_key is None:
    wanted = (config_values.positive_int(config, "eval.batch_size")
              * config_values.positive_int(config, "eval.num_batches"))
  else:
    wanted = config_values.positive_int(config, num_rows_key)
  taken = [rows[k] for k in range(min(wanted, len(rows)))]
  return {k: np.stack([r[k] for r in taken]) if taken else
          np.zeros((0, rows.seq_len), packing.ROW_DTYPES[k]) for k in packing.ROW_KEYS}
