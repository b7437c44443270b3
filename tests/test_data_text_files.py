"""text_files' readers on files damaged after they were written: a saved `datasets` directory
whose state.json names an arrow file that is gone, an arrow file cut short (mid-batch or at a
batch's end), a parquet file with a corrupt data page (compressed, plain, checksummed). Each
fails as one TextDataError line naming the file and what is wrong, and launch/train.py prints
it as one line with exit code 2 (issue 50, item 8: each was a traceback of 51-69 lines)."""
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid_nope import errors
from hybrid_nope.data.formats import text_files
from hybrid_nope.data.sources import text_rows
from tests import text_sources
from tests.helpers import REPO, tiny_config, tiny_flags

T = 64
FIRST, SECOND = "data-00000-of-00002.arrow", "data-00001-of-00002.arrow"


def settings(source, path, tmp_path) -> dict:
  return dict(data__source=source, data__path=str(path), data__cache_dir=str(tmp_path / "cache"),
              data__eval_fraction=0.2, data__seq_len=T, data__batch_size=4,
              metrics__probe_pool_rows=4)


def one_line_error(source, path, tmp_path) -> str:
  """The message the trainer's corpus gives for `path`, checked to be one line."""
  with pytest.raises(text_files.TextDataError) as e:
    text_rows.corpus(tiny_config(**settings(source, path, tmp_path)))
  assert isinstance(e.value, errors.UserError)
  message = str(e.value)
  assert "\n" not in message and "config.data.path" in message, message
  return message


def saved_dataset(tmp_path) -> str:
  return text_sources.write("hf", tmp_path / "saved", text_sources.documents(), files=2)


def test_a_saved_dataset_missing_an_arrow_file_its_state_lists_names_both(tmp_path):
  path = saved_dataset(tmp_path)
  os.remove(os.path.join(path, SECOND))
  message = one_line_error("hf", path, tmp_path)
  assert os.path.join(path, "state.json") in message and os.path.join(path, SECOND) in message
  assert "do not exist" in message, message


def batch_ends(file: str) -> list[int]:
  """Byte offsets at which each record batch of an Arrow IPC stream ends."""
  source = pa.memory_map(file)
  ends = []
  for _ in pa.ipc.open_stream(source):
    ends.append(source.tell())
  return ends


@pytest.mark.parametrize("cut", ["mid-batch", "at-a-batch-end"])
@pytest.mark.parametrize("name", [FIRST, SECOND])
def test_a_truncated_arrow_file_is_named_as_truncated(name, cut, tmp_path):
  path = saved_dataset(tmp_path)
  file = os.path.join(path, name)
  data = open(file, "rb").read()
  # A cut at a batch's end leaves a stream pyarrow reads without error, a batch short.
  end = batch_ends(file)[1] if cut == "at-a-batch-end" else len(data) // 2
  with open(file, "wb") as f:
    f.write(data[:end])
  message = one_line_error("hf", path, tmp_path)
  assert f"{file} is truncated or corrupt" in message, message


def corrupt_first_page(file: str) -> None:
  """Flips 20 bytes in the middle of the first column chunk's pages."""
  column = pq.ParquetFile(file).metadata.row_group(0).column(0)
  start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
  data = bytearray(open(file, "rb").read())
  middle = start + column.total_compressed_size // 2
  data[middle:middle + 20] = bytes(b ^ 0xFF for b in data[middle:middle + 20])
  with open(file, "wb") as f:
    f.write(bytes(data))


@pytest.mark.parametrize("compression, checksum, what", [
    ("snappy", False, "Corrupt snappy compressed data"),  # pyarrow's default
    ("none", False, "Invalid UTF8"),  # Read whole, the page's bytes are no longer text.
    ("none", True, "CRC checksum verification failed")])
def test_a_parquet_file_with_a_corrupt_data_page_is_named_with_what_failed(
    compression, checksum, what, tmp_path):
  (tmp_path / "data").mkdir()
  file = str(tmp_path / "data" / "a.parquet")
  pq.write_table(pa.Table.from_pylist(text_sources.documents()), file, row_group_size=1000,
                 compression=compression, write_page_checksum=checksum)
  corrupt_first_page(file)
  message = one_line_error("parquet", tmp_path / "data", tmp_path)
  assert f"{file} is truncated or corrupt: reading row group 0 failed" in message, message
  assert what in message, message


@pytest.mark.integration
def test_the_trainer_prints_a_corrupt_file_as_one_line_and_exits_2(tmp_path):
  path = saved_dataset(tmp_path)
  file = os.path.join(path, SECOND)
  data = open(file, "rb").read()
  open(file, "wb").write(data[:len(data) // 2])
  flags = tiny_flags(**settings("hf", path, tmp_path))
  out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/demo.py", *flags,
                        f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.startswith("train.py:")]
  assert out.returncode == errors.USAGE_EXIT_CODE and len(lines) == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr and f"{file} is truncated or corrupt" in lines[0]
