"""The Ratings columns' whole-file operations: the time sort and the distinct-id count give what
numpy's stable argsort and unique give, on every kind of column."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.radix import radix_order
from sketchrec.ratings import Ratings, n_distinct, stable_order


def _stamp_columns():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 50, 20_000),                        # many ties
            rng.integers(789_652_009, 1_574_327_703, 5_000),     # a MovieLens span
            rng.integers(-2**61, 2**61, 3_000),                  # too wide to pack: numpy's sort
            np.array([2**63 + 5, 2**63 + 1, 2**63 + 5], dtype=np.uint64),
            np.array([5, 3, 5, 3], dtype=np.int32),
            np.array([2**31 - 1, -2**31, 0, -2**31], dtype=np.int32),   # the span of int32
            rng.integers(0, 2**43, 4_000),                       # four radix passes
            np.array([3.5, 1.25, 3.5]), np.array([9]), np.array([], dtype=np.int64)]


def test_the_time_order_is_numpys_stable_order():
    for stamps in _stamp_columns():
        assert stable_order(stamps).tolist() == np.argsort(stamps, kind="stable").tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**62, 2**62), min_size=2, max_size=200), st.integers(0, 45),
       st.sampled_from([np.int64, np.uint64]))
def test_the_radix_order_is_numpys_stable_order(values, span_bits, dtype):
    keys = np.array([v % (1 << span_bits) for v in values], dtype)   # many ties for small spans
    order = radix_order(keys)
    assert (order is not None) == ((int(keys.max()) - int(keys.min())).bit_length() <= 44)
    assert stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()
    if order is not None:
        assert order.tolist() == np.argsort(keys, kind="stable").tolist()


def test_the_broken_variant_an_unstable_sort_reorders_ties():
    # what the packed row numbers are for: a plain fast sort of the timestamps breaks ties anyhow
    stamps = _stamp_columns()[0]
    assert np.argsort(stamps).tolist() != np.argsort(stamps, kind="stable").tolist()


def test_sort_by_time_moves_every_column_together():
    rng = np.random.default_rng(3)
    stamps = rng.integers(0, 100, 1_000)
    data = Ratings(np.arange(1_000), np.arange(1_000)[::-1].copy(), rng.random(1_000), stamps)
    order = np.argsort(stamps, kind="stable")
    data.sort_by_time()
    assert data.users.tolist() == order.tolist()
    assert data.items.tolist() == (999 - order).tolist()
    assert data.timestamps.tolist() == stamps[order].tolist()


def test_distinct_ids_are_counted_as_numpy_counts_them():
    rng = np.random.default_rng(5)
    ints = rng.integers(0, 3_000, 50_000)
    texts = np.array([f"u-{x}" for x in ints], dtype=object)
    for ids in (ints, ints.astype(np.uint64), texts, texts.astype(str)):
        assert n_distinct(ids) == len(np.unique(ids))
    assert n_distinct(np.array([], dtype=object)) == 0


def test_ids_numpy_cannot_sort_are_counted_too():
    # ints among text ids, or an int past int64: a Python set (numpy's unique raised on the first)
    assert n_distinct(np.array([1, "1", "a", "a"], dtype=object)) == 3
    assert n_distinct(np.array([2**70, 2**70, 3], dtype=object)) == 2


def test_a_text_id_is_one_object_across_all_the_blocks_of_a_file(tmp_path, monkeypatch):
    from sketchrec import chunks
    from sketchrec.data import read_ratings
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 4096)   # about a hundred blocks
    path = tmp_path / "r.csv"
    lines = [f"user-{n % 37},item-{n % 11},4,{n}" for n in range(5_000)]
    path.write_text("user,item,rating,timestamp\n" + "\n".join(lines) + "\n")
    ratings, report = read_ratings(path)
    assert report.n_skipped == 0 and len(ratings) == 5_000
    assert ratings.users.tolist() == [f"user-{n % 37}" for n in range(5_000)]
    # memory: 37 + 11 str objects for 10,000 id cells, not one per id per block
    assert len({id(x) for x in ratings.users.tolist()}) == 37
    assert len({id(x) for x in ratings.items.tolist()}) == 11


def test_the_broken_variant_without_a_vocabulary_keeps_a_copy_per_block():
    import pyarrow as pa
    from sketchrec.chunks import settle_ids
    from sketchrec.text_ids import Vocabulary
    blocks = [pa.array(["user-a", "user-b", "user-a"]), pa.array(["user-b", "user-a"])]
    apart = np.concatenate([settle_ids(b, None) for b in blocks])
    assert len({id(x) for x in apart.tolist()}) == 4   # a copy of each id in each block
    vocab = Vocabulary()
    shared = Ratings.concat([Ratings(settle_ids(b, None, vocab), np.zeros(len(b)), np.ones(len(b)),
                                     np.zeros(len(b), np.int64)) for b in blocks])
    assert shared.coded("users") is not None and len(vocab) == 2
    assert shared.users.tolist() == apart.tolist() and len({id(x) for x in shared.users.tolist()}) == 2
