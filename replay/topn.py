"""Prequential top-N: at a seeded sample of the stream's positions, a rating >= 4 is held out of
the ranking it is scored on. Just before that rating is learned, the model ranks every item of
the catalogue so far (items seen in the stream before it) that the user has not rated yet, and
so does a popularity ranker (items by their count of ratings so far); recall@10 is the share of
events whose item is in the top 10, NDCG@10 the mean of 1 / log2(1 + rank) over them (0 past 10).
The served ranking (``models.ranking.RankerMix``, as /recommend ranks) is scored on the same
events, each of which is then its feedback (prequential: scored before it learns from it).

Ties are broken at random, in expectation: an item tied with t others below g better ones has
rank g+1 ... g+t+1 with equal chances, so a constant score ranks nothing (no order of ids
helps either ranker). An item never seen before the event cannot be recommended: a miss for both.

Evaluation never changes what the model learns: the batch is cut at the events and learned in
order, piece by piece (the model's learning is sequential; only the privacy monitor's probe
points follow the cuts).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Callable

import numpy as np

from sketchrec.data import Ratings
from sketchrec.stream.ranker_mix import RankerMix, RecentCounts
from sketchrec.privacy.audit import is_canary, real_rows

K = 10
THRESHOLD = 4.0      # a rating >= this is a relevant item
EVENTS = 2_000       # default sample: events scored per run


def expected_hit_gain(greater: int, ties: int, k: int = K) -> tuple[float, float]:
    """(P(rank <= k), E[1 / log2(1 + rank)] over ranks <= k) of an item ranked below ``greater``
    items and tied with ``ties`` others, ties broken uniformly at random.

    >>> expected_hit_gain(0, 0)          # first: hit, gain 1
    (1.0, 1.0)
    >>> expected_hit_gain(10, 0)         # 11th: a miss
    (0.0, 0.0)
    >>> round(expected_hit_gain(2, 0)[1], 4)   # 3rd: 1 / log2(4)
    0.5
    >>> [round(x, 4) for x in expected_hit_gain(9, 1)]   # 10th or 11th: (1 / log2(11)) / 2
    [0.5, 0.1445]
    """
    ranks = np.arange(greater + 1, min(greater + ties + 1, k) + 1)
    return len(ranks) / (ties + 1), float(np.sum(1.0 / np.log2(ranks + 1)) / (ties + 1))


def rank_counts(scores: np.ndarray, target: int) -> tuple[int, int]:
    """(items scoring above ``scores[target]``, other items scoring the same)."""
    s = scores[target]
    return int(np.count_nonzero(scores > s)), int(np.count_nonzero(scores == s)) - 1


def sample_positions(total: int, size: int, seed: int, ratings: np.ndarray | None = None,
                     threshold: float = THRESHOLD) -> np.ndarray:
    """Sorted stream positions to score: ``size`` of those whose rating >= ``threshold`` when the
    ratings are known in advance (a file), else ``size`` of all positions (the ones below the
    threshold are then passed over: fewer events)."""
    rng = np.random.default_rng([seed, 22])
    pool = np.flatnonzero(ratings >= threshold) if ratings is not None else np.arange(total)
    return np.sort(rng.choice(pool, size=min(size, len(pool)), replace=False))


def scorer_of(model) -> Callable[[object, np.ndarray], np.ndarray]:
    """``model.score_items(user, items)`` (unclipped scores of many items for one user), else
    unclipped ``predict_many`` of the user beside each item."""
    if hasattr(model, "score_items"):
        return model.score_items
    return lambda user, items: model.predict_many(np.full(len(items), user, dtype=object), items,
                                                  clip=False)


class TopN:
    """Scores the sampled events of a stream while the stream is learned (``learn``)."""

    def __init__(self, scorer, positions: np.ndarray, k: int = K, threshold: float = THRESHOLD,
                 mix: RankerMix | None = None):
        self.score = scorer_of(scorer)
        self.mix = mix if mix is not None else RankerMix()   # the served ranking, learned here
        self.positions, self.k, self.threshold = np.asarray(positions, dtype=np.int64), k, threshold
        self.seen = 0                      # stream position of the next rating
        self.codes: dict = {}              # item id -> code, in order of first rating
        self.ids = np.empty(0, dtype=object)   # item ids by code
        self.counts = np.zeros(1024, dtype=np.int64)   # ratings so far per item code
        self.rated: defaultdict = defaultdict(set)      # user -> item codes rated so far
        self.model = np.zeros(2)           # sums of hits and gains
        self.popular = np.zeros(2)
        self.served = np.zeros(2)
        self.grid_hits = np.zeros(len(self.mix.grid))   # each ranker's hits, for the report
        self.recent = RecentCounts(self.mix.decays)     # the served ranking's recent popularity
        self.events = self.new_items = 0
        self.seconds = 0.0

    def learn(self, learner, batch: Ratings) -> np.ndarray:
        """``learner.learn_many`` over the batch, cut before each sampled event, which is scored
        first; the predictions made for the whole batch."""
        lo, hi = np.searchsorted(self.positions, [self.seen, self.seen + len(batch)])
        cuts = (self.positions[lo:hi] - self.seen).tolist()
        out, start = [], 0
        for cut in cuts + [len(batch)]:
            if cut > start:
                part = batch.take(slice(start, cut))
                out.append(learner.learn_many(part.users, part.items, part.ratings))
                self._remember(part)
                start = cut
            if cut < len(batch):
                self._score(batch.users[cut], batch.items[cut], batch.ratings[cut])
        self.seen += len(batch)
        return np.concatenate(out) if out else np.empty(0)

    def _remember(self, part: Ratings) -> None:
        t0 = time.perf_counter()
        keep = real_rows(part.users)   # audit canaries are not users
        users, items = part.users[keep].tolist(), part.items[keep].tolist()
        codes, new = [], []
        for item in items:
            code = self.codes.get(item)
            if code is None:
                code = self.codes[item] = len(self.codes)
                new.append(item)
            codes.append(code)
        if new:
            if not len(self.ids):   # numeric ids stay an int64 array; others are objects
                self.ids = self.ids.astype(np.int64 if part.items.dtype.kind in "iu" else object)
            self.ids = np.concatenate([self.ids, np.array(new, dtype=self.ids.dtype)])
        if len(self.codes) > len(self.counts):
            self.counts = np.pad(self.counts, (0, 2 * len(self.codes)))
        np.add.at(self.counts, codes, 1)
        self.recent.add(np.array(codes, dtype=np.int64), len(codes))
        for user, code in zip(users, codes):
            self.rated[user].add(code)
        self.seconds += time.perf_counter() - t0

    def _score(self, user, item, rating: float) -> None:
        if rating < self.threshold or is_canary(np.array([user], dtype=object))[0]:
            return
        t0 = time.perf_counter()
        self.events += 1
        code = self.codes.get(item)
        if code is None:   # not in the catalogue yet: nothing can recommend it
            self.new_items += 1
        else:
            user = user.item() if isinstance(user, np.generic) else user
            unrated = np.ones(len(self.codes), dtype=bool)
            unrated[list(self.rated.get(user, ()))] = False
            unrated[code] = True   # a re-rated item is still the one to find
            candidates = np.flatnonzero(unrated)
            target = int(np.searchsorted(candidates, code))
            scores = self.score(user, self.ids[candidates])
            self.model += expected_hit_gain(*rank_counts(scores, target), self.k)
            self.popular += expected_hit_gain(*rank_counts(self.counts[candidates], target), self.k)
            recent = self.recent.counts
            if recent.shape[1] < len(self.codes):
                recent = np.pad(recent, ((0, 0), (0, len(self.codes) - recent.shape[1])))
            counts = np.vstack([self.counts[candidates], recent[:, candidates]])
            # the served ranking as it stood before this event, then the event is its feedback
            self.served += expected_hit_gain(*rank_counts(self.mix.scores(scores, counts), target),
                                             self.k)
            hits = self.mix.hits(scores, counts, target, self.k)
            self.grid_hits += hits
            self.mix.update(hits)
        self.seconds += time.perf_counter() - t0

    def result(self) -> dict:
        """{recall_at_10, ndcg_at_10, popularity: {...}, events, new_item_events, seconds, ...}
        (NaN figures when no event was scored)."""
        model, popular, served = (sums / self.events if self.events else np.full(2, math.nan)
                                  for sums in (self.model, self.popular, self.served))
        names = (f"recall_at_{self.k}", f"ndcg_at_{self.k}")
        best = int(np.argmax(self.grid_hits))
        return {**dict(zip(names, model.tolist())), "popularity": dict(zip(names, popular.tolist())),
                "served": {**dict(zip(names, served.tolist())), "blend": self.mix.blend.round(4).tolist(),
                           "best_ranker": self.mix.grid[best].round(4).tolist(),
                           f"best_ranker_recall_at_{self.k}": self.grid_hits[best] / max(self.events, 1),
                           "signals": ["model", "popularity"] + [f"popularity decay {d:g}"
                                                                 for d in self.mix.decays]},
                "events": self.events, "new_item_events": self.new_items,
                "sampled_positions": int(len(self.positions)), "threshold": self.threshold,
                "seconds": self.seconds}
