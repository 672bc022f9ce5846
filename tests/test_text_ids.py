"""Text ids as codes into a file's vocabulary (sketchrec.text_ids): the codes a pure-Python
dictionary gives, across blocks; ``Ratings`` whose id columns are codes take, sort, concatenate
and count as the same ratings with the ids themselves; a file read whole keeps them as codes."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.ratings import Ratings
from sketchrec.text_ids import Coded, Vocabulary

DECIMAL = re.compile(r"[0-9]{1,18}")


def reference_codes(blocks: list[list[str]]) -> tuple[list[list[int]], list[str]]:
    """What the vocabulary must give: each id numbered as first seen, a decimal id of 1 to 18
    digits under its int's text."""
    table: dict[str, int] = {}
    out = []
    for block in blocks:
        out.append([table.setdefault(str(int(x)) if DECIMAL.fullmatch(x) else x, len(table)) for x in block])
    return out, list(table)


ids = st.one_of(st.text(min_size=1, max_size=12), st.from_regex(r"0{0,3}[0-9]{1,20}", fullmatch=True),
                st.sampled_from(["a", "b", "007", "7", "é", "0", "00"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(ids, max_size=60), max_size=6))
def test_codes_are_a_python_dictionarys(blocks):
    vocab = Vocabulary()
    codes = [vocab.codes(pa.array(block, pa.string())).tolist() for block in blocks]
    expected, names = reference_codes(blocks)
    assert codes == expected
    assert vocab.names().tolist() == names and len(vocab) == len(names)
    assert vocab.text().to_pylist() == names


def test_many_ids_grow_the_table_and_stay_apart():
    rng = np.random.default_rng(4)
    blocks = [[f"id-{x}" for x in rng.integers(0, 20_000, 3_000)] for _ in range(12)]
    vocab = Vocabulary()
    codes = [vocab.codes(pa.array(block)).tolist() for block in blocks]
    assert (codes, vocab.names().tolist()) == reference_codes(blocks)
    # decimal ids after text ones: the codes of their text
    assert vocab.int_codes(np.array([12, -3])).tolist() == vocab.codes(pa.array(["12", "-3"])).tolist()


def test_the_broken_variant_codes_per_block_differ():
    # what the file-wide table is for: numbering each block afresh gives one id two codes
    first, second = pa.array(["ann", "bob"]), pa.array(["bob"])
    assert Vocabulary().codes(second).tolist() != Vocabulary().codes(pa.array(["ann", "bob"]))[1:].tolist()
    vocab = Vocabulary()
    assert vocab.codes(first)[1] == vocab.codes(second)[0]


def _both(n: int, seed: int) -> tuple[Ratings, Ratings]:
    rng = np.random.default_rng(seed)
    users = [f"user-{x}" for x in rng.integers(0, 40, n)]
    items = [str(x) for x in rng.integers(0, 30, n)]
    vocab = Vocabulary()
    coded = Ratings(Coded(vocab.codes(pa.array(users)), vocab), Coded(vocab.codes(pa.array(items)), vocab),
                    rng.random(n), rng.integers(0, 50, n))
    plain = Ratings(np.array(users, object), np.array(items, object), coded.ratings.copy(),
                    coded.timestamps.copy())
    return coded, plain


def _same(coded: Ratings, plain: Ratings) -> None:
    assert coded.users.tolist() == plain.users.tolist() and coded.items.tolist() == plain.items.tolist()
    assert np.array_equal(coded.ratings, plain.ratings) and np.array_equal(coded.timestamps, plain.timestamps)


def test_coded_ratings_take_sort_concatenate_and_count_as_the_ids_do():
    coded, plain = _both(2_000, 1)
    assert coded.n_ids() == plain.n_ids() == len(set(plain.users.tolist())) + len(set(plain.items.tolist()))
    _same(coded.take(np.arange(0, 2_000, 3)), plain.take(np.arange(0, 2_000, 3)))
    coded.sort_by_time()
    plain.sort_by_time()
    _same(coded, plain)
    assert coded.coded("users") is not None   # still codes after the sort
    whole = Ratings.concat(list(coded.batches(300)))
    assert whole.coded("items") is not None
    _same(whole, plain)
    assert len({id(x) for x in coded.users.tolist()}) == len(set(plain.users.tolist()))   # one object an id
    other, _ = _both(10, 2)   # another vocabulary: the ids themselves
    mixed = Ratings.concat([coded.take(slice(0, 5)), other])
    assert mixed.coded("users") is None and mixed.users.tolist() == coded.users[:5].tolist() + other.users.tolist()


def test_a_file_read_whole_holds_its_text_ids_as_codes(tmp_path, monkeypatch):
    from sketchrec import chunks
    from sketchrec.data import read_ratings
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 1024)   # many blocks: decimal ones, then text ones
    lines = [f"{n % 13:03d},{n % 7},4,{n}" for n in range(400)]
    lines += [f"u{n % 5},{n % 7 if n % 2 else f'm{n % 3}'},4,{n}" for n in range(400, 800)]
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating,timestamp\n" + "\n".join(lines) + "\n")
    ratings, report = read_ratings(path)
    assert report.n_skipped == 0 and ratings.coded("users") is not None and ratings.coded("items") is not None
    assert ratings.users.tolist() == [str(n % 13) for n in range(400)] + [f"u{n % 5}" for n in range(400, 800)]
    assert ratings.items.tolist() == [str(n % 7) for n in range(400)] + [
        str(n % 7) if n % 2 else f"m{n % 3}" for n in range(400, 800)]
    assert ratings.n_ids() == 13 + 5 + 7 + 3


def test_produce_sends_the_same_messages_from_codes(tmp_path):
    # a file read whole holds text ids as codes; what `produce` sends is built from the ids
    from sketchrec.data import read_ratings
    from sketchrec.stream.kafka import producer
    rng = np.random.default_rng(6)
    path = tmp_path / "r.csv"
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"u-{u},m{i},{r},{t}\n" for u, i, r, t in zip(rng.integers(0, 50, 600), rng.integers(0, 40, 600),
                                                     rng.integers(1, 11, 600) / 2, rng.integers(0, 999, 600))))
    coded, _ = read_ratings(path)
    assert coded.coded("users") is not None
    plain = Ratings(coded.users.copy(), coded.items.copy(), coded.ratings, coded.timestamps)
    for data in (coded, plain):
        data.sort_by_time()
    assert list(producer._messages(coded, coded.ratings, 7)) == list(producer._messages(plain, plain.ratings, 7))


def test_more_distinct_ids_than_int32_codes_hold_are_refused_not_wrapped():
    from sketchrec.text_ids import MAX_IDS, Vocabulary
    vocab = Vocabulary()
    vocab.count = MAX_IDS - 1   # as if that many were held (the arrays are not grown first)
    with pytest.raises(ValueError, match="distinct text ids in one file"):
        vocab._reserve(2, 16)
