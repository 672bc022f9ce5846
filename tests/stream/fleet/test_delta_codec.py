"""The delta codec's read side: sparse indices rebuilt from their gaps, entries added to a
replica's model and its base in one pass."""

import numpy as np
import pytest

from sketchrec.stream.fleet.delta_codec import add_entries, encode_entries, entries_of


def test_sparse_entries_come_back_at_their_indices_and_past_the_end_is_refused():
    idx = np.array([3, 4, 70_000, 2**31 + 5], np.int64)   # gaps above 2**31: no int32 wrap
    out = encode_entries("x", idx, np.ones(4, np.float32), 2**32)
    assert "x.i" in out
    assert entries_of(out, "x", _Like(2**32))[0].tolist() == idx.tolist()
    with pytest.raises(ValueError, match="indices"):
        entries_of(out, "x", _Like(2**31 + 5))


class _Like:
    """Stands for an array of ``size`` float32 entries (entries_of reads only its size and dtype)."""

    def __init__(self, size):
        self.size, self.dtype = size, np.dtype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_an_entry_added_to_a_model_and_its_base_lands_in_both_alike(dtype):
    idx = np.array([1, 5, 6], np.int64)
    found = entries_of(encode_entries("x", idx, np.array([1, 2, 3], dtype), 64), "x",
                       np.zeros(64, np.float32))
    model, base = np.full((8, 8), 0.5, np.float32), np.full((8, 8), 0.25, np.float32)
    add_entries(model, found, base)
    want = np.zeros(64, np.float32)
    want[idx] = [1, 2, 3]
    np.testing.assert_array_equal(model.reshape(-1), 0.5 + want)
    np.testing.assert_array_equal(base.reshape(-1), 0.25 + want)


def test_gaps_that_fit_go_as_uint16_and_read_as_the_reader_before_them_summed_them():
    """Half the bytes to (de)compress where every gap fits in 16 bits; a reader that summed the
    gaps with np.cumsum (any unsigned width) gets the same indices, so no format version moves."""
    like = _Like(1 << 20)
    for idx, width in (([5, 65540], np.uint16), ([0, 65535, 131072], np.uint32), ([70000], np.uint32)):
        out = encode_entries("x", np.array(idx, np.int64), np.ones(len(idx), np.float32), like.size)
        assert out["x.i"].dtype == width
        assert entries_of(out, "x", like)[0].tolist() == idx
        assert np.cumsum(out["x.i"], dtype=np.int64).tolist() == idx


def test_a_gap_past_the_uint32_range_goes_wider_instead_of_wrapping():
    idx = np.array([3, 2**32 + 7], np.int64)   # a model of over 4 G entries
    out = encode_entries("x", idx, np.ones(2, np.float32), 2**33)
    assert out["x.i"].dtype == np.uint64
    assert entries_of(out, "x", _Like(2**33))[0].tolist() == idx.tolist()
