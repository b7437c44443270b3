"""What a text source (data.source jsonl, parquet, hf) costs on one CPU core: the length index's
first build, a start that reads it from the cache, and the train pipeline's tokens/s.

  python benchmarks/text_data.py                   # the stdlib corpus's text, ~--megabytes MB
  python benchmarks/text_data.py --tokenizer=bpe   # a BPE tokenizer.json trained on it first

Writes the stdlib corpus's .py files (UTF-8 ones, repeated to --megabytes) as each format
(tests/text_sources.py's writers), then per format: the index built from nothing (one read of
every file, every document tokenised), the same corpus opened again (index from the cache), and
`loader.train_iterator` batches of --batch_size x --seq_len after a warm-up batch (rows read by
document, tokenised on the fly, packed), pinned to one core. Files in the page cache: a network
disk or gs:// adds its latency per row (a ranged read per jsonl document, a row group per
parquet row, an arrow file per saved-dataset file).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_nope.data.pipeline import loader
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
    tokenizer = "byte" if args.tokenizer == "byte" else bpe_tokenizer(
        records, os.path.join(tmp, "tokenizer.json"))
    print(f"{len(records)} documents, {megabytes:.1f} MB of text; tokenizer {args.tokenizer}; "
          f"1 CPU core (affinity {{{args.core}}})\n")
    print("| source | index built | MB/s | start from cached index | train tokens/s |")
    print("|---|---|---|---|---|")
    for source in text_sources.SOURCES:
      path = text_sources.write(source, os.path.join(tmp, source), records, files=4)
      config = tiny_config(data__source=source, data__path=path, data__tokenizer=tokenizer,
                           data__cache_dir=os.path.join(tmp, f"cache-{source}"),
                           data__seq_len=args.seq_len, data__batch_size=args.batch_size,
                           model__vocab_size=8192 if args.tokenizer == "bpe" else 258)
      t = time.perf_counter()
      text_rows.corpus(config)
      built = time.perf_counter() - t
      text_rows._cached_corpus.cache_clear()  # pylint: disable=protected-access
      t = time.perf_counter()
      text_rows.corpus(config)
      cached = time.perf_counter() - t
      it = loader.train_iterator(config)
      next(it)
      t = time.perf_counter()
      for _ in range(args.batches):
        next(it)
      rate = args.batches * args.batch_size * args.seq_len / (time.perf_counter() - t)
      print(f"| {source} | {built:.2f} s | {megabytes / built:.1f} | {cached * 1e3:.0f} ms | "
            f"{rate / 1e6:.2f}M |")


if __name__ == "__main__":
  main()
