"""How well a fleet learns against one learner on the same stream (``sketchrec bench fleet
--accuracy``), in one process without a broker: the fleet's prequential RMSE over one learner's,
for the default learner, for DP-SGD at a given epsilon, for the default learner on a local-DP
topic and for the sketch alone (the learner whose CPU `bench fleet` measures), over several
streams and seeds, so that
a claim like "within 1 %" is a mean and a spread, not one run.

The fleet is ``m`` replicas of one recommender (``DeltaTracker``), each learning the ratings of its
users (user id mod ``m``: a topic keyed by user gives a member whole users), as a member does: a
chunk of ``every`` of its own ratings in one call (``every``: the members' default sync interval,
``pace.sync_interval``), then it takes its delta and refreshes its held slots; once every member
has, each applies the others' deltas. One learner learns the stream in calls of ``ONE_CHUNK``
ratings (a plain `consume` learns a poll at a time). Each rating's prediction is the one made
before it was learned, by whoever learned it.

DP: every member and the one learner run DP-SGD with the noise a fleet member runs (the whole
pass's budget on the steps, no private fallback: ``cli.fleet.fleet_dp``), so the ratio isolates
what the fleet changes (each member's noisy steps are over its own chunks; every step's noise
reaches every replica through the deltas). The noise is seeded (``debug_noise_seed``, distinct
per member and per seed) so that a run can be repeated: a measurement, never a private model.

LDP: the stream's ratings are perturbed as the devices of a local-DP topic perturb them
(``privacy.ldp``: Bounded Laplace at ``LDP_EPSILON``, on the ratings' range), once per stream and seed,
and the fleet and the one learner (both the default learner) learn the same perturbed ratings;
each prediction is scored as `consume` serves it by default (not mapped back: no
``--ldp-debias``) against the raw rating. The devices' noise is seeded too (a measurement: no
guarantee).

>>> data = SyntheticStream(3000, n_users=60, n_items=40, seed=0).all()
>>> out = fleet_vs_one(data, "mix", 2, every=500, seed=0)
>>> sorted(out), 0.9 < out["ratio"] < 1.1
(['fleet_rmse', 'one_rmse', 'ratio'], True)
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sketchrec.data import Ratings
from sketchrec.models.registry import DP_DEFAULTS
from sketchrec.synthetic import SyntheticStream

# the default learner, DP-SGD, the default learner on an LDP topic, and the sketch alone (the
# learner of `bench fleet`'s CPU figures)
KINDS = ("mix", "dp", "ldp", "sketch")
MEMBERS = (2, 4)
SEEDS = (0, 1, 2)
EPSILON = 1.0
# an LDP topic's epsilon per rating: at 1 the perturbed ratings carry so little signal that one
# pass learns little beyond the biases, and members that never apply each other's deltas came as
# close to one learner as the fleet (synthetic streams, 3 seeds): the comparison could not see a
# broken sync. At 4 it can (tests/benchmarks/test_fleet_accuracy.py)
LDP_EPSILON = 4.0
ONE_CHUNK = 10_000   # ratings per learn call of the one learner


def model(kind: str, capacity: int, seed: int, noise_seed: int = 0, epsilon: float = EPSILON):
    """A fresh model of ``kind``: "mix" is the default learner (``Experts`` with its default
    members, as `consume` builds it without options; "ldp" learns with it too, from perturbed
    ratings: ``_given``), "bias" its bias baseline alone, "sketch" the
    sketch alone (`--model sketch`); "dp" is the sketch with DP-SGD at
    ``epsilon`` (rating unit, DP defaults) as a fleet member runs it, its noise seeded by
    ``noise_seed`` (reproducible: no guarantee)."""
    from sketchrec.models import SketchMF
    from sketchrec.models.mix import Experts
    if kind in ("mix", "ldp"):
        return Experts(capacity=capacity, seed=seed)
    if kind == "bias":   # mix's first member alone
        from sketchrec.models.bias_baseline import BiasBaseline
        return BiasBaseline(capacity=capacity, seed=seed)
    if kind == "sketch":   # `--model sketch`, the learner of `bench fleet`'s CPU figures
        return SketchMF(capacity=capacity, seed=seed)
    if kind != "dp":
        raise ValueError(f"kind must be one of {KINDS} or bias")
    from sketchrec.models.private.dp_sgd import DPConfig
    from sketchrec.privacy.budget import stream_noise_multiplier
    sigma = 0.0 if math.isinf(epsilon) else stream_noise_multiplier(epsilon, DP_DEFAULTS["delta"], 1,
                                                                    fallback_share=0.0)
    dp = DPConfig(noise_multiplier=sigma, clip=DP_DEFAULTS["clip"], batch_size=DP_DEFAULTS["batch"],
                  rating_range=(0.5, 5.0), debug_noise_seed=noise_seed, fallback_share=0.0)
    return SketchMF(capacity=capacity, dim=DP_DEFAULTS["dim"], lr=DP_DEFAULTS["lr"], reg=DP_DEFAULTS["reg"],
                    seed=seed, dp=dp)


def default_every(m: int, model) -> int:
    """The members' default sync interval (ratings of one member per take) in a fleet of ``m``
    learners like ``model``: a DP model's in whole noisy batches, the others' by their kind's
    drift budget (``pace.budget``)."""
    from sketchrec.stream.fleet.pace import budget, sync_interval
    dp = getattr(model, "dp", None)
    return sync_interval(m, dp.batch_size if dp is not None else None, budget(type(model).__name__))


def _recommender(data: Ratings, kind: str, seed: int):
    from sketchrec.stream.recommender import Recommender
    return Recommender(model(kind, data.n_ids(), seed, noise_seed=1000 * seed), pair_capacity=4 * len(data))


def _rmse(predictions: np.ndarray, data: Ratings) -> float:
    return float(np.sqrt(np.mean((predictions - data.ratings) ** 2)))


def _given(data: Ratings, kind: str, seed: int) -> np.ndarray:
    """The ratings the learners of ``kind`` learn: an LDP topic's perturbed ones (the same for
    every learner at ``seed``), any other kind's as they are."""
    if kind != "ldp":
        return data.ratings
    from sketchrec.privacy.ldp import DeviceRandomiser
    devices = DeviceRandomiser(LDP_EPSILON, float(data.ratings.min()), float(data.ratings.max()),
                               seed=10_007 + seed)
    return devices.perturb(data.ratings)


