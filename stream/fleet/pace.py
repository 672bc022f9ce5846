"""How often a fleet member syncs: the default interval (``sync_interval``, whole noisy batches for a
DP-SGD model: ``noisy_batch``), and shorter when some items are rated far more often than others.

Replicas add the members' changes. A rule that moves an id part of the way to its target at every
rating (the bias baseline's capped running mean moves it by 1/32 of its error, an SGD or AdaGrad
step by its rate) is stable when one learner applies it rating after rating; applied by M members
at once from the same stale copy, the M moves add up. An item rated k times by each member between
two syncs moves by about 1 - (1 - 1/32)^k of its error at each of them: once the members' fractions
sum past 2 it overshoots by more than its error and the overshoot grows every round (in one process,
four members of the default learner on a Zipf-skewed stream diverged this way at a fixed
interval). A member composes the count-weighted moves (``compose``: the bias baseline's) and its
factor model's item biases (``compose_biases``): it scales its own change so that the M members'
sum to one learner's, and those no longer overshoot. What is left uncomposed, the vectors' SGD and
AdaGrad steps, overshoots only where a few items take a large share of the ratings (four members
of the sketch, a fixed interval, 20 items: the hottest a fifth of the ratings, ran away from one
learner; paced, they stayed close to it). Two members cannot (each fraction is below
1), so the bound below only applies from three members on: a member syncs before its hottest item
can take more than ``HOT_STEPS`` / M steps since its last take, measured on the interval before
(the interval adapts to the stream's skew).
Users need no bound when the topic is keyed by user (one member learns all of a user's ratings).
A DP model is left alone: a shorter interval would cut its noisy steps' batches, adding noise.

>>> from types import SimpleNamespace
>>> tracker = SimpleNamespace(seq=0)
>>> hot = HotItems(SimpleNamespace(observers=[]), tracker)
>>> hot.observe(None, np.array([7] * 40 + list(range(100, 1060))), None)   # item 7: 40 of 1,000
>>> hot.bound(666, members=4)                                 # no finished interval yet
666
>>> tracker.seq = 1                                           # a take
>>> hot.observe(None, np.arange(10), None)
>>> hot.bound(666, members=4), hot.bound(666, members=2)      # 16 steps of item 7 per member
(400, 666)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

ALONE = 20         # a member holding every partition syncs every ALONE x sync_ratings (or sync_ms)
SYNC_RATINGS = 500     # the default sync interval's floor (ratings of one member)


class Budget(NamedTuple):
    """How far a model kind's members may drift apart. ``drift``: from three members on, the
    others' ratings a member learns without ((M - 1) x its interval); drift / (M - 1) keeps that
    constant as M grows (a fixed interval at every M is cheaper, but the members' summed steps
    overshot: docs/fleet.md). ``pair``: two members' interval; each one's fraction of a
    count-weighted move stays below 1, so their summed steps cannot overshoot (module docstring)
    and only staleness bounds it. Each is what a kind's merges tolerate, measured by
    `sketchrec bench fleet --accuracy` on its streams and seeds (the shortest: 60,000 ratings):
    with its item biases composed the sketch alone takes twice the default learner's drift, whose
    AdaGrad factor member falls behind sooner (the staleness of its per-id rates, not an
    overshoot, is what is left there)."""

    drift: int
    pair: int


BUDGET = Budget(drift=3_000, pair=6_000)
KIND_BUDGETS = {"SketchMF": Budget(drift=6_000, pair=8_000)}
# a DP-SGD fleet syncs every DP_SYNC_RATINGS at any M, in whole noisy batches (sync_interval)
DP_SYNC_RATINGS = 2_000
# held slots' full refresh: every FULL_REFRESH_SYNCS x the drift a member's interval allows
# (full_refresh_ratings)
FULL_REFRESH_SYNCS = 8
# twice the bias baseline's running-mean length (horizon + 1 + damping): with its moves composed,
# what the bound still keeps in check is the factor member's steps (docs/fleet.md)
HOT_STEPS = 64
FLOOR = 100      # ratings: the shortest interval the bound sets


class HotItems:
    """Counts the items a member learns between takes (``recommender.observers``: by the keys
    the learner made of them) and bounds its sync interval from three members on (module docstring).

    Parameters
    ----------
    recommender : the member's ``Recommender`` (its ``observers`` get this counter).
    tracker : its ``DeltaTracker`` (a take is seen as its ``seq`` moving on).
    private : a DP model: no bound.

    Examples
    --------
    See the module docstring.
    """

    def __init__(self, recommender, tracker, private: bool = False):
        self.tracker, self.private = tracker, private
        self.seq, self.items, self.rate = tracker.seq, [], None
        if not private:
            recommender.observers.append(self.observe)

    def observe(self, ukeys, ikeys: np.ndarray, real) -> None:
        """A batch just learned: its items' keys (as the learner made them: one poll's ids may be
        integers and the next one's text, and 12 and "12" are one key) counted towards the current
        interval (the interval before is summed up first, once the tracker has taken it)."""
        if self.tracker.seq != self.seq:
            self.seq, counted, self.items = self.tracker.seq, self.items, []
            if counted:
                keys = np.concatenate(counted)
                # steps of the hottest item per rating of the interval
                self.rate = np.unique(keys, return_counts=True)[1].max() / len(keys)
        self.items.append(ikeys.copy())   # the learner's keys: kept until the next take

    def bound(self, every: int, members: int) -> int:
        """``every`` (the member's interval), shortened so that no item can take more than
        ``HOT_STEPS`` / ``members`` steps at this member between two takes; at least ``FLOOR``."""
        if self.private or members < 3 or self.rate is None:
            return every
        return int(min(every, max(FLOOR, HOT_STEPS / members / self.rate)))


def budget(kind: str) -> Budget:
    """The drift budget of a model kind (its class name): ``KIND_BUDGETS``, else ``BUDGET``.

    >>> budget("SketchMF").drift, budget("Experts").drift
    (6000, 3000)
    """
    return KIND_BUDGETS.get(kind, BUDGET)


def sync_interval(members: int, dp_batch: int | None = None, allowed: Budget = BUDGET) -> int:
    """The default sync interval (ratings of one member) in a fleet of ``members`` learners:
    the model's ``allowed`` drift (``budget``) / (M - 1), at least ``SYNC_RATINGS``; its ``pair``
    interval for two members; ``ALONE`` x ``SYNC_RATINGS`` alone.
    A DP-SGD model (``dp_batch``: ratings per noisy step) syncs every ``DP_SYNC_RATINGS`` whatever
    M, rounded up to whole batches: an interval cut short of a batch cuts a noisy step short, and
    the same noise over fewer ratings costs more accuracy than the members' drift (docs/fleet.md).

    >>> sync_interval(1), sync_interval(2), sync_interval(4), sync_interval(4, allowed=budget("SketchMF"))
    (10000, 6000, 1000, 2000)
    >>> sync_interval(4, dp_batch=1000), sync_interval(2, dp_batch=1500), sync_interval(1, dp_batch=1000)
    (2000, 3000, 10000)
    """
    if members <= 1:
        return ALONE * SYNC_RATINGS
    if dp_batch:
        return -(-max(DP_SYNC_RATINGS, dp_batch) // dp_batch) * dp_batch
    if members == 2:
        return allowed.pair
    return max(SYNC_RATINGS, allowed.drift // (members - 1))


def full_refresh_ratings(every: int, members: int) -> int:
    """Ratings learned or applied between two full refreshes of a fleet member's held slots
    (``deltas.ModelReplica.refresh_every``), for a member syncing every ``every`` of its own
    ratings among ``members``: ``FULL_REFRESH_SYNCS`` x the others' ratings it learns without at
    that interval ((M - 1) x ``every``, the drift the interval allows). Between refreshes a held
    row lags what collisions moved in its cells, which grows with the ratings learned or applied:
    a bound proportionate to the drift the fleet already accepts. At the default intervals
    (``sync_interval``) ``FULL_REFRESH_SYNCS`` x the model's drift budget for every M from 3 on
    (while the floor does not bind), so a larger fleet does not refresh more often per rating;
    a shorter ``--sync-ratings`` shortens it (at M = 2, every
    ``FULL_REFRESH_SYNCS`` takes and applies whatever the interval). The replica waits at least
    ``deltas.REFRESH_SLOT_RATINGS`` per held slot as well: what a refresh costs grows with the model.

    >>> full_refresh_ratings(4000, 2), full_refresh_ratings(1000, 4), full_refresh_ratings(200, 2)
    (32000, 24000, 1600)
    >>> full_refresh_ratings(10_000, 1)   # alone: its own takes only
    80000
    """
    return FULL_REFRESH_SYNCS * every * max(1, members - 1)


def noisy_batch(model, fleet_dp: dict | None) -> int | None:
    """Ratings per noisy step of a DP fleet's model (``fleet_dp``: the fleet's DP terms, None in a
    fleet without DP-SGD), which ``sync_interval`` keeps whole."""
    if not fleet_dp:
        return None
    return int(model.dp.batch_size)   # a DP fleet's model is a DP-SGD learner (cli.fleet builds it)
