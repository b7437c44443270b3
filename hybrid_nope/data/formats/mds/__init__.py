"""mosaicml-streaming's MDS format, read (and written) without mosaicml-streaming.

A dataset is a directory with `index.json` and shard files. This module follows
streaming 0.13's `streaming/base/format/{index,base,mds}` byte for byte:

  index.json   {"version": 2, "shards": [shard, ...]}, written with sort_keys=True; each shard
               {"format": "mds", "version": 2, "column_names", "column_encodings",
               "column_sizes", "compression", "hashes", "size_limit", "samples",
               "raw_data": {"basename", "bytes", "hashes"}, "zip_data": same or null}.
               Columns are sorted by name; column_sizes[c] is the fixed encoded size or null.
  shard file   uint32 num_samples | uint32 offsets[num_samples + 1] (absolute byte offsets of
               each sample's start, and of the end) | the shard config as sort_keys JSON |
               samples. Compressed shards (`zip_data`, e.g. shard.00000.mds.zstd) hold the
               whole file compressed.
  sample       uint32 size of each variable-size column, in column order | column bytes,
               in column order.
  encodings    ndarray[:dtype[:shape]]: [dtype code: 1 byte, if not static]
               [ndim << 2 | shape dtype code: 1 byte, shape: ndim uints, if not static] values;
               scalars (u)int8..64, float16..64: the raw value; int: int64; str: UTF-8;
               bytes: as is; json: UTF-8 JSON; str_int / str_float / str_decimal: digits.

`MDSDataset` memory-maps uncompressed shards (ndarray columns come back as read-only views of
the map: no copy) and decompresses each compressed shard once into a local cache directory
(write to a temporary name, then an atomic rename, so processes racing on one shard are safe).
Every structural check fails with an `MDSFormatError` naming the file, and the sample where
there is one. `pkl` (arbitrary code on load) and the image encodings are refused.

What is verified, and when (each failure one line naming the file):
  at open         index.json field by field; every shard file's size against it. An index
                  that lists no hashes logs one warning per dataset per process: nothing but
                  sizes and structure can be checked then.
  first open of   an uncompressed shard: its bytes against index.json's hashes (with
  a shard         data.verify_hashes; a stamp in the cache skips it until the file changes,
                  but with data.verify_hashes="always");
                  a compressed one, as it is decompressed: size and hashes, and the sha1
                  of the bytes is written beside the cached copy (cache.py); then the
                  sample offsets in the shard's header.
  first use of a  its sha1 against that sidecar, once per process: a cached copy changed since
  cached copy     it was written is refused (delete it to decompress it again).
  each read       the sample's column sizes and ndarray header against its byte span.
ProLong rows (hybrid_nope.data.sources.prolong) add: token columns must be integer ndarrays (at open),
each shard's token ids within [0, model.vocab_size) (at its first read; the trainer reads
the first batch before it writes a record, data/pipeline/loader.py's train_iterator).

`write_mds` writes exactly what streaming's `MDSWriter` writes (tests compare the bytes with
files that MDSWriter made); the tests and the benchmark build datasets with it. It writes sha1
hashes unless told otherwise (MDSWriter's default is none).
"""

from hybrid_nope.data.formats.mds.dataset import MDSDataset
from hybrid_nope.data.formats.mds.encoding import (COMPRESSIONS, INDEX_BASENAME, Column, MDSFormatError,
                                           parse_encoding)
from hybrid_nope.data.formats.mds.index import default_cache_dir
from hybrid_nope.data.formats.mds.writer import write_mds

__all__ = ["COMPRESSIONS", "INDEX_BASENAME", "Column", "MDSDataset", "MDSFormatError",
           "default_cache_dir", "parse_encoding", "write_mds"]
