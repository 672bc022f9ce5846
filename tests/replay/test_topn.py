"""Prequential top-N (replay.topn): the metric maths on hand-checkable cases, the popularity
ranker, the catalogue and seen sets, and that scoring never changes what the model learns."""

import math

import numpy as np
import pytest

from sketchrec.data import Ratings
from sketchrec.models import SketchMF
from sketchrec.replay.topn import TopN, expected_hit_gain, rank_counts, sample_positions


def stream(rows) -> Ratings:
    users, items, ratings = zip(*rows)
    return Ratings(np.array(users, dtype=np.int64), np.array(items, dtype=np.int64),
                   np.array(ratings, dtype=np.float64), np.arange(len(rows), dtype=np.int64))


class Fixed:
    """A ranker with a fixed score per item (0 for the rest); learns nothing."""

    def __init__(self, scores: dict):
        self.scores = scores

    def score_items(self, user, items):
        return np.array([self.scores.get(int(i), 0.0) for i in items])

    def learn_many(self, users, items, ratings):
        return np.full(len(ratings), 3.0)


def test_hit_and_gain_by_rank():
    assert expected_hit_gain(0, 0) == (1.0, 1.0)                     # first
    assert expected_hit_gain(10, 0) == (0.0, 0.0)                    # 11th: a miss at 10
    for rank in range(1, 11):
        hit, gain = expected_hit_gain(rank - 1, 0)
        assert hit == 1.0 and gain == pytest.approx(1 / math.log2(rank + 1))
    # tied with 3 others right at the top: ranks 1-4 equally likely
    assert expected_hit_gain(0, 3)[1] == pytest.approx(sum(1 / math.log2(r + 1) for r in range(1, 5)) / 4)
    assert expected_hit_gain(9, 3) == pytest.approx((0.25, 0.25 / math.log2(11)))   # 10th..13th
    assert rank_counts(np.array([3.0, 5.0, 3.0, 1.0]), 0) == (1, 1)


def run(ranker, data: Ratings, positions, k: int = 10) -> dict:
    topn = TopN(ranker, positions, k=k)
    topn.learn(ranker, data)
    return topn.result()


def catalogue_then(target_rows, n_items=20):
    """User 99 rates items 1..n_items (rating 3), then the given rows."""
    return stream([(99, i, 3.0) for i in range(1, n_items + 1)] + target_rows)


@pytest.mark.parametrize("better, recall, ndcg", [(0, 1.0, 1.0), (9, 1.0, 1 / math.log2(11)),
                                                   (10, 0.0, 0.0)])
def test_recall_and_ndcg_of_a_ranker_that_puts_the_item_at_a_known_rank(better, recall, ndcg):
    data = catalogue_then([(1, 5, 5.0)])
    scores = {5: 1.0, **{i: 2.0 for i in range(6, 6 + better)}}   # `better` items above item 5
    result = run(Fixed(scores), data, [20])
    assert result["events"] == 1
    assert result["recall_at_10"] == pytest.approx(recall)
    assert result["ndcg_at_10"] == pytest.approx(ndcg)


def test_items_the_user_rated_are_not_candidates():
    # user 1 rated items 6..15 (scored highest) before the event: item 5 still ranks first
    data = catalogue_then([(1, i, 2.0) for i in range(6, 16)] + [(1, 5, 4.0)])
    result = run(Fixed({**{i: 9.0 for i in range(6, 16)}, 5: 1.0}), data, [30])
    assert result["recall_at_10"] == 1.0 and result["ndcg_at_10"] == 1.0


def test_popularity_ranks_by_count_so_far_and_new_items_are_misses():
    rows = [(1, 1, 3.0), (2, 1, 5.0), (3, 1, 4.0), (2, 2, 4.0), (3, 2, 1.0), (3, 3, 2.0),
            (1, 2, 5.0),    # 6: user 1 rated item 1; candidates 2 (count 2) and 3 (1): rank 1
            (4, 3, 4.0),    # 7: candidates 1 (3), 2 (3), 3 (1): rank 3
            (5, 9, 5.0),    # 8: item 9 never seen: a miss for both
            (6, 1, 2.0)]    # 9: below the threshold: not an event
    result = run(Fixed({}), stream(rows), [6, 7, 8, 9], k=2)
    assert (result["events"], result["new_item_events"]) == (3, 1)
    pop = result["popularity"]
    assert pop["recall_at_2"] == pytest.approx(1 / 3)
    assert pop["ndcg_at_2"] == pytest.approx(1 / 3)
    # a constant ranker: every candidate tied, ranks at random: ranks 1-2, then 1-3, then a miss
    assert result["recall_at_2"] == pytest.approx((1 + 2 / 3) / 3)


def test_scoring_leaves_learning_untouched():
    rng = np.random.default_rng(0)
    data = Ratings(rng.integers(1, 60, 3000), rng.integers(1, 40, 3000),
                   rng.integers(1, 6, 3000).astype(float), np.arange(3000))
    plain, scored = SketchMF(capacity=100, dim=8, seed=1), SketchMF(capacity=100, dim=8, seed=1)
    expected = np.concatenate([plain.learn_many(b.users, b.items, b.ratings) for b in data.batches(1000)])
    topn = TopN(scored, sample_positions(len(data), 300, seed=2, ratings=data.ratings))
    got = np.concatenate([topn.learn(scored, b) for b in data.batches(1000)])
    assert np.array_equal(got, expected)
    assert plain.to_bytes() == scored.to_bytes()
    assert topn.result()["events"] == 300
    assert topn.result()["recall_at_10"] > 0.2   # 39 items: better than nothing, not perfect


def test_sample_positions_are_seeded_and_relevant():
    ratings = np.array([5.0, 1.0, 4.0, 3.0, 4.5, 2.0] * 50)
    a = sample_positions(len(ratings), 40, seed=3, ratings=ratings)
    assert np.array_equal(a, sample_positions(len(ratings), 40, seed=3, ratings=ratings))
    assert len(a) == 40 and (np.diff(a) > 0).all() and (ratings[a] >= 4).all()
    assert not np.array_equal(a, sample_positions(len(ratings), 40, seed=4, ratings=ratings))
    assert len(sample_positions(10, 40, seed=3)) == 10   # unknown ratings: any position, at most all


@pytest.mark.parametrize("argv, message", [
    (["--topn", "--model", "river"], "scores without learning"),
    (["--topn", "--dp-epsilon", "1"], "DP-SGD's noisy steps"),
    (["--topn", "--holdout", "0.2"], "prequential"),
    (["../u.data", "--change-point", "0.5"], "synthetic stream")])
def test_replay_refuses_what_top_n_cannot_measure_honestly(argv, message, tmp_path):
    from sketchrec.cli.replay import replay_main
    if argv[0].endswith("u.data"):
        argv = [str(tmp_path / "u.data")] + argv[1:]
        (tmp_path / "u.data").write_text("1\t2\t3\t4\n")
    with pytest.raises(SystemExit, match=message):
        replay_main(argv + ["--quiet"])