def one_learner(data: Ratings, kind: str, seed: int = 0) -> float:
    """The prequential RMSE of one learner of ``kind`` over ``data``, learned in chunks of
    ``ONE_CHUNK`` (a plain `consume` learns a poll at a time)."""
    rec, predictions = _recommender(data, kind, seed), np.empty(len(data))
    ratings = _given(data, kind, seed)
    for start in range(0, len(data), ONE_CHUNK):
        rows = slice(start, start + ONE_CHUNK)
        predictions[rows] = rec.learn_many(data.users[rows], data.items[rows], ratings[rows])
    return _rmse(predictions, data)


def fleet(data: Ratings, kind: str, m: int, every: int | None = None, seed: int = 0,
          paced: bool = True, composed: bool = True) -> float:
    """The prequential RMSE of a fleet of ``m`` members of ``kind`` over ``data``, each learning
    and publishing every ``every`` of its own ratings (default: the members' default interval),
    shortened as a member's by its hot items (``stream.fleet.pace``) unless not ``paced``, its
    count-weighted moves composed as a member's are (``stream.fleet.compose``) unless not
    ``composed`` (the plain sum)."""
    from sketchrec.stream.fleet.pace import HotItems, full_refresh_ratings
    from sketchrec.stream.fleet.tracker import DeltaTracker
    recs = [_recommender(data, kind, seed) for _ in range(m)]
    default = every or default_every(m, recs[0].model)
    trackers = [DeltaTracker(rec, member=f"m{k}") for k, rec in enumerate(recs)]
    for tracker in trackers:
        tracker.fleet_size(m if composed else 1)
        tracker.refresh_every(full_refresh_ratings(default, m))   # as a member's pace sets it
    hot = [HotItems(rec, tracker, private=kind == "dp") for rec, tracker in zip(recs, trackers)]
    for k, rec in enumerate(recs):
        # each member's own noise, as fresh entropy gives it (the same seed would draw the same
        # noise at the same fleet-wide step count), set once the tracker has taken the model's
        # parameters: every member's deltas are those of one fleet's model. A debug noise seed
        # also derives a private model's id key (privacy.keys): the key is drawn first, from the
        # seed all members share, as a fleet's members adopt the first snapshot's key (keyed
        # apart, a member's deltas would land on other ids' cells at every other replica)
        if getattr(rec.model, "dp", None) is not None:
            rec.model.id_keys = recs[0].model.id_keys
            rec.model.dp = replace(rec.model.dp, debug_noise_seed=1000 * seed + k + 1)
    users, items, ratings = data.users, data.items, _given(data, kind, seed)
    parts = [np.flatnonzero(users.astype(np.int64) % m == k) for k in range(m)]
    predictions, start = np.empty(len(data)), 0
    while start < max(map(len, parts)):
        # the rounds are in step here: the shortest interval any member's pace asks for
        size = min(h.bound(default, m) for h in hot) if paced else default
        blobs = []
        for rec, tracker, part in zip(recs, trackers, parts):
            mine = part[start:start + size]
            if len(mine):
                predictions[mine] = rec.learn_many(users[mine], items[mine], ratings[mine])
            blobs.append(tracker.take())
            tracker.ready()
        for k, tracker in enumerate(trackers):
            for j, blob in enumerate(blobs):
                if j != k and blob:
                    tracker.apply(blob)
            tracker.ready()
        start += size
    return _rmse(predictions, data)


