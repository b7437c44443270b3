"""hybrid_nope.kernels.blocking: the key/query block bounds kernels use to skip work must never
exclude a pair the mask allows, and must be tight for packed documents."""
import numpy as np
import pytest

from hybrid_nope.kernels import blocking


def allowed_pairs(seg, window):
  B, T = seg.shape
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  allowed = (j <= i) & ((j > i - window) if window else True)
  return allowed & (seg[:, :, None] == seg[:, None, :])


@pytest.mark.parametrize("T, block", [(1, 1), (37, 4), (50, 16)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_bounds_never_exclude_an_allowed_pair(T, block, contiguous):
  rng = np.random.default_rng()
  B = 2
  for window in (None, 1, 3, 16, 17, T, 2 * T):
    seg = (np.cumsum(rng.random((B, T)) < 0.2, 1) if contiguous
           else rng.integers(0, 3, (B, T)))  # Ids may recur: equal ids attend, not runs.
    Tp = blocking.cdiv(T, block) * block
    seg_p = np.asarray(blocking.pad_segments(seg, Tp))
    lo = np.asarray(blocking.query_block_key_start(Tp, block, window, seg_p))
    hi = np.asarray(blocking.key_block_query_end(Tp, block, window, seg_p))
    allowed = allowed_pairs(seg_p, window)
    for b in range(B):
      for n in range(Tp // block):
        rows = slice(n * block, (n + 1) * block)
        assert np.nonzero(allowed[b, rows].any(0))[0].min() >= lo[b, n]
        assert np.nonzero(allowed[b, :, rows].any(1))[0].max() <= hi[b, n]


def test_bounds_are_tight_for_packed_documents():
  # Documents [0, 5), [5, 13), [13, 16) in blocks of 4.
  seg = np.array([[0] * 5 + [1] * 8 + [2] * 3])
  lo = np.asarray(blocking.query_block_key_start(16, 4, None, seg))
  hi = np.asarray(blocking.key_block_query_end(16, 4, None, seg))
  np.testing.assert_array_equal(lo, [[0, 0, 5, 5]])  # Block 3 (12..15) starts in document 1.
  np.testing.assert_array_equal(hi, [[4, 12, 12, 15]])
  lo_w = np.asarray(blocking.query_block_key_start(16, 4, 3, None))
  np.testing.assert_array_equal(lo_w, [[0, 2, 6, 10]])  # Block i starts at 4i - 3 + 1.


def test_pad_segments_extends_the_last_segment():
  np.testing.assert_array_equal(blocking.pad_segments(np.array([[3, 3, 7]]), 5),
                                [[3, 3, 7, 7, 7]])


def test_effective_window_makes_a_covering_window_global():
  assert blocking.effective_window(None, 17) is None
  assert blocking.effective_window(16, 17) == 16
  assert blocking.effective_window(17, 17) is None  # Row 16 already sees all 17 keys.
  assert blocking.effective_window(34, 17) is None
