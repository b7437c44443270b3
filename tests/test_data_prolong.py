"""Tests for hybrid_nope.data.sources.prolong and the "mds" train pipeline, on the committed
MDSWriter fixtures (tests/testdata/mds/prolong: two packed domains, one zstd-compressed, and a
raw domain) and on small datasets written with mds.write_mds."""

import collections
import os
import re
import sys

import grain
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hybrid_nope import config_values, errors, validate
from hybrid_nope.data.sources import registry
from hybrid_nope.data.formats import mds
from hybrid_nope.data.pipeline import mixture
from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.sources import prolong
from hybrid_nope.errors import UserError

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
sys.path.insert(0, TESTDATA)
import fixture_samples  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.helpers import assert_process_shards_interleave, assert_same_batches, take

PROLONG = os.path.join(TESTDATA, "mds", "prolong")
DOMAINS = ("book-65536@0.5", "thestackv1_concat_by_repo-65536@0.3", "fineweb-edu@0.2")
T = 128


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("mds_cache"))


def make_config(cache_dir, **overrides):
  config = ml_collections.ConfigDict({
      "data": {"source": "mds", "path": PROLONG, "domains": DOMAINS, "seq_len": T,
               "batch_size": 8, "seed": 0, "document_masking": True, "cache_dir": cache_dir,
               "verify_hashes": True, "exclude_samples": ()},
      "model": {"vocab_size": 258},
  })
  for key, value in overrides.items():
    group, name = key.split(".")
    del config[group][name]
    if value is not None:
      config[group][name] = value
  return config


def domain(name, cache_dir, **kwargs):
  kwargs = {"seq_len": T, "document_masking": True, "vocab_size": 258, **kwargs}
  return prolong.DomainRows(os.path.join(PROLONG, name), cache_dir=cache_dir, **kwargs)


# ---- mixture ----------------------------------------------------------------------------------

def test_prolong_64k_mixture_weights():
  specs = mixture.parse_domains((
      "thestackv1_concat_by_repo-65536@0.3", "book-65536@0.3", "fineweb-edu@0.1",
      "fineweb-2023-50@0.1", "stackexchange@0.04", "dolmawiki@0.04", "tuluv2@0.03",
      "arxiv@0.03", "openwebmath@0.03", "textbooks@0.03"))
  assert [s.weight for s in specs] == [30, 30, 10, 10, 4, 4, 3, 3, 3, 3]
  assert [s.weight for s in mixture.parse_domains(["a@2", "b@1", "c@0"])] == [2, 1, 0]


@pytest.mark.parametrize("domains, match", [
    (("a@-0.1", "b@1"), "finite number >= 0"),
    (("a@0", "b@0.0"), "sum to zero"),
    (("a@nan", "b@1"), "finite"),
    (("a", "b@1"), "'name@proportion'"),
    (("a@1@2",), "'name@proportion'"),
    (("@1",), "name must be non-empty"),
    (("@0.5",), "name must be non-empty.*'name@proportion'"),
    (("a@x",), "finite"),
    (("book@x",), "'book@x' is invalid.*'name@proportion'"),
    (("book@",), "'book@' is invalid.*'name@proportion'"),
    (("a@1", "a@2"), "more than once"),
    ((), "non-empty tuple"),
    ("a@1", "non-empty tuple of 'name@proportion'"),
    (5, "non-empty tuple of 'name@proportion'"),
    ((5,), "entry 5 is invalid"),
    (("a@1", "b@1e-9"), "resolution"),
])
def test_bad_domains_are_one_line_config_errors_naming_the_key(domains, match):
  with pytest.raises(errors.ConfigError, match=match) as e:
    mixture.parse_domains(domains)
  assert str(e.value).startswith("config.data.domains") and "\n" not in str(e.value)


@pytest.mark.parametrize("weights", [
    (3, 1, 2), (30, 30, 10, 10, 4, 4, 3, 3, 3, 3), (1,), (7, 1), (1,) * 9 + (97,),
    (5, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1)])