def fleet_vs_one(data: Ratings, kind: str, m: int, every: int | None = None, seed: int = 0,
                 one_rmse: float | None = None) -> dict:
    """``fleet`` and ``one_learner`` (unless ``one_rmse`` is given) over ``data``, and their ratio."""
    one_rmse = one_learner(data, kind, seed) if one_rmse is None else one_rmse
    fleet_rmse = fleet(data, kind, m, every, seed)
    return {"fleet_rmse": fleet_rmse, "one_rmse": one_rmse, "ratio": fleet_rmse / one_rmse}


def streams(path: str | None, seed: int) -> dict[str, Ratings]:
    """The streams measured at ``seed``: ML-100k in time order (``path``, the same for every
    seed: the seed then moves only the hashing and the start vectors), a synthetic stream of
    4,000 users and 1,500 items (15 ratings per id on average), and a sparse one (60,000 ratings
    over 20,000 users and 10,000 items: 4 ratings per id, most ids never reach a heavy slot)."""
    out = {}
    if path is not None:
        from sketchrec.data import read_ratings
        from sketchrec.stream.kafka.producer import order_for_topic
        out["ml-100k"] = order_for_topic(read_ratings(path)[0])
    out["synthetic"] = SyntheticStream(60_000, n_users=4_000, n_items=1_500, seed=seed).all()
    out["sparse"] = SyntheticStream(60_000, n_users=20_000, n_items=10_000, seed=seed).all()
    return out


def summary(ratios: list[float]) -> dict:
    """Mean, sample standard deviation, min and max of ``ratios`` (and the ratios)."""
    r = np.asarray(ratios, dtype=float)
    return {"mean": float(r.mean()), "sd": float(r.std(ddof=1)) if len(r) > 1 else 0.0,
            "min": float(r.min()), "max": float(r.max()), "ratios": [round(float(x), 6) for x in r]}


def accuracy(path: str | None, kinds=KINDS, members=MEMBERS, seeds=SEEDS, every: int | None = None,
             say=print) -> dict:
    """``fleet_vs_one`` for every kind, fleet size, stream and seed (``every``: the members'
    interval, default theirs): per kind and size, each stream's ratios summarised, and all of
    them together (``"all"``)."""
    runs: dict = {kind: {str(m): {} for m in members} for kind in kinds}
    for seed in seeds:
        for name, data in streams(path, seed).items():
            for kind in kinds:
                one = one_learner(data, kind, seed)
                for m in members:
                    got = fleet_vs_one(data, kind, m, every, seed, one_rmse=one)
                    runs[kind][str(m)].setdefault(name, []).append(got["ratio"])
                    say(f"accuracy {kind:3s} M={m} {name:9s} seed {seed}: fleet {got['fleet_rmse']:.4f}, "
                        f"one learner {one:.4f} ({100 * (got['ratio'] - 1):+.2f}%)", flush=True)
    return {kind: {m: {**{name: summary(r) for name, r in by.items()},
                       "all": summary([x for r in by.values() for x in r])}
                   for m, by in sizes.items()} for kind, sizes in runs.items()}
