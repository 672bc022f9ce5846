"""The learner's machine-level helpers: a borrowed array is the caller's memory (no copy), and a
prefetch is a hint that changes no value."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from sketchrec.models._intrinsics import borrow, prefetch


@njit
def _write_through(a, rows):
    b = borrow(a)
    for r in range(rows):
        row = b[r]   # a view of the borrowed array: still the caller's memory
        row[1] += 1.0
        b[r, 2] = row.sum()
    return b.shape[0] * b.shape[1]


@njit
def _fetched_sum(a, keys):
    total = 0.0
    for n in range(keys.shape[0]):
        prefetch(a, (keys[n] % a.shape[0], 0))
        prefetch(keys, n)
        total += a[keys[n] % a.shape[0], 0]
    return total


def test_a_borrowed_array_and_its_views_write_the_callers_memory():
    a = np.arange(12.0).reshape(4, 3)
    expected = a.copy()
    expected[:, 1] += 1.0
    expected[:, 2] = expected[:, 0] + expected[:, 1] + a[:, 2]
    assert _write_through(a, 4) == 12
    np.testing.assert_array_equal(a, expected)


def test_prefetch_changes_no_value():
    a = np.random.default_rng(0).random((50, 4))
    keys = np.arange(0, 500, 7, dtype=np.int64)
    assert _fetched_sum(a, keys) == sum(a[k % 50, 0] for k in keys)


def test_prefetch_takes_one_index_per_dimension():
    @njit
    def wrong(a):
        prefetch(a, 0)   # a 2-d array needs (i, j)

    with pytest.raises(TypingError):
        wrong(np.zeros((2, 2)))
