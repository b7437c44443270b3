"""Small text corpora written the ways users keep them, for the text-source tests: JSON Lines,
parquet (pyarrow), and a `datasets` save_to_disk directory written with pyarrow alone, as
datasets 5.2 writes it (state.json listing the arrow files, each an Arrow IPC stream whose
schema carries the features under "huggingface"; dataset_info.json; a DatasetDict's
dataset_dict.json and one directory per split). test_data_text.py compares this layout with
what `datasets` itself writes where it is installed."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

SOURCES = ("jsonl", "parquet", "hf")


def write_jsonl(path, records):
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def write_parquet(path, records, row_group_size=7):
  pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)


def _features(schema: pa.Schema) -> dict:
  kinds = {pa.string(): "string", pa.int64(): "int64", pa.large_string(): "large_string"}
  return {f.name: {"dtype": kinds.get(f.type, str(f.type)), "_type": "Value"} for f in schema}


def write_saved_dataset(directory, records, shards=2):
  """A Dataset as save_to_disk writes it: data-0000k-of-0000n.arrow, state.json,
  dataset_info.json."""
  os.makedirs(directory, exist_ok=True)
  table = pa.Table.from_pylist(records)
  info = {"citation": "", "description": "", "features": _features(table.schema),
          "homepage": "", "license": ""}
  schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {
      "features": info["features"]}})})
  names, per = [], -(-len(records) // shards)
  for k in range(shards):
    names.append(f"data-{k:05d}-of-{shards:05d}.arrow")
    with pa.OSFile(os.path.join(directory, names[-1]), "wb") as sink:
      with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table.slice(k * per, per).cast(schema), max_chunksize=3)
  state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "tests",
           "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
           "_output_all_columns": False, "_split": None}
  for name, value in (("state.json", state), ("dataset_info.json", info)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(value, f, indent=2, sort_keys=True)


def write_saved_dataset_dict(directory, splits: dict):
  """A DatasetDict as save_to_disk writes it: dataset_dict.json and a directory per split."""
  os.makedirs(directory, exist_ok=True)
  for split, records in splits.items():
    write_saved_dataset(os.path.join(directory, split), records, shards=1)
  with open(os.path.join(directory, "dataset_dict.json"), "w", encoding="utf-8") as f:
    json.dump({"splits": list(splits)}, f)


def write(source: str, directory, records, files=2) -> str:
  """`records` written as `source` into `directory` (made), split over `files` files (the hf
  dataset over as many arrow shards); returns data.path."""
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  if source == "hf":
    write_saved_dataset(directory, records, shards=files)
    return directory
  per = -(-len(records) // files)
  for k in range(files):
    chunk = records[k * per:(k + 1) * per]
    if source == "jsonl":
      write_jsonl(os.path.join(directory, f"part-{k}.jsonl"), chunk)
    else:
      write_parquet(os.path.join(directory, f"part-{k}.parquet"), chunk)
  return directory


def documents(n=60, seed=0):
  """n records {"text": ..., "id": k}: short and long documents (a few spanning several rows
  of 64), ASCII and multi-byte UTF-8."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  words = ["alpha", "beta", "gamma", "délta", "εψιλον", "zeta", "eta", "theta", "ιώτα", "kappa"]
  return [{"text": " ".join(rng.choice(words, size=int(rng.integers(1, 60)))), "id": k}
          for k in range(n)]
