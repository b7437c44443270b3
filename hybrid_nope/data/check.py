"""Is the config's data in place? `python launch/check_data.py --config=... [--config.*=...]`.

Reads what the trainer reads at its start, through the same code (the launch script runs
`validate.validate` first; then `registry.train_mixture`, `loader.eval_batches`,
`loader.probe_pool`, `loader.check_vocabulary`), so each rule has one home and a config
that passes here starts:

  train data   each domain of data.domains under data.path: its MDS directory (index.json, every
               shard file at its listed size), samples, shards, tokens and training rows;
  documents    (data.source=documents) the prepared directory at data.path: its corpus.json
               (the corpus's name, source and licence), both splits' shards, documents, bytes,
               tokens and rows (token ids checked against the byte vocabulary);
  eval data    the prepared TextbookChapters directory at eval.path: its chapters, the eval rows
               the config reads (token ids checked against model.vocab_size) and the probe pool;
  tokenizer    the tokenizer.json files the data carries (data.path, the eval directory): their
               vocabulary against model.vocab_size. For mds data one is required here, so that
               the trainer can check the vocabulary before it builds anything.

Every problem is listed, a line each naming the file or key, in one `DataCheckError` (exit code
2 on the command line) that ends with where the data comes from: docs/reproduce.md and the
dataset ids. The parts are checked apart (training data, each domain of a failing mixture, the
eval set, the tokenizer), so one missing directory does not hide the others. Training shards'
token ids and hashes are checked as the trainer reads them (the first batch's before its first
record), not here: that would read the whole corpus.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import registry
from hybrid_nope.errors import UserError


class DataCheckError(UserError):
  """Data the config names that is missing or does not fit the config."""

  def __init__(self, message: str, problems: tuple[str, ...] = (), source: str = ""):
    super().__init__(message)
    self.problems, self.source = tuple(problems), source

  def one_line(self) -> str:
    """The problems on one line, for a command that is not check_data (launch/train.py
    --dry_run): check_data lists them with where the data comes from."""
    if not self.problems:
      return _one_line(self)
    return (f"{_counted(self.problems)} with the data of this config (data.source="
            f"{self.source}): {'; '.join(self.problems)} (python launch/check_data.py lists them "
            f"with where the data comes from)")


def _counted(problems) -> str:
  return f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")


def problems_error(problems: list[str], source: str) -> DataCheckError:
  """Every problem on a line of its own, then where the data comes from (`Source.origin`)."""
  known = registry.lookup(source)
  section, origin = known.origin if known else ("Data", "")
  problems = list(dict.fromkeys(problems))  # Once each, in order.
  listed = "\n".join(f"  {p}" for p in problems)
  return DataCheckError(
      f"{_counted(problems)} with the data of this config (data.source={source}):\n{listed}\n"
      f"The data and how to fetch and prepare it: docs/reproduce.md, \"{section}\""
      + (f" ({origin})" if origin else ""), problems, source)


@dataclasses.dataclass
class Domain:
  name: str
  share: float
  kind: str  # "packed" (input_ids + indices) or "raw" (one document per sample)
  shards: int
  samples: int
  tokens: int
  rows: int


@dataclasses.dataclass
class DataReport:
  source: str
  seq_len: int
  vocab_size: int
  train_path: str = ""
  domains: list[Domain] = dataclasses.field(default_factory=list)
  eval_path: str = ""
  chapters: int = 0
  eval_rows: int = 0
  eval_tokens: int = 0
  probe_rows: int = 0
  tokenizers: list[str] = dataclasses.field(default_factory=list)
  tokenizer_size: int | None = None
  corpus: dict = dataclasses.field(default_factory=dict)  # documents: its corpus.json
  split_rows: dict = dataclasses.field(default_factory=dict)  # documents: rows per split

  def _documents_lines(self) -> list[str]:
    c = self.corpus
    header = ("split", "documents", "bytes", "tokens", f"rows of {self.seq_len}")
    cells = [header] + [(s, *(f"{c['splits'][s][k]:,}" for k in ("documents", "bytes", "tokens")),
                         f"{self.split_rows[s]:,}") for s in self.split_rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [f"data.source=documents: {self.train_path} (data.path): {c['title']} ({c['name']})",
            f"  source: {c['source']}", f"  licence: {c['licence']}",
            f"  split: {c['split_rule']}, eval_fraction {c['eval_fraction']}; train rows "
            f"packed, eval one document per row"] + [
                "  " + "  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                                 for i, (x, w) in enumerate(zip(row, widths))) for row in cells]

  def text(self) -> str:
    source = registry.SOURCES[self.source]
    if not source.path_keys:
      lines = [f"data.source={self.source}: the embedded corpus (nothing to fetch); seq_len "
               f"{self.seq_len}"]
    elif source.prepared:
      lines = self._documents_lines()
    else:
      header = ("domain", "share", "kind", "shards", "samples", "tokens", f"rows of {self.seq_len}")
      cells = [header] + [(d.name, f"{d.share:.3f}", d.kind, f"{d.shards:,}", f"{d.samples:,}",
                           f"{d.tokens:,}", f"{d.rows:,}") for d in self.domains]
      cells.append(("total", "1.000", "", *(f"{sum(getattr(d, k) for d in self.domains):,}"
                                            for k in ("shards", "samples", "tokens", "rows"))))
      widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
      lines = [f"train data: {self.train_path} (data.path), {len(self.domains)} domains"]
      lines += ["  " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(row, widths))).rstrip()
                for row in cells]
      lines.append(f"eval data: {self.eval_path} (eval.path): {self.chapters:,} chapters")
    lines.append(f"  eval reads {self.eval_rows} rows (eval.batch_size × eval.num_batches) "
                 f"holding {self.eval_tokens:,} tokens; the recency probe is chosen from "
                 f"{self.probe_rows} rows (metrics.probe_pool_rows)")
    where = ", ".join(self.tokenizers) or f"the byte tokenizer (data.source={self.source})"
    lines.append(f"tokenizer: {where}: {self.tokenizer_size:,} token ids <= model.vocab_size "
                 f"{self.vocab_size:,}")
    return "\n".join(lines + ["OK: the data is in place for this config"])


def _chapters(config) -> tuple[str, int]:
  """(the prepared eval directory, its number of chapters)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.sources import textbook_chapters  # pylint: disable=g-import-not-at-top
  directory = textbook_chapters.dataset_dir(config_values.value(config, "eval.path"))
  info = tfds.builder_from_directory(directory).info
  return directory, int(info.splits[textbook_chapters.SPLIT].num_examples)