def test_mixture_schedule_is_exact_and_consecutive(weights):
  schedule = mixture.MixtureSchedule(weights)
  total = sum(weights)
  counts = np.zeros(len(weights), np.int64)
  for k in range(3 * total + 5):
    d, j = schedule(k)
    assert j == counts[d]  # each domain's elements are taken in order, none skipped
    counts[d] += 1
    # every prefix of n elements holds n * w / W of each domain within one element
    assert np.all(np.abs(counts - (k + 1) * np.array(weights) / total) < 1)
    if (k + 1) % total == 0:
      np.testing.assert_array_equal(counts, (k + 1) // total * np.array(weights))
  d, j = schedule(10**15 * total)  # the first element of cycle 10**15
  assert j == 10**15 * weights[d]


def test_mixture_schedule_rejects_huge_cycles():
  with pytest.raises(errors.ConfigError, match="fewer digits"):
    mixture.MixtureSchedule((999983, 999979))


def test_mixture_rows_follow_the_proportions(cache_dir):
  mixture = prolong.build_mixture(PROLONG, DOMAINS, seq_len=T, document_masking=True,
                                  vocab_size=258, seed=0, cache_dir=cache_dir)
  counts = collections.Counter(mixture.locate(k)[0] for k in range(1000))
  assert counts == {0: 500, 1: 300, 2: 200}
  # each domain: a full permutation of its rows per epoch, a new one the next epoch
  book = [mixture.locate(k)[1] for k in range(1000) if mixture.locate(k)[0] == 0]
  n = len(mixture.domains[0])
  assert sorted(book[:n]) == list(range(n)) and book[:n] != book[n:2 * n]


def test_zero_proportion_domain_is_not_read(cache_dir):
  mixture = prolong.build_mixture(PROLONG, ("book-65536@1", "missing@0"), seq_len=T,
                                  document_masking=True, vocab_size=258, seed=0,
                                  cache_dir=cache_dir)
  assert len(mixture.domains) == 1


# ---- rows -------------------------------------------------------------------------------------

def test_cut_row_segments_positions_weights():
  # stream: doc A = [0, 3), gap [3, 4), doc B = [4, 9); row = stream[1 : 1 + 7], seq_len 8
  tokens = np.array([11, 12, 99, 20, 21, 22, 23], np.int32)
  row = prolong.cut_row(tokens, np.array([0, 4]), np.array([3, 9]), first=1, seq_len=8)
  np.testing.assert_array_equal(row["inputs"], [11, 12, 99, 20, 21, 22, 23, 0])
  np.testing.assert_array_equal(row["targets"], [12, 99, 20, 21, 22, 23, 0, 0])
  np.testing.assert_array_equal(row["segment_ids"], [1, 1, 0, 2, 2, 2, 2, 0])
  np.testing.assert_array_equal(row["positions"], [1, 2, 0, 0, 1, 2, 3, 0])
  np.testing.assert_array_equal(row["weights"], [1, 0, 0, 1, 1, 1, 0, 0])


def check_rows_against_streams(rows, streams, masking=True):
  """Concatenating a stream's rows gives back the stream; weights are 0 exactly at document
  starts, gaps and padding; positions count within documents."""
  r = 0
  for tokens, starts, ends in streams:
    n_rows = -(-(tokens.size - 1) // T)
    got = [rows[r + k] for k in range(n_rows)]
    r += n_rows
    inputs = np.concatenate([g["inputs"] for g in got])
    targets = np.concatenate([g["targets"] for g in got])
    weights = np.concatenate([g["weights"] for g in got])
    positions = np.concatenate([g["positions"] for g in got])
    segments = np.concatenate([g["segment_ids"] for g in got])
    L = tokens.size
    np.testing.assert_array_equal(inputs[:L], tokens)
    np.testing.assert_array_equal(targets[:L - 1], tokens[1:])
    assert not inputs[L:].any() and not weights[L - 1:].any() and not segments[L:].any()
    doc = np.full(L, -1)
    for i, (a, b) in enumerate(zip(starts, ends)):
      doc[a:b] = i
    if not masking:
      doc[:] = 0
      starts = [0]
    expected_w = (doc[:-1] >= 0) & (doc[:-1] == doc[1:])
    np.testing.assert_array_equal(weights[:L - 1], expected_w)
    expected_pos = np.where(doc >= 0, np.arange(L) - np.asarray(starts)[np.maximum(doc, 0)], 0)
    np.testing.assert_array_equal(positions[:L], expected_pos)
    assert np.all((segments[:L] > 0) == (doc >= 0))
    if masking:
      for k in range(n_rows):  # documents numbered 1, 2, ... within each row
        row_docs = doc[k * T:(k + 1) * T]
        seg = segments[k * T:(k + 1) * T][:row_docs.size]
        inside = row_docs >= 0
        np.testing.assert_array_equal(seg[inside], row_docs[inside] - row_docs[inside].min() + 1)
  assert r == len(rows)


@pytest.mark.parametrize("name", ["book-65536", "thestackv1_concat_by_repo-65536"])
def test_packed_domain_rows(name, cache_dir):
  rows = domain(name, cache_dir)
  assert rows.packed and len(rows) == len(rows.ds) * -(-(fixture_samples.SAMPLE_LEN - 1) // T)
  streams = [(s["input_ids"].astype(np.int64), s["indices"][:, 0], s["indices"][:, 1])
             for s in (rows.ds[i] for i in range(len(rows.ds)))]
  check_rows_against_streams(rows, streams)


def test_packed_domain_without_document_masking(cache_dir):
  rows = domain("book-65536", cache_dir, document_masking=False)
  streams = [(s["input_ids"].astype(np.int64), [0], [s["input_ids"].size])
             for s in (rows.ds[i] for i in range(len(rows.ds)))]
  check_rows_against_streams(rows, streams, masking=False)
  assert set(np.unique(np.concatenate([rows[i]["segment_ids"] for i in range(len(rows))]))) <= {0, 1}


def test_raw_domain_is_packed_on_the_fly(cache_dir):
  rows = domain("fineweb-edu", cache_dir)
  assert not rows.packed
  docs = [s["input_ids"].astype(np.int64) for s in fixture_samples.raw_samples("fineweb-edu", 2000, 40)]
  stream = np.concatenate(docs)
  ends = np.cumsum([d.size for d in docs])
  check_rows_against_streams(rows, [(stream, ends - [d.size for d in docs], ends)])


def test_raw_domain_without_document_masking_is_one_sequence_per_row(cache_dir):
  rows = domain("fineweb-edu", cache_dir, document_masking=False)
  for i in range(len(rows) - 1):
    row = rows[i]
    np.testing.assert_array_equal(row["segment_ids"], 1)
    np.testing.assert_array_equal(row["positions"], np.arange(T))
    np.testing.assert_array_equal(row["weights"], 1)


def write(tmp_path, samples, columns=fixture_samples.PACKED_COLUMNS):
  out = tmp_path / "domain"
  mds.write_mds(str(out), columns, samples)
  return out


def packed(ids, indices):
  return {"input_ids": np.asarray(ids, np.uint32), "indices": np.asarray(indices, np.uint32),
          "domain": "x"}


def rows_of(path, **kwargs):
  kwargs = {"seq_len": 4, "document_masking": True, "vocab_size": 258, **kwargs}
  return prolong.DomainRows(str(path), **kwargs)


def test_token_id_at_or_above_vocab_size_names_the_sample(tmp_path):
  path = write(tmp_path, [packed(range(10), [[0, 10]]), packed([1, 2, 258, 3], [[0, 4]])])
  rows = rows_of(path)
  # The whole shard is checked when its first row is read: sample 0's row fails too.
  with pytest.raises(prolong.TokenRangeError,
                     match=r"token id 258 at position 2 of input_ids in sample 1 of "
                           r".*shard\.00000\.mds .* outside \[0, model\.vocab_size=258\)"):
    rows[0]


@pytest.mark.parametrize("indices, match", [
    ([[0, 11]], r"indices row 0 \[0, 11\) .* out of range"),
    ([[0, 6], [5, 10]], r"indices rows 0 \[0, 6\) and 1 \[5, 10\) .* overlap"),
    ([[5, 10], [0, 5]], "overlap or are out of order"),
    ([[4, 2]], "out of range"),
    ([0, 10], r"shape \[n_docs >= 1, 2\]"),
])
def test_bad_indices_name_the_sample(tmp_path, indices, match):
  path = write(tmp_path, [packed(range(10), [[0, 10]]), packed(range(10), indices)])
  rows = rows_of(path)
  rows[0]
  with pytest.raises(ValueError, match=match) as e:
    rows[3]
  assert "sample 1 of" in str(e.value) and "shard.00000.mds" in str(e.value)


def test_bad_indices_do_not_matter_without_document_masking(tmp_path):
  path = write(tmp_path, [packed(range(10), [[0, 11]])])
  assert rows_of(path, document_masking=False)[0]["weights"].sum() == 4


def test_raw_length_column_must_match(tmp_path):
  path = write(tmp_path, [{"input_ids": np.arange(5, dtype=np.uint32), "length": 6,
                           "domain": "x"}], fixture_samples.RAW_COLUMNS)
  with pytest.raises(ValueError, match=r"sample 0 of .*disagrees with its length column 6"):
    rows_of(path)[0]


def test_domain_without_input_ids(tmp_path):
  path = write(tmp_path, [{"text": "hi"}], {"text": "str"})
  with pytest.raises(mds.MDSFormatError, match="'input_ids'"):
    rows_of(path)


def test_missing_paths_name_the_key(tmp_path):
  with pytest.raises(errors.ConfigError, match=r"config\.data\.path"):
    prolong.build_mixture(str(tmp_path / "nope"), DOMAINS, seq_len=T, document_masking=True,
                          vocab_size=258, seed=0)
  with pytest.raises(errors.ConfigError, match=r"domain 'missing' of config\.data\.domains"):
    prolong.build_mixture(PROLONG, ("book-65536@1", "missing@1"), seq_len=T,
                          document_masking=True, vocab_size=258, seed=0)


# ---- the train pipeline -----------------------------------------------------------------------

def test_train_batches(cache_dir):
  batch = next(loader.train_iterator(make_config(cache_dir)))
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
      k: ((8, T), np.float32 if k == "weights" else np.int32) for k in loader.BATCH_KEYS}


def test_same_seed_same_batches_other_seed_different(cache_dir):
  first = take(loader.train_iterator(make_config(cache_dir)), 4)
  assert_same_batches(first, take(loader.train_iterator(make_config(cache_dir)), 4))
  other = take(loader.train_iterator(make_config(cache_dir, **{"data.seed": 1})), 4)
  assert not np.array_equal(first[0]["inputs"], other[0]["inputs"])


def test_process_batches_interleave_to_the_global_batch(cache_dir):
  config = make_config(cache_dir)
  global_batches = take(loader.train_iterator(config), 3)
  shards = [take(loader.train_iterator(config, process_index=p, process_count=4), 3)
            for p in range(4)]
  for k, global_batch in enumerate(global_batches):
    for p in range(4):
      for key in loader.BATCH_KEYS:
        np.testing.assert_array_equal(shards[p][k][key], global_batch[key][p::4], key)


def test_a_gs_style_url_trains_as_the_local_directory_each_process_its_rows(tmp_path):
  """data.path as a URL (memory:// here, gs:// on a pod): the same global stream, process p
  of 2 reading rows p, p + 2, ...; shards are fetched once into the process's cache."""
  import fsspec  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data import fingerprint  # pylint: disable=g-import-not-at-top
  fs = fsspec.filesystem("memory")
  for root, _, files in os.walk(PROLONG):
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        fs.pipe_file(f"/prolong/{os.path.relpath(os.path.join(root, name), PROLONG)}", f.read())
  local = make_config(str(tmp_path / "local"))
  remote = make_config(str(tmp_path / "remote"), **{"data.path": "memory://prolong"})
  from tests.helpers import tiny_config  # pylint: disable=g-import-not-at-top
  validate.validate(tiny_config(data__source="mds", data__path="memory://prolong",
                                eval__path=str(tmp_path)))  # The URL is a directory.
  whole = take(loader.train_iterator(local), 3)
  shards = [take(loader.train_iterator(remote, process_index=p, process_count=2), 3)
            for p in range(2)]
  assert_process_shards_interleave(shards, whole)
  for name in ("book-65536", "fineweb-edu"):
    entry = f"domain.{name}.index_sha1"
    assert registry.mds_domains(remote)[entry] == registry.mds_domains(local)[entry]


def test_orbax_checkpoint_resumes_exactly(cache_dir, tmp_path):
  iterator = loader.train_iterator(make_config(cache_dir))
  take(iterator, 5)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
  expected = take(iterator, 4)
  fresh = loader.train_iterator(make_config(cache_dir))
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  assert fresh.get_state() == {"next_index": 5}
  assert_same_batches(take(fresh, 4), expected)


def test_document_masking_switch(cache_dir):
  off = next(loader.train_iterator(make_config(cache_dir, **{"data.document_masking": False})))
  assert set(np.unique(off["segment_ids"])) <= {0, 1}
  with pytest.raises(ValueError, match=r"data\.document_masking"):
    loader.train_iterator(make_config(cache_dir, **{"data.document_masking": 1}))


@pytest.mark.parametrize("key, value", [
    ("data.path", None), ("data.domains", None), ("data.domains", ("book-65536@-1",)),
    ("data.document_masking", None), ("model.vocab_size", None), ("model.vocab_size", 0),
    ("data.cache_dir", 3), ("data.seed", -1),
])
def test_bad_mds_config_names_the_key(cache_dir, key, value):
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    loader.train_iterator(make_config(cache_dir, **{key: value}))


def test_vocab_size_too_small_for_the_data(cache_dir):
  with pytest.raises(prolong.TokenRangeError,
                     match=r"of .*shard\.\d{5}\.mds.* outside \[0, model\.vocab_size=200\)"):
    loader.train_iterator(make_config(cache_dir, **{"model.vocab_size": 200}))  # 1st batch


# ---- token columns, token ranges, excluded samples --------------------------------------------

@pytest.mark.parametrize("column, encoding", [
    ("input_ids", "ndarray:float32"), ("input_ids", "ndarray:float16"), ("input_ids", "ndarray"),
    ("input_ids", "str"), ("indices", "ndarray:float64")])
def test_token_columns_must_be_integer_ndarrays(tmp_path, column, encoding):
  columns = {**fixture_samples.PACKED_COLUMNS, column: encoding}
  value = {"ndarray": np.arange(10, dtype=np.float32), "str": "0 1 2"}.get(
      encoding, np.arange(10).astype(encoding.partition(":")[2] or "float32"))
  sample = {**packed(range(10), [[0, 10]]), column: value}
  if column == "indices":
    sample[column] = np.array([[0, 10]], encoding.partition(":")[2])
  path = write(tmp_path, [sample], columns)
  with pytest.raises(mds.MDSFormatError) as e:
    rows_of(path)
  message = str(e.value)
  assert message == (f"{path / 'index.json'}: column {column!r} is declared {encoding!r}; token "
                     "columns must be integer ndarrays with a declared dtype, e.g. "
                     "'ndarray:uint32' (ProLong's)")


def bad_token_domain(tmp_path, name="dom", bad=((2, 5, 7),)):
  """A packed domain of 40 samples (4 per shard) of 12 tokens; `bad`: (shard, sample, id)."""
  samples = [packed(np.arange(12) + 10 * i, [[0, 6], [6, 12]]) for i in range(40)]
  for shard, sample, token in bad:
    samples[4 * shard + sample]["input_ids"][5] = token
  out = tmp_path / name
  mds.write_mds(str(out), fixture_samples.PACKED_COLUMNS, samples, size_limit=600)
  assert len(mds.MDSDataset(str(out)).array_lengths("input_ids")) == 40
  return out


def test_a_bad_token_is_refused_at_its_shards_first_read_naming_the_exclusion(tmp_path):
  path = bad_token_domain(tmp_path, bad=((2, 1, 1000), (2, 3, 999)))
  rows = rows_of(path, vocab_size=500)
  assert rows.ds.num_shards == 10
  rows[0]  # Shard 0 is fine; row 8 * 3 + 1 is in shard 2, whose samples 1 and 3 are bad.
  with pytest.raises(prolong.TokenRangeError) as e:
    rows[3 * 8]  # Sample 8's first row (shard 2, sample 0): its shard is checked whole.
  message = str(e.value)
  assert "\n" not in message and isinstance(e.value, UserError)
  assert message.startswith(f"token id 1000 at position 5 of input_ids in sample 1 of "
                            f"{path / 'shard.00002.mds'}")
  assert ("--config.data.exclude_samples='(\"dom/shard.00002.mds:1\", "
          "\"dom/shard.00002.mds:3\",)'") in message
  excluded = ("dom/shard.00002.mds:1", "dom/shard.00002.mds:3")
  assert config_values.exclude_samples(ml_collections.ConfigDict(
      {"data": {"source": "mds", "exclude_samples": excluded}})) == excluded  # It parses.
  skipping = rows_of(path, vocab_size=500, exclude_samples=excluded)
  assert len(skipping) == len(rows) - 2 * 3  # 3 rows of seq_len 4 per 12-token sample
  tokens = np.concatenate([skipping[i]["inputs"] for i in range(len(skipping))])
  assert tokens.max() < 500 and not np.isin([1000, 999], tokens).any()


def test_the_refusal_lists_exclusions_already_made_and_names_other_domains_entries(tmp_path):
  path = bad_token_domain(tmp_path, bad=((2, 1, 1000), (5, 0, 1000)))
  rows = rows_of(path, vocab_size=500,
                 exclude_samples=("other/shard.00000.mds:0", "dom/shard.00002.mds:1"))
  for row in range(3 * 19):  # Samples 0..19 but the excluded one, shard 2's bad sample 1.
    rows[row]
  with pytest.raises(prolong.TokenRangeError) as e:
    rows[3 * 19]  # Sample 20: shard 5's sample 0.
  assert ("'(\"other/shard.00000.mds:0\", \"dom/shard.00002.mds:1\", "
          "\"dom/shard.00005.mds:0\",)'") in str(e.value)


def test_a_shard_full_of_bad_tokens_asks_about_the_vocabulary_not_for_exclusions(tmp_path):
  path = write(tmp_path, [packed(np.arange(10) + 600, [[0, 10]]) for _ in range(20)])
  with pytest.raises(prolong.TokenRangeError) as e:
    rows_of(path, vocab_size=500)[0]
  assert str(e.value).endswith(
      "is outside [0, model.vocab_size=500), as are 19 more of the shard's 20 samples: is "
      "model.vocab_size that of the tokenizer the data was made with?")


def test_a_raw_domain_skips_excluded_documents(tmp_path):
  docs = [np.arange(7, dtype=np.uint32) + 10 * i for i in range(30)]
  docs[17][3] = 4000
  out = tmp_path / "raw"
  mds.write_mds(str(out), fixture_samples.RAW_COLUMNS,
                [{"input_ids": d, "length": d.size, "domain": "raw"} for d in docs],
                size_limit=300)
  ds = mds.MDSDataset(str(out))
  number, local = ds.locate(17)
  entry = f"raw/{ds.shard_basename(number)}:{local}"
  with pytest.raises(prolong.TokenRangeError, match=re.escape(entry)):
    rows = rows_of(out, vocab_size=1000)
    [rows[i] for i in range(len(rows))]
  rows = rows_of(out, vocab_size=1000, exclude_samples=(entry,))
  got = [rows[i] for i in range(len(rows))]
  kept = [d for i, d in enumerate(docs) if i != 17]
  stream = np.concatenate(kept)
  inputs = np.concatenate([r["inputs"] for r in got])
  np.testing.assert_array_equal(inputs[:stream.size], stream)
  segments = np.concatenate([r["segment_ids"] for r in got])[:stream.size]
  positions = np.concatenate([r["positions"] for r in got])[:stream.size]
  np.testing.assert_array_equal(positions, np.concatenate([np.arange(7)] * len(kept)))
  for r in got:  # Documents are numbered 1, 2, ... in each row: no gap where 17 was.
    seg = r["segment_ids"][r["segment_ids"] > 0]
    np.testing.assert_array_equal(np.unique(seg), np.arange(1, seg.max() + 1))
  assert segments.min() > 0


def test_the_train_pipeline_goes_past_excluded_samples(tmp_path, cache_dir):
  bad_token_domain(tmp_path, "a", bad=((0, 2, 900),))
  bad_token_domain(tmp_path, "b")
  config = make_config(cache_dir, **{"data.path": str(tmp_path), "data.domains": ("a@1", "b@1"),
                                     "data.seq_len": 4, "model.vocab_size": 600})
  with pytest.raises(prolong.TokenRangeError, match="a/shard.00000.mds:2"):
    take(loader.train_iterator(config), 40)
  config.data.exclude_samples = ("a/shard.00000.mds:2",)
  batches = take(loader.train_iterator(config), 40)  # Both domains, more than an epoch.
  assert max(b["inputs"].max() for b in batches) < 600


@pytest.mark.parametrize("value, match", [
    ("a/shard.00000.mds:1", "a tuple of distinct"),
    (("a/shard.00000.mds",), "DOMAIN/SHARD:SAMPLE"),
    (("a/shard.00000.mds:x",), "DOMAIN/SHARD:SAMPLE"),
    (("a/shard.00000.mds:-1",), "DOMAIN/SHARD:SAMPLE"),
    (("shard.00000.mds:1",), "DOMAIN/SHARD:SAMPLE"),
    (("/shard.00000.mds:1",), "DOMAIN/SHARD:SAMPLE"),
    ((3,), "DOMAIN/SHARD:SAMPLE"),
    (("a/s.mds:1", "a/s.mds:1"), "distinct"),
])
def test_exclude_samples_format_is_checked_naming_the_key(value, match):
  config = ml_collections.ConfigDict({"data": {"source": "mds", "exclude_samples": value}})
  with pytest.raises(errors.ConfigError, match=match) as e:
    config_values.exclude_samples(config)
  assert str(e.value).startswith("config.data.exclude_samples") and "\n" not in str(e.value)


def test_exclude_samples_must_name_a_sample_of_a_domain_that_is_read(tmp_path, cache_dir):
  bad_token_domain(tmp_path, "a")
  bad_token_domain(tmp_path, "b")
  for entry, match in [("c/shard.00000.mds:0", "names no domain"),
                       ("b/shard.00000.mds:0", "names no domain"),  # b@0 is not read
                       ("a/shard.00077.mds:0", "has no shard 'shard.00077.mds'"),
                       ("a/shard.00001.mds:4", "has 4 samples, so no sample 4")]:
    config = make_config(cache_dir, **{"data.path": str(tmp_path), "data.domains": ("a@1", "b@0"),
                                       "data.seq_len": 4, "model.vocab_size": 600})
    config.data.exclude_samples = (entry,)
    with pytest.raises(errors.ConfigError, match=match) as e:
      loader.train_iterator(config)
    assert "config.data.exclude_samples" in str(e.value)
  stdlib = ml_collections.ConfigDict({"data": {"source": "stdlib",
                                               "exclude_samples": ("a/s.mds:1",)}})
  with pytest.raises(errors.ConfigError, match=r"data\.source='mds'"):
    registry.exclude_samples(stdlib)


@pytest.mark.parametrize("domains", [("book@x",), ("book@",), ("@0.5",), "book@1"])
def test_validate_refuses_malformed_domains_before_anything_is_read(domains):
  from tests.helpers import tiny_config  # pylint: disable=g-import-not-at-top
  config = tiny_config(data__source="mds")
  del config.data["domains"]  # ConfigDict is type-safe on override: a str cannot replace a tuple.
  config.data.domains = domains
  with pytest.raises(errors.ConfigError, match=r"^config\.data\.domains.*'name@proportion'"):
    validate.validate(config, check_paths=False)
