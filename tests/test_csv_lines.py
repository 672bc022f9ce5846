"""The compiled line writer gives Python's text of every rating, for any int64, text ids and any
order; the counting sort is numpy's stable argsort."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.csv_lines import csv_lines, group_order, text_or_ints

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
STARS = ["4.5", "3", "0.333333", "-1e-05"]


def python_lines(order, users, items, star_of, timestamps) -> bytes:
    return "".join(f"{users[r]},{items[r]},{STARS[star_of[r]]},{timestamps[r]}\n"
                   for r in order.tolist()).encode()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(INT64, st.one_of(INT64, st.text(min_size=1, max_size=6)),
                          st.integers(0, 3), INT64), max_size=40),
       st.randoms(use_true_random=False))
def test_lines_are_pythons_text(rows, rnd):
    order = np.array(rnd.sample(range(len(rows)), len(rows)), np.int64)
    users = np.array([r[0] for r in rows], np.int64)
    items = np.array([r[1] for r in rows], object)
    if all(isinstance(i, int) for i in items):
        items = items.astype(np.int64)
    elif any(isinstance(i, int) for i in items):
        items = np.array([str(i) for i in items], object)   # a column is ints or text
    star_of = np.array([r[2] for r in rows], np.int64)
    stamps = np.array([r[3] for r in rows], np.int64)
    offsets, data = csv_lines(order, text_or_ints(users), text_or_ints(items), star_of, STARS,
                              text_or_ints(stamps))
    expected = python_lines(order, users, items, star_of, stamps)
    assert bytes(data) == expected
    assert offsets[0] == 0 and offsets[-1] == len(expected) and len(offsets) == len(rows) + 1


def test_extremes_and_unsigned_ids():
    ids = np.array([0, -1, 9, 10, -10, 10**18, -10**18, (1 << 63) - 1, -(1 << 63)], np.int64)
    wide = np.array([(1 << 64) - 1, 5, 0, 1, 2, 3, 4, 6, 7], np.uint64)   # as text, via arrow
    order = np.arange(len(ids))
    star_of = np.zeros(len(ids), np.int64)
    _, data = csv_lines(order, text_or_ints(ids), text_or_ints(wide), star_of, STARS, text_or_ints(ids))
    assert bytes(data) == python_lines(order, ids, wide, star_of, ids)


def test_group_order_is_the_stable_argsort():
    codes = np.random.default_rng(2).integers(0, 300, 20_000)
    assert np.array_equal(group_order(codes, 300), np.argsort(codes, kind="stable"))
    assert group_order(np.zeros(0, np.int64), 0).tolist() == []