def _one_line(error: Exception) -> str:
  return " ".join(str(error).split())


def _mixture_problems(config) -> list[str]:
  """Each domain of a mixture that failed to open, checked alone (the whole mixture stops at
  the first one)."""
  problems = []
  for entry in config_values.value(config, "data.domains"):
    alone = config.copy_and_resolve_references()
    name = entry.split("@")[0]
    alone.data.domains = (entry,)
    alone.data.exclude_samples = tuple(e for e in config.data.exclude_samples
                                       if e.startswith(name + "/"))
    try:
      registry.train_mixture(alone)
    except (UserError, FileNotFoundError) as e:
      problems.append(_one_line(e))
  return problems


def _train(config, report: DataReport) -> None:
  report.train_path = config_values.value(config, "data.path")
  try:
    mixture = registry.train_mixture(config)
  except (UserError, FileNotFoundError) as e:
    each = _mixture_problems(config) if storage.isdir(report.train_path or ".") else []
    raise DataCheckError("\n".join(each or [_one_line(e)])) from None
  total = sum(s.weight for s in mixture.specs)
  report.domains = [Domain(name=s.name, share=s.weight / total,
                           kind="packed" if d.packed else "raw", shards=d.ds.num_shards,
                           samples=len(d.ds), tokens=d.num_tokens, rows=len(d))
                    for s, d in zip(mixture.specs, mixture.domains)]


def _documents(config, report: DataReport) -> None:
  from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
  report.train_path = config_values.value(config, "data.path")
  report.corpus = documents.read_manifest(report.train_path)
  report.split_rows = {s: len(registry.packed_rows(config, s)["inputs"])
                       for s in documents.SPLITS}


def _eval(config, report: DataReport) -> None:
  batches = loader.eval_batches(config)
  report.eval_rows = sum(len(b["inputs"]) for b in batches)
  report.eval_tokens = int(sum(np.count_nonzero(b["segment_ids"]) for b in batches))
  report.probe_rows = len(loader.probe_pool(config)["inputs"])
  if registry.named(config).mds_mixture:  # TextbookChapters at eval.path.
    report.eval_path, report.chapters = _chapters(config)


def _tokenizer(config, report: DataReport) -> None:
  source = registry.named(config)
  if source.prepared:  # The directory's tokenizer.json (_documents checks it).
    report.tokenizers = source.tokenizer_files(config)
  if source.mds_mixture:
    try:
      report.tokenizers = source.tokenizer_files(config)
    except UserError:
      return  # An empty data.path or eval.path: their own checks say so.
    data_path = config_values.value(config, "data.path")
    if not report.tokenizers and storage.isdir(data_path):
      raise DataCheckError(
          f"no tokenizer.json in config.data.path={data_path} or in the eval "
          f"directory under config.eval.path={config.eval.path}: put the tokenizer the data "
          f"was made with there (the Llama-3 one for ProLong), so that "
          f"the trainer checks model.vocab_size against it")
  report.tokenizer_size = loader.check_vocabulary(config)


def check(config) -> DataReport:
  """The report of the config's data, or a DataCheckError (a UserError) listing every problem."""
  source = registry.named(config)
  report = DataReport(source=source.name, seq_len=int(config.data.seq_len),
                      vocab_size=int(config.model.vocab_size))
  parts = (([_train] if source.mds_mixture else []) + ([_documents] if source.prepared else [])
           + [_eval, _tokenizer])
  problems = []
  for part in parts:
    try:
      part(config, report)
    except DataCheckError as e:
      problems += str(e).splitlines()
    except (UserError, FileNotFoundError) as e:  # MDS, config and eval-set errors name the file.
      problems.append(_one_line(e))
  if problems:
    raise problems_error(problems, source.name)
  return report
