"""What a text source (data.source jsonl, parquet, hf) costs on one CPU core: the one-time
tokenisation (the length index's first build, every document's ids cached beside it), a start
that reads both from the cache, and the train pipeline's tokens/s.

  python benchmarks/text_data.py                   # the byte tokenizer, ~--megabytes MB
  python benchmarks/text_data.py --tokenizer=bpe   # a BPE tokenizer.json trained on the text
                                                   # first, beside the byte tokenizer's figures

Writes the stdlib corpus's .py files (UTF-8 ones, repeated to --megabytes) as each format
(tests/text_sources.py's writers), then per format and tokenizer: the index built from nothing
(one read of every file, every document tokenised once, a BPE's ids written beside the index:
text_ids.py), the same corpus opened again (index and ids from the cache), and
`loader.train_iterator` batches of --batch_size x --seq_len after a warm-up batch (rows packed
from the cached ids, or the byte tokenizer's documents read and encoded), pinned to one core.
Files in the page cache: a network disk or gs:// adds its latency per byte-tokenised row (a
ranged read per jsonl document, a row group per parquet row, an arrow file per saved-dataset
file); a BPE's rows read only the local ids.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_nope.data.pipeline import loader  # noqa: E402
from hybrid_nope.data.sources import stdlib_corpus, text_rows  # noqa: E402
from tests import text_sources  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402


def corpus_records(megabytes: float) -> list[dict]:
  records, size = [], 0
  while size < megabytes * 1e6:
    for name, data in stdlib_corpus.documents("train", 0.05):
      try:
        records.append({"text": data.decode("utf-8"), "path": name})
      except UnicodeDecodeError:
        continue
      size += len(data)
      if size >= megabytes * 1e6:
        break
  return records


def bpe_tokenizer(records, path: str, vocab: int = 8192) -> str:
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel()
  tok.train_from_iterator((r["text"] for r in records[:500]),
                          trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>"]))
  tok.save(path)
  return path


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--megabytes", type=float, default=50)
  parser.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
  parser.add_argument("--seq_len", type=int, default=8192)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--batches", type=int, default=20)
  parser.add_argument("--core", type=int, default=0)
  args = parser.parse_args()
  os.sched_setaffinity(0, {args.core})
  os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' batch encoding: one core too
  records = corpus_records(args.megabytes)
  megabytes = sum(len(r["text"].encode()) for r in records) / 1e6
  with tempfile.TemporaryDirectory() as tmp:
    named = {"byte": "byte"}
    if args.tokenizer == "bpe":
      named["bpe"] = bpe_tokenizer(records, os.path.join(tmp, "tokenizer.json"))
    print(f"{len(records)} documents, {megabytes:.1f} MB of text; tokenizers "
          f"{', '.join(named)}; 1 CPU core (affinity {{{args.core}}})\n")
    print("| source | tokenizer | one-time: index + ids built | MB/s | ids on disk | "
          "start from the cache | train tokens/s |")
    print("|---|---|---|---|---|---|---|")
    rates = {}
    for source in text_sources.SOURCES:
      path = text_sources.write(source, os.path.join(tmp, source), records, files=4)
      for name, tokenizer in named.items():
        rates[source, name] = measure(args, tmp, source, path, name, tokenizer, megabytes)
    if args.tokenizer == "bpe":
      print("\nBPE train tokens/s as a share of the byte tokenizer's: " + ", ".join(
          f"{source} {rates[source, 'bpe'] / rates[source, 'byte']:.2f}"
          for source in text_sources.SOURCES))


def measure(args, tmp, source, path, name, tokenizer, megabytes) -> float:
  """Prints one table row; returns the train tokens/s."""
  cache = os.path.join(tmp, f"cache-{source}-{name}")
  config = tiny_config(data__source=source, data__path=path, data__tokenizer=tokenizer,
                       data__cache_dir=cache, data__seq_len=args.seq_len,
                       data__batch_size=args.batch_size,
                       model__vocab_size=8192 if name == "bpe" else 258)
  text_rows._cached_corpus.cache_clear()  # pylint: disable=protected-access
  t = time.perf_counter()
  text_rows.corpus(config)
  built = time.perf_counter() - t
  text_rows._cached_corpus.cache_clear()  # pylint: disable=protected-access
  t = time.perf_counter()
  corpus = text_rows.corpus(config)
  cached = time.perf_counter() - t
  ids = corpus.index.ids
  on_disk = "-" if ids is None else f"{ids.nbytes / 1e6:.0f} MB ({ids.dtype.name})"
  it = loader.train_iterator(config)
  next(it)
  t = time.perf_counter()
  for _ in range(args.batches):
    next(it)
  rate = args.batches * args.batch_size * args.seq_len / (time.perf_counter() - t)
  print(f"| {source} | {name} | {built:.2f} s | {megabytes / built:.1f} | {on_disk} | "
        f"{cached * 1e3:.0f} ms | {rate / 1e6:.2f}M |", flush=True)
  return rate

if __name__ == "__main__":
  main()
