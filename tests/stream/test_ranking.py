"""The served top-N ranking (models.ranking, stream.serving.ranking): Hedge over rankers moves its
weight to the one with more hits (seeded streams where popularity, or the personal model, is the
right answer), and /recommend ranked by it still returns k items the user has not rated."""

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.stream.ranker_mix import RankerMix, RecentCounts
from sketchrec.stream.recommender import Recommender

N_ITEMS, EVENTS = 200, 300


def play(mix: RankerMix, personal: bool, seed: int) -> RankerMix:
    """EVENTS relevant events over N_ITEMS candidates. The item is drawn by its popularity (Zipf
    counts) or by the user's taste, which the model's score shows through noise either way."""
    rng = np.random.default_rng(seed)
    counts = rng.zipf(1.5, N_ITEMS).astype(float)
    for _ in range(EVENTS):
        taste = rng.normal(size=N_ITEMS)
        model = taste + 0.5 * rng.normal(size=N_ITEMS)
        logits = 3 * taste if personal else np.log(counts)
        p = np.exp(logits - logits.max())
        target = int(rng.choice(N_ITEMS, p=p / p.sum()))
        mix.update(mix.hits(model, [counts], target))
    return mix


def test_weight_moves_to_popularity_where_it_finds_the_items():
    for seed in range(3):
        mix = play(RankerMix(decays=()), personal=False, seed=seed)
        model_alone, popularity_alone = mix.weights[:2]
        assert model_alone < 0.01 < popularity_alone and mix.blend[0] < 1 / 3


def test_weight_moves_to_the_model_where_it_finds_the_items():
    for seed in range(3):
        mix = play(RankerMix(decays=()), personal=True, seed=seed)
        model_alone, popularity_alone = mix.weights[:2]
        assert model_alone > 0.8 and popularity_alone < 0.01 and mix.blend[0] > 0.9


def test_recent_counts_forget_old_ratings():
    recent = RecentCounts((0.9, 1.0))
    recent.add(np.zeros(10, dtype=np.int64), 10)          # item 0 rated 10 times, then ...
    recent.add(np.ones(3, dtype=np.int64), 100)           # ... 100 ratings, 3 of them item 1
    short, forever = recent.counts
    assert short[1] > short[0] and forever.tolist() == [10.0, 3.0]


def test_recommend_after_feedback_returns_k_unseen_items():
    rng = np.random.default_rng(7)
    rec = Recommender(SketchMF(capacity=300, dim=8), pair_capacity=50_000, refresh_s=0.0)
    users, items = rng.integers(0, 60, 6000), rng.zipf(1.3, 6000) % 150
    ratings = np.where(rng.random(6000) < 0.6, 5.0, 2.0)
    for lo in range(0, 6000, 50):
        rec.learn_many(users[lo:lo + 50], items[lo:lo + 50], ratings[lo:lo + 50])
        rec.item_snapshot()   # rebuilt when stale: popularity read, feedback against it
        rec.ranking._next_feedback = 0.0   # every batch fed back (not rate-limited here)
    assert rec.ranking.mix.events > 50
    for user in range(60):
        top, source = rec.recommend(user, 5)
        rated = set(items[users == user].tolist())
        assert source == "model" and len(top) == 5 and not rated & {i for i, _ in top}
        assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)


def test_a_dp_model_ranks_by_its_scores_alone():
    """Under central DP /recommend's scores are the release: no exact popularity may move them.
    The same recommender without DP (the broken variant) does blend popularity in."""
    from sketchrec.models.private.dp_sgd import DPConfig
    rng = np.random.default_rng(3)
    users, items = rng.integers(0, 40, 4000), rng.zipf(1.3, 4000) % 120
    ratings = np.where(rng.random(4000) < 0.6, 5.0, 2.0)
    served = {}
    for private in (False, True):
        dp = DPConfig(noise_multiplier=1.0) if private else None
        rec = Recommender(SketchMF(capacity=200, dim=8, dp=dp), pair_capacity=50_000, refresh_s=0.0)
        for lo in range(0, 4000, 50):
            rec.learn_many(users[lo:lo + 50], items[lo:lo + 50], ratings[lo:lo + 50])
            rec.item_snapshot()
            rec.ranking._next_feedback = 0.0
        rec._snapshot = None   # a snapshot of the model as it is now
        rec.item_snapshot()
        top, _ = rec.recommend(5, 10)
        scores = rec.model.score_items(5, np.array([i for i, _ in top]))
        served[private] = np.allclose([s for _, s in top], scores, atol=1e-4)
    assert served == {False: False, True: True}


def test_per_row_counts_follow_their_items_when_the_catalogue_is_compacted():
    """After a compaction renumbers the rows, an item kept carries its all-time and recent counts
    to its new row and an item new to the catalogue starts from nothing; the state never holds
    more rows than the catalogue."""
    from sketchrec.stream.served_ranking import ServedRanking
    ranking = ServedRanking()
    keys = np.array([11, 22, 33, 44], dtype=np.uint64)
    ranking.popularity(np.array([5.0, 1.0, 9.0, 2.0]), 17, keys)
    before = ranking.recent.counts.copy()
    compacted = np.array([33, 11, 55], dtype=np.uint64)   # 22 and 44 evicted, 55 new
    counts = ranking.popularity(np.array([9.0, 5.0, 3.0]), 17, compacted)
    assert counts[0].tolist() == [9.0, 5.0, 3.0]
    # nothing was learned in between: the kept items' recent counts are unchanged
    assert np.allclose(counts[1:, :2], before[:, [2, 0]])
    assert np.allclose(counts[1:, 2], 3.0)   # the new item's count, all of it recent
    assert ranking.recent.counts.shape[1] == 3 and ranking.nbytes > 0
