"""The compiled fast form of rating messages (``messages.parse_fast``) gives exactly what
``parse_message`` gives, or leaves the message to it."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.stream.kafka.intake import columns as _columns
from sketchrec.stream.kafka.messages import parse_fast, parse_message

# pieces of lines: mostly well formed, with the edge cases of each field mixed in
_ID = st.one_of(st.integers(0, 10**18 - 1).map(str), st.sampled_from(
    ["007", "0", "9" * 18, "9" * 19, "", " 5", "5 ", "+5", "-5", "a", "1e3", "٣", "5\r"]))
_RATING = st.one_of(st.integers(0, 10).map(str),
                    st.floats(0, 10, allow_nan=False).map(lambda x: f"{x:.{len(repr(x))}g}"),
                    st.sampled_from(["4.", ".5", ".", "4.5.", "1e0", "nan", "inf", "-1", "+3", " 3",
                                     "0.1", "3.0000000000000001", "1234567890123456", "4.5\r"]))
_STAMP = st.one_of(st.none(), st.integers(0, 10**18 - 1).map(str),
                   st.sampled_from(["", " ", "x", "-3", "1_000", "9" * 19, "3,4"]))


@st.composite
def _line(draw) -> str:
    fields = [draw(_ID), draw(_ID), draw(_RATING)]
    stamp = draw(_STAMP)
    return ",".join(fields + ([] if stamp is None else [stamp]))


_MESSAGE = st.one_of(
    st.lists(_line(), min_size=1, max_size=4).map(lambda lines: "\n".join(lines).encode()),
    st.tuples(st.lists(_line(), min_size=1, max_size=3), st.sampled_from(["\n", "\r\n", "\n\n", " ", "\r"]))
    .map(lambda t: (t[1].join(t[0]) + t[1]).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"", b"\n", b'{"user": 1, "item": 2, "rating": 3}', b"1,2,3\n\n4,5,3"]))


@settings(max_examples=400, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=6),
       st.sampled_from([None, (1.0, 5.0), (0.5, 5.0)]))
def test_fast_form_gives_what_parse_message_gives(values, rating_range):
    users, items, ratings, counts = parse_fast(values, rating_range)
    at = 0
    for value, n in zip(values, counts.tolist()):
        if n < 0:
            continue  # left to parse_message
        slow = parse_message(value, rating_range)
        assert not slow.rejected, (value, slow.rejected)
        assert [(u, i, r) for u, i, r, _ in slow.ratings] == list(
            zip(users[at:at + n].tolist(), items[at:at + n].tolist(), ratings[at:at + n].tolist())), value
        assert all(type(u) is int and type(i) is int for u, i, _, _ in slow.ratings)
        at += n
    assert at == len(ratings)


def test_fast_form_takes_the_usual_messages_and_leaves_the_rest():
    good = [b"196,242,3,881250949", b"1,2,4.5\n3,4,0.5,", b"5,6,5\r\n7,8,1\n"]
    bad = [b"a,2,3", b"1,2,nan", b"1,2,9", b" 1,2,3", b"1,2,3\n\n4,5,3", None, b'{"user": 1}']
    users, items, ratings, counts = parse_fast(good + bad, (0.5, 5.0))
    assert counts.tolist() == [1, 2, 2] + [-1] * len(bad)
    assert users.tolist() == [196, 1, 3, 5, 7] and ratings.tolist() == [3.0, 4.5, 0.5, 5.0, 1.0]
    # ids: int64 where every part's are; a text id makes its column text, as _ids does
    assert _columns([(users, items, ratings)])[0].dtype == np.int64
    mixed = _columns([(users[:1], items[:1], ratings[:1]), (("a",), (7,), (3.0,))])
    assert mixed[0].tolist() == ["196", "a"] and mixed[1].tolist() == [242, 7]
