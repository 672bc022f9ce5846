"""An online combination of learners over one stream, weighted by their recent prequential error:
exponentially weighted experts (Hedge) with forgetting, so the served prediction stays near the best
member's on every stream and moves to another member after a change-point.

Every member learns every rating (their own prediction made before it, as always). The combined
prediction of rating n is sum_j w_j p_j with w_j proportional to exp(-eta L_j), L_j member j's
squared errors on the ratings before n, discounted by ``forget`` per rating (about 1 / (1 - forget)
recent ratings count): a member that gets worse loses its weight within that window. Squared loss
on a bounded range is exp-concave, so the combination's loss stays within O(log m / eta) of the
best member's over any window of that length (Cesa-Bianchi and Lugosi, "Prediction, Learning, and
Games", ch. 3), and the average of several members is often below all of them.

Memory: the members' own, side by side; ``capacity`` and ``space_gain`` are handed to every
member that takes them, so each sketch is sized as it would be alone and the total is their sum
(``nbytes``, compared with one factor model's in docs/results.md). The privacy
modes (DP-SGD, SGLD, loss clipping) use one learner (``SketchMF``), never a combination.

>>> m = Experts(capacity=40)
>>> [spec["model"] for spec in m.members]
['BiasBaseline', 'SketchMF']
>>> _ = m.learn_many(["ann", "bob"] * 10, ["film", "book"] * 10, [5.0, 2.0] * 10)
>>> round(float(m.weights.sum()), 6), Experts.from_bytes(m.to_bytes()).predict_one("ann", "film") == m.predict_one("ann", "film")
(1.0, True)
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from sketchrec.models._sgd import DIVERGED, LEARNED, clip_to_range, record_rating
from sketchrec.models.base import ADD, ITEM, RANGE, USER, FactorizationModel, StateArray
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.sketch_mf import SketchMF

MEMBER_CLASSES = {"BiasBaseline": BiasBaseline, "SketchMF": SketchMF}

# the default members (measured on ML-100k, ml-latest-small and the change-point stream, see
# docs/results.md): the forgetting bias baseline, and a factor model with AdaGrad steps (one sum
# per id), large and lightly regularised in one pass (the best single learner of one pass
# everywhere measured); over several passes (``plan_epochs``) smaller and regularised more, which
# the multi-epoch grid chose on a split of the training part of both MovieLens sets (lr 0.1 reg
# 0.12: it over-fits at 0.2 / 0.02). The thesis's SGD learner, a member before, gained next to
# nothing anywhere measured once these settings came, for more than half of the time.
DEFAULT_MEMBERS = (
    {"model": "BiasBaseline"},
    {"model": "SketchMF", "optimizer": "adagrad-id", "lr": 0.2, "reg": 0.02,
     "epochs": {"lr": 0.07, "reg": 0.12, "implicit": 64}},
)


@njit(nogil=True, cache=True)
def hedge(preds, ratings, losses, eta, forget, update, stats, counters, out):
    """Combine the members' predictions (m x n) in order, updating their discounted losses on
    the ratings where ``update`` (n booleans) holds."""
    m = preds.shape[0]
    w = np.empty(m)
    for n in range(preds.shape[1]):
        best = losses.min()
        total = 0.0
        for j in range(m):
            w[j] = np.exp(-eta * (losses[j] - best))
            total += w[j]
        acc = 0.0
        for j in range(m):
            acc += w[j] * preds[j, n]
        out[n] = clip_to_range(acc / total, stats)
        # a rating no member can be scored on (e.g. 1e308 with --rating-range none) would make
        # every loss infinite and the weights NaN: it moves none of them
        sane = update[n]
        for j in range(m):
            e = preds[j, n] - ratings[n]
            sane = sane and e * e < DIVERGED * DIVERGED
        for j in range(m):
            if sane:
                e = preds[j, n] - ratings[n]
                losses[j] = forget * losses[j] + e * e
        record_rating(stats, ratings[n])
        counters[LEARNED] += 1


VALIDATION_SLICE = 256
PARALLEL_FROM = 2_000  # ratings in a batch from which the members learn it in parallel threads
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads shared by every combination: the members' kernels release the GIL, so members
    learn a batch at once on as many cores (each member's own order is kept: same results)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   thread_name_prefix="experts")
    return _POOL


def validation_slice(ukeys: np.ndarray, ikeys: np.ndarray) -> np.ndarray:
    """Which (user, item) pairs the members stop learning after the first epoch (1 in
    ``VALIDATION_SLICE``, by a hash of the pair: the same pairs in every epoch)."""
    mixed = (ukeys * np.uint64(0x9E3779B97F4A7C15)) ^ (ikeys * np.uint64(0xC2B2AE3D27D4EB4F))
    return (mixed >> np.uint64(40)) % np.uint64(VALIDATION_SLICE) == 0


class Experts(FactorizationModel):
    """The default learner (public name ``sketchrec.Mix``): members combined by Hedge, weighted
    by their recent prequential error (module docstring). ``weights`` are the current ones.

    Parameters
    ----------
    members : specs ``{"model": class name, **constructor arguments}`` (default ``DEFAULT_MEMBERS``:
        the bias baseline and an AdaGrad sketch model, no per-data-set tuning).
    capacity : distinct users + items expected; sizes every member's sketch (None: their default).
    space_gain : memory per id against a dense model, handed to every member that takes it.
    eta : the weights' sharpness per unit of discounted squared error.
    forget : the per-rating discount of the members' losses (about 1 / (1 - forget) ratings count).
    seed : fixes hashing and start vectors.

    Examples
    --------
    >>> from sketchrec import Mix
    >>> model = Mix(capacity=100, seed=0)
    >>> _ = model.learn_many(["ann", "bob", "ann"], ["up", "up", "heat"], [5.0, 4.0, 2.0])
    >>> [item for item, _ in model.recommend("bob", k=2)]
    ['up', 'heat']
    """

    def __init__(self, members: list[dict] | None = None, capacity: int | None = None,
                 space_gain: float = 1.0, eta: float = 0.1, forget: float = 0.998, seed: int = 0):
        specs = [dict(s) for s in (members or DEFAULT_MEMBERS)]
        self.members_ = [self._build(spec, capacity, space_gain, seed) for spec in specs]
        super().__init__(dim=sum(m.dim for m in self.members_), seed=seed)
        if eta <= 0 or not 0.0 < forget <= 1.0:
            raise ValueError("eta must be positive and forget in (0, 1]")
        self.members, self.capacity, self.space_gain = specs, capacity, float(space_gain)
        self.eta, self.forget = float(eta), float(forget)
        self.losses = np.zeros(len(specs))
        self.dp = None  # the privacy modes use one learner
        self.planned_epochs: int | None = None  # plan_epochs: None, a stream of one pass

    @staticmethod
    def _build(spec: dict, capacity, space_gain, seed):
        cls = MEMBER_CLASSES[spec["model"]]
        args = {k: v for k, v in spec.items() if k not in ("model", "epochs")}
        accepted = inspect.signature(cls.__init__).parameters
        for name, value in (("capacity", capacity), ("space_gain", space_gain), ("seed", seed)):
            if name in accepted and name not in args:
                args[name] = value
        return cls(**args)

    def describe(self) -> str:
        """The members in one line, e.g. ``bias + sketch adagrad lr=0.2 reg=0.02 d=64`` (and
        ``implicit=K`` once a member's epoch settings switch the term on)."""
        def one(spec: dict, model) -> str:
            if spec["model"] == "BiasBaseline":
                return "bias"
            implicit = f" implicit={model.implicit}" if getattr(model, "implicit", 0) else ""
            return f"sketch {model.optimizer} lr={model.lr:g} reg={model.reg:g} d={model.dim}{implicit}"
        return " + ".join(one(s, m) for s, m in zip(self.members, self.members_))

    @property
    def weights(self) -> np.ndarray:
        w = np.exp(-self.eta * (self.losses - self.losses.min()))
        return w / w.sum()

    @property
    def n_skipped_diverged(self) -> int:
        """Ratings some member set aside as diverging (the most of any member)."""
        return max(m.n_skipped_diverged for m in self.members_)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.members_) + self.losses.nbytes + self.stats.nbytes

    def _state_arrays(self) -> dict[str, np.ndarray]:
        return {"losses": self.losses, **{f"member_{j}": np.frombuffer(m.to_bytes(), dtype=np.uint8)
                                          for j, m in enumerate(self.members_)}}

    def state_arrays(self) -> dict[str, StateArray]:
        """The combination's own arrays (the members' discounted loss sums add, as its rating
        statistics and counters do) and every member's, named ``m{j}.{name}``: the members are
        linear sketch structures whose changes add, so replicas of a combination exchange them
        as they would each member's."""
        own = {"losses": StateArray(self.losses, ADD), "stats": StateArray(self.stats, RANGE),
               "counters": StateArray(self.counters, ADD)}
        for j, member in enumerate(self.members_):
            own.update({f"m{j}.{name}": state for name, state in member.state_arrays().items()})
        return own

    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.losses = arrays["losses"]
        self.members_ = [type(m).from_bytes(arrays[f"member_{j}"].tobytes())
                         for j, m in enumerate(self.members_)]

    def hyper(self, epoch: int = 0) -> np.ndarray:
        """The members schedule their own steps: what the combination passes on is the epoch."""
        return np.array([float(epoch)])

    def plan_epochs(self, epochs: int) -> None:
        """Training will take ``epochs`` passes (from epoch 0): with more than one, the members
        never learn a fixed slice of the pairs (one in VALIDATION_SLICE, by hash) before the last
        pass, and the weights follow their errors on it alone (an error on a rating already
        learned rewards fitting the training set); in the last pass they learn it too, each
        slice rating predicted before it is first learned. Members whose spec has ``"epochs"``
        (settings such as ``{"lr": .., "reg": ..}``) take those settings (and keep them). One
        pass (``plan_epochs(1)``, which ``train_epochs`` calls when done) means a stream again."""
        self.planned_epochs = int(epochs) if epochs > 1 else None
        if epochs > 1:
            for spec, member in zip(self.members, self.members_):
                for name, value in spec.get("epochs", {}).items():
                    if name == "lr" and hasattr(member, "steps"):   # the rule carries the rate
                        member.steps = dataclasses.replace(member.steps, lr=value)   # (checkpoints)
                    setattr(member, name, value)

    def _learn_keys(self, ukeys, ikeys, ratings, hp, out) -> None:
        epoch, planned = int(hp[0]), getattr(self, "planned_epochs", None)
        multi = planned is not None and planned > 1
        if epoch == (planned - 1 if multi else 0):
            # every prediction is made before its rating is learned in this pass: one pass
            # scores them all, a planned last pass the slice (learned for the first time)
            preds = np.stack(self._each(lambda m: m.learn_many(ukeys, ikeys, ratings, epoch=epoch),
                                        len(ratings)))
            update = validation_slice(ukeys, ikeys) if multi else np.ones(len(ratings), np.bool_)
        else:
            # before a planned last pass (or after an unplanned first one) the members do not
            # learn the slice, and the weights follow their errors on it alone
            update = validation_slice(ukeys, ikeys)
            preds = np.empty((len(self.members_), len(ratings)))
            learn = np.flatnonzero(~update)

            def one(m):
                return (m.learn_many(ukeys[learn], ikeys[learn], ratings[learn], epoch=epoch),
                        m.predict_many(ukeys[update], ikeys[update]))
            for j, (learned, held) in enumerate(self._each(one, len(ratings))):
                preds[j, learn], preds[j, update] = learned, held
        hedge(preds, ratings, self.losses, self.eta, self.forget, update, self.stats,
              self.counters, out)

    def _each(self, work, n: int) -> list:
        """work(member) for every member: in parallel threads for large batches."""
        if n < PARALLEL_FROM or len(self.members_) == 1:
            return [work(m) for m in self.members_]
        # the calling thread learns the first member (the cheap bias baseline by default) instead
        # of waiting idle: one thread fewer to schedule on a loaded machine
        others = [_pool().submit(work, m) for m in self.members_[1:]]
        return [work(self.members_[0])] + [f.result() for f in others]

    def _predict_keys(self, ukeys, ikeys, clip, out) -> None:
        # the members' kernels on the keys directly (their predict_many would convert and check
        # them again: most of a single /predict's time); the same sum, in the same order
        each = np.empty_like(out)
        out[:] = 0.0
        for wj, m in zip(self.weights, self.members_):
            m._predict_keys(ukeys, ikeys, clip, each)
            out += wj * each
        if clip:
            lo_hi = self.rating_range
            if lo_hi is not None:
                np.clip(out, *lo_hi, out=out)

    def score_items(self, user, items) -> np.ndarray:
        w = self.weights   # keyed here: the members learned the keys this model gave them
        ukey, ikeys = self.id_keys.as_keys(user), self.id_keys.as_keys(items)
        return sum(wj * m.score_items(ukey, ikeys) for wj, m in zip(w, self.members_))

    def item_vectors(self, items) -> np.ndarray:
        """The factor member's item vectors (``similar`` compares these: the bias member has none)."""
        keys = self.id_keys.as_keys(items)
        factor = next(m for m in self.members_ if isinstance(m, SketchMF))
        return factor.factors(keys, ITEM)[0]

    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        """Members' vectors side by side (a user's scaled by the members' weights, so that the dot
        product with an item's is the weighted sum of the members'), biases weighted."""
        keys = self.id_keys.as_keys(ids)
        w = self.weights
        parts = [m.factors(keys, family) for m in self.members_]
        scale = w if family == USER else np.ones_like(w)
        vectors = np.concatenate([s * v for s, (v, _) in zip(scale, parts)], axis=1)
        return vectors, sum(wj * b for wj, (_, b) in zip(w, parts))


# the public name of the default learner (``from sketchrec import Mix``); the class keeps the name
# its checkpoints and saved files record
Mix = Experts
