"""Writes the committed MDS fixtures with mosaicml-streaming's own MDSWriter.

Run once, in a throwaway venv OUTSIDE the repo (mosaicml-streaming pins numpy<2.2 and pulls in
torch; it is not a dependency of this project):

  python3 -m venv /tmp/mdsvenv
  /tmp/mdsvenv/bin/pip install torch==2.13.0 mosaicml-streaming==0.13.0
  /tmp/mdsvenv/bin/python tests/testdata/make_mds_fixtures.py

Writes tests/testdata/mds/{encodings,encodings_zstd,prolong/<domain>}, what streaming's own
reader decodes from the encodings datasets (mds/*.decoded.jsonl), and
tests/testdata/textbook_chapters/chapters.jsonl. The samples come from fixture_samples.py,
which the tests import too.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fixture_samples  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy  # pylint: disable=g-import-not-at-top,wrong-import-position
import streaming  # pylint: disable=g-import-not-at-top,wrong-import-position
from streaming import MDSWriter  # pylint: disable=g-import-not-at-top,wrong-import-position


def write(out, columns, samples, **kwargs):
  if os.path.exists(out):
    shutil.rmtree(out)
  with MDSWriter(out=out, columns=columns, **kwargs) as writer:
    for sample in samples:
      writer.write(sample)


def main():
  root = os.path.join(HERE, "mds")
  for name, kwargs in fixture_samples.ENCODING_DATASETS.items():
    write(os.path.join(root, name), fixture_samples.ENCODING_COLUMNS,
          fixture_samples.encoding_samples(), **kwargs)
  # What streaming itself decodes from the files it wrote, for the reader tests to match.
  from streaming.base.format import reader_from_json  # pylint: disable=g-import-not-at-top
  for name in fixture_samples.ENCODING_DATASETS:
    dirname = os.path.join(root, name)
    with open(os.path.join(dirname, "index.json")) as f:
      shard_objs = json.load(f)["shards"]
    decoded = []
    for obj in shard_objs:
      reader = reader_from_json(dirname, None, obj)
      if obj["zip_data"]:  # streaming decompresses next to the zip; keep only the zip
        from streaming.base.compression import decompress  # pylint: disable=g-import-not-at-top
        with open(os.path.join(dirname, obj["zip_data"]["basename"]), "rb") as f:
          raw = decompress(obj["compression"], f.read())
        with open(os.path.join(dirname, obj["raw_data"]["basename"]), "wb") as f:
          f.write(raw)
      decoded += [{k: fixture_samples.describe(v) for k, v in reader.get_item(i).items()}
                  for i in range(obj["samples"])]
      if obj["zip_data"]:
        os.remove(os.path.join(dirname, obj["raw_data"]["basename"]))
    with open(os.path.join(root, f"{name}.decoded.jsonl"), "w") as f:
      f.writelines(json.dumps(sample, sort_keys=True) + "\n" for sample in decoded)
  for name, (columns, samples, kwargs) in fixture_samples.PROLONG_DOMAINS.items():
    write(os.path.join(root, "prolong", name), columns, samples(), **kwargs)
  with open(os.path.join(root, "VERSIONS.json"), "w") as f:
    json.dump({"mosaicml-streaming": streaming.__version__, "numpy": numpy.__version__,
               "python": sys.version.split()[0]}, f, indent=1, sort_keys=True)
    f.write("\n")
  chapters_dir = os.path.join(HERE, "textbook_chapters")
  os.makedirs(chapters_dir, exist_ok=True)
  with open(os.path.join(chapters_dir, "chapters.jsonl"), "w") as f:
    for record in fixture_samples.chapters():
      f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  main()
