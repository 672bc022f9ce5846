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
