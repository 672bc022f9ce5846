"""The compiled passes over plain lines (decimal ids, or plain text ids) give the columns the
general reader gives, bit for bit, and leave every line they cannot read exactly to it (signs,
spaces, carriage returns, long or empty fields, non-ASCII ids, a wrong number of fields)."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec import chunks, line_fields
from sketchrec.formats import Layout
from sketchrec.text_ids import Coded, Vocabulary

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


def general(lines: pa.Array, vocab=None) -> chunks.Block:
    """The block read without the compiled passes (what they must agree with)."""
    saved = chunks.decimal_block, chunks.text_block
    chunks.decimal_block = chunks.text_block = lambda *a: None
    try:
        return chunks.split_block(lines, LAYOUT, vocab)
    finally:
        chunks.decimal_block, chunks.text_block = saved


def columns(block) -> list:
    """Each column's type and bits (text ids: their values)."""
    return [bits(getattr(block, c)) for c in COLUMNS]


def bits(column):
    if isinstance(column, Coded):
        return ("codes", column.ids().tolist())
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


# text ids: what the text pass takes (printable ASCII without a space or the separator), and
# what it must leave to the general reader (spaces, non-ASCII, an empty or a 300-byte id)
TEXT_ID = (st.from_regex(r"[!-+\--~]{1,12}", fullmatch=True)
           | st.sampled_from(["user-7", "007", "+5", "-3", "a b", " x", "é", "", "k" * 300, "x\r"]))
TEXT_LINE = st.tuples(TEXT_ID, TEXT_ID, RATING | PIECES, DIGITS | PIECES).map(",".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(TEXT_LINE, min_size=1, max_size=8), st.booleans())
def test_a_block_of_text_ids_reads_the_same_either_way(texts, coded):
    lines = pa.array([t.encode() for t in texts], pa.binary())
    slow = general(lines, Vocabulary() if coded else None)
    block = chunks.split_block(lines, LAYOUT, Vocabulary() if coded else None)
    assert columns(block) == columns(slow)
    assert [(r, m.tolist()) for r, m in block.rejected] == [(r, m.tolist()) for r, m in slow.rejected]


def test_plain_text_ids_take_the_text_pass():
    lines = pa.array([b"00000000-0000-0000-6508-8982715b6da7,user-17,3.5,1261009409", b"ann,007,4,5"])
    users, items, ratings, stamps = line_fields.text_block(lines, ",", 4, LAYOUT.index)
    assert users.to_pylist() == ["00000000-0000-0000-6508-8982715b6da7", "ann"]
    assert items.to_pylist() == ["user-17", "007"] and ratings.tolist() == [3.5, 4.0]
    for odd in (b"ann,b c,4,5", b"ann,\xc3\xa9,4,5", b"ann,,4,5", b"ann,b,4", b"ann,b,4.,5"):
        assert line_fields.text_block(pa.array([b"ann,b,4,5", odd]), ",", 4, LAYOUT.index) is None


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
