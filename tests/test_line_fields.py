"""The compiled pass over plain decimal lines gives the columns the general reader gives, bit for
bit, and leaves every line it cannot read exactly to it (signs, spaces, carriage returns, long
or empty fields, text ids, a wrong number of fields)."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec import chunks, line_fields
from sketchrec.formats import Layout

LAYOUT = Layout(",", False, {"user": 0, "item": 1, "rating": 2, "timestamp": 3}, 4, "movielens-csv")
COLUMNS = ("users", "items", "ratings", "timestamps")

# fields built from the pieces that matter: digits (short and long), a sign, a point, a space,
# a carriage return, letters, a separator inside a field
PIECES = st.sampled_from(["0", "7", "42", "3.5", "0.1", "2.675", "123456789012345678",
                          "1234567890123456789", "12345.678901234567", "-", "+", ".", " ", "\r",
                          "a", "1e3", ",", "", "00012"])
FIELD = st.lists(PIECES, min_size=0, max_size=3).map("".join)
LINE = st.lists(FIELD, min_size=3, max_size=5).map(",".join)
# and lines the compiled pass takes: decimal ids and timestamps (leading zeros too), ratings with
# up to 15 digits
DIGITS = st.integers(0, 10**18 - 1).map(str) | st.integers(0, 999).map("{:05d}".format)
RATING = st.builds("{}{}.{}".format, st.sampled_from(["", "-"]), st.integers(0, 10**7),
                   st.integers(0, 10**7)) | st.integers(-10**14, 10**14).map(str)
PLAIN = st.tuples(DIGITS, DIGITS, RATING, DIGITS).map(",".join)
BLOCK = st.lists(PLAIN, min_size=1, max_size=8) | st.lists(PLAIN | LINE, min_size=1, max_size=8)


def general(lines: pa.Array) -> chunks.Block:
    """The block read without the compiled pass (what it must agree with)."""
    saved = chunks.decimal_block
    chunks.decimal_block = lambda *a: None
    try:
        return chunks.split_block(lines, LAYOUT)
    finally:
        chunks.decimal_block = saved


def columns(block) -> list:
    """Each column's type and bits (text ids: their values)."""
    return [bits(getattr(block, c)) for c in COLUMNS]


def bits(column: np.ndarray):
    return (column.dtype.str, column.tolist() if column.dtype == object else column.tobytes())


@settings(max_examples=150, deadline=None)
@given(BLOCK)
def test_a_block_reads_the_same_either_way(texts):
    lines = pa.array([t.encode() for t in texts], pa.binary())
    fast = line_fields.decimal_block(lines, ",", 4, LAYOUT.index)
    slow = general(lines)
    if fast is not None:   # taken: the general reader set nothing aside and gives the same bits
        assert not slow.rejected
        assert [bits(c) for c in fast] == columns(slow)
    block = chunks.split_block(lines, LAYOUT)
    assert columns(block) == columns(slow)
    assert [(r, m.tolist()) for r, m in block.rejected] == [(r, m.tolist()) for r, m in slow.rejected]


def test_decimal_ratings_are_the_correctly_rounded_doubles():
    """Every rating of up to 15 digits reads as Python's float of its text (a pass that summed
    digit by digit, or multiplied by 0.1 per decimal, would be off in the last bit for many)."""
    rng = np.random.default_rng(5)
    texts = [f"{m}.{d:0{k}d}" for m, d, k in zip(rng.integers(0, 10**6, 3000),
                                                  rng.integers(0, 10**8, 3000), rng.integers(1, 9, 3000))
             if len(str(m)) + k <= 15 and d < 10**k]
    texts += ["-0.5", "0.1", "0.3", "2.675", "999999999999999", "-12.5", "5"]
    lines = pa.array([f"1,2,{t},3".encode() for t in texts], pa.binary())
    _, _, ratings, _ = line_fields.decimal_block(lines, ",", 4, LAYOUT.index)
    assert ratings.tobytes() == np.array([float(t) for t in texts]).tobytes()
    naive = np.array([sum(int(c) * 10.0 ** -(j + 1) for j, c in enumerate(t.split(".")[1]))
                      + int(t.split(".")[0]) for t in texts if "." in t and t[0] != "-"])
    exact = np.array([float(t) for t in texts if "." in t and t[0] != "-"])
    assert (naive != exact).any()   # the broken variant the test would catch


@pytest.mark.parametrize("sep,text", [(",", "5,17,4.5,964982703"), ("::", "5::17::4.5::964982703"),
                                      ("\t", "5\t17\t4.5\t964982703")])
def test_movielens_lines_take_the_compiled_pass(sep, text):
    """The common files are read by the compiled pass (not only correct when it gives up)."""
    lines = pa.array([text.encode()] * 3, pa.binary())
    users, items, ratings, stamps = line_fields.decimal_block(lines, sep, 4, LAYOUT.index)
    assert users.tolist() == [5] * 3 and items.tolist() == [17] * 3
    assert ratings.tolist() == [4.5] * 3 and stamps.tolist() == [964982703] * 3


def test_roles_in_any_order_and_unused_fields():
    index = {"rating": 3, "user": 1, "item": 0}   # no timestamp; field 2 unused
    lines = pa.array([b"9,1,anything,2.5", b"8,2,,4"], pa.binary())
    users, items, ratings, stamps = line_fields.decimal_block(lines, ",", 4, index)
    assert (users.tolist(), items.tolist(), ratings.tolist(), stamps.tolist()) == \
        ([1, 2], [9, 8], [2.5, 4.0], [0, 0])
