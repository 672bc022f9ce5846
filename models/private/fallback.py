"""The private fallback of the DP-SGD modes: a DP-SGD model never answers worse than
the private baseline (DP global mean + DP item biases) made under the same budget, and which of
the two answers is itself a DP release.

``DPSGDFallback`` wraps a DP-SGD ``SketchMF`` (everything it does not define is the model's). It
answers with the factor model while a DP test (``privacy.joint_dp.keeps_factors``) finds no
evidence that the baseline is better (holdout: one-sided at 3 noise std, as the joint mode; a
stream: the factor model only while its noisy advantage, recent windows weighted more, is above
one noise std, decided again every window, the baseline before the first), else
with the baseline; ``fallback_figures()`` says which
and why (/privacy, `replay --json`).

Budget (``privacy.joint_dp.FALLBACK_SHARES``; one ledger, composition):
- epoch training (holdout, add/remove): the baseline's mean and item biases and the choice are
  Gaussians of multipliers z / sqrt(share), z the multiplier of one Gaussian worth the target
  epsilon; the DP-SGD steps are calibrated so that everything composed costs the target
  (``privacy.joint_dp.calibrate_epochs``); with a given noise (--dp-noise) z is DP-SGD's own
  step multiplier. All are charged to the run's ledger before the steps.
- a stream pass (replace-one, fixed positions): the fallback's releases are made per window of
  ``window`` stream positions; each rating is in one window, so a pass costs each release's
  Gaussian once (a user's ratings spread over windows compose to the same bound, as DP-SGD's
  steps do, ``models.dp_sgd``) and ``DPConfig.stream_multiplier`` already includes them.

Items are hashed into ``width`` public buckets (the stream's items are not a public catalogue);
noise goes on every bucket, so which items were rated is not revealed. At the user unit the item
statistics are calibrated to the L2 sensitivity sqrt(2m) of m ratings in m distinct buckets; a
user's ratings that share a bucket (a repeated item, or items hashed together) would move that one
bucket by up to (m, m), sqrt(2) m. So each user's whole contribution vector (its per-bucket sums
and counts) is scaled to L2 norm at most sqrt(2m) (``user_weights``; in a stream, over the whole
pass). Scaling rather than calibrating to sqrt(2) m: a user whose ratings fall in distinct buckets
(nearly all of them, with width >> a user's ratings) is untouched, and the noise stays sqrt(m)
times smaller than the worst case would need. The choice compares
errors on the user's own ratings as learned (holdout: the training part; stream: prequential),
never on test data.

>>> from sketchrec.data import SyntheticStream
>>> from sketchrec.models.private.dp_sgd import DPConfig
>>> from sketchrec.models.sketch_mf import SketchMF
>>> data = SyntheticStream(4000, n_users=80, n_items=50, seed=0).all()
>>> model = DPSGDFallback(SketchMF(dim=4, capacity=200, dp=DPConfig(2.0, batch_size=500)), width=256)
>>> bool(np.isfinite(model.learn_many(data.users, data.items, data.ratings)).all())
True
>>> model.fallback_figures()["serving"] in (FACTORS, BASELINE), model.windows
(True, 0)
"""

from __future__ import annotations

import math

import numpy as np

from sketchrec import frame
from sketchrec.models.private.joint_baseline import (Encoded, bias_estimates, capped, noisy_bias_statistics,
                                           release_biases)
from sketchrec.privacy.entropy import noise_generator
from sketchrec.privacy.mode import mode_of
from sketchrec.privacy.joint_dp import (CHOICE_CLIP, FALLBACK_SHARES, fallback_budget,
                                        noisy_choice, stage_noise)
from sketchrec.models.storage import USER
from sketchrec.models.private.fallback_buckets import buckets, user_weights  # noqa: F401 (re-exported)

FACTORS = "DP-SGD factor model (the DP choice found no evidence that the baseline is better)"
BASELINE = ("private baseline: DP mean + DP item biases (fallback: the DP choice found the "
            "factor model clearly worse on the users' own ratings)")
DAMPING = 5.0
MAGIC = b"SKFB"   # the fallback's checkpoint blob (a sketchrec.frame)
WINDOW = 10_000   # stream positions per release of the baseline and the choice (public)
STREAM_MARGIN = 1.0  # noise std of evidence a stream needs to answer from the factor model
DECAY = 0.5       # weight of the choice's running sum at each new window (stream)


class DPSGDFallback:
    """A DP-SGD model with the private baseline and the DP choice between them (module docstring).

    Parameters
    ----------
    model : a ``SketchMF`` built with ``dp=`` (DP-SGD).
    width : item buckets of the private baseline (a public size, e.g. the run's capacity).
    window : ratings per choice between the model and the baseline.

    Examples
    --------
    >>> from sketchrec import DPSGDFallback, SketchMF
    >>> model = DPSGDFallback(SketchMF(dim=4, capacity=100, dp={"noise_multiplier": 1.0}), width=100)
    >>> model.dp.noise_multiplier
    1.0
    """

    def __init__(self, model, width: int, window: int = WINDOW):
        self.__dict__["model"] = model   # set first: attribute reads fall through to it
        self.width, self.window = int(width), int(window)
        self.release = bias_estimates(0.0, 0.0, np.zeros(width), np.zeros(width),
                                      model.dp.rating_range, 0.0)   # the midpoint, no biases
        self.chose_factors, self.choice_sum, self.choice_std = True, 0.0, 0.0
        self.windows, self.position, self.budget = 0, 0, None
        self._totals = [0.0, 0.0, np.zeros(width), np.zeros(width)]
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._counts: dict = {}      # the stream's per-user counts for the user cap
        self._allowance: dict = {}   # the pass's per-user squared norm left (``user_weights``)
        self._sq = {"factors": 0.0, "baseline": 0.0, "served": 0.0, "mean": 0.0, "n": 0}  # exact
        self._step = 0

    def __getattr__(self, name):
        model = self.__dict__.get("model")
        if model is None:
            raise AttributeError(name)
        return getattr(model, name)

    @property
    def dp(self):
        return self.model.dp

    @property
    def privacy_mode(self):
        return self.model.privacy_mode

    @property
    def id_keys(self):
        return self.model.id_keys

    @id_keys.setter
    def id_keys(self, keys) -> None:   # the model's (a restored checkpoint's key)
        self.model.id_keys = keys

    @dp.setter
    def dp(self, config) -> None:   # an epoch plan calibrates the model's noise
        self.model.dp = config

    def _rng(self) -> np.random.Generator:
        self._step += 1
        return noise_generator(self.model.dp.debug_noise_seed, self._step)

    def _noise(self, stage: str, factor: float = 1.0, terms: str | None = None):
        dp = self.model.dp
        return stage_noise(self.budget, stage, dp.unit, dp.user_cap or 1, factor, terms)

    # -- answers -------------------------------------------------------------------------------
    def _buckets(self, items) -> np.ndarray:
        """Buckets of items keyed as the model keys them (its secret id key in a privacy mode)."""
        return buckets(self.model.id_keys.as_keys(items), self.width).astype(np.int64)

    def baseline(self, items) -> np.ndarray:
        """The private baseline's answers (clipped to the public rating range)."""
        return np.clip(self.release.baseline(self._buckets(items)),
                       *self.model.dp.rating_range)

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        if self.chose_factors:
            return self.model.predict_many(users, items, clip=clip)
        return self.baseline(items)

    def score_items(self, user, items) -> np.ndarray:
        if self.chose_factors:
            return self.model.score_items(user, items)
        return self.baseline(items)

    @property
    def private_mean(self) -> float:
        """The released global mean, clipped (the range's midpoint before a release)."""
        return float(np.clip(self.release.mu, *self.model.dp.rating_range))

    @property
    def global_mean(self) -> float:
        return self.model.global_mean if self.chose_factors else float(self.release.mu)

    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        """The chosen model's (vectors, biases): the baseline's are zero vectors, no user biases
        and the item biases (so /recommend ranks by the baseline after a fallback)."""
        vectors, biases = self.model.factors(ids, family)
        if self.chose_factors:
            return vectors, biases
        if family == USER:
            return np.zeros_like(vectors), np.zeros_like(biases)
        bias = self.release.item_bias[self._buckets(ids)]
        return np.zeros_like(vectors), bias.astype(biases.dtype)

    # -- checkpoints -----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The model's bytes and the fallback's released state (noisy totals, the choice). Not the
        window in progress nor the per-user counts: a restart is a new, newly charged pass."""
        meta = {"width": self.width, "window": self.window, "total": self._totals[0],
                "n": self._totals[1], "chose_factors": bool(self.chose_factors),
                "choice_sum": self.choice_sum, "choice_std": self.choice_std, "windows": self.windows}
        return frame.encode(MAGIC, {"meta": meta}, {"model": self.model.to_bytes(),
                                                    "sums": self._totals[2], "counts": self._totals[3]})

    @classmethod
    def from_bytes(cls, blob: bytes) -> "DPSGDFallback":
        from sketchrec.models.sketch_mf import SketchMF  # DP-SGD runs on the sketch only
        got = frame.decode_arrays(blob, MAGIC, "DP fallback")   # np.savez before the frame
        meta, parts = got.header["meta"], got.parts
        out = cls(SketchMF.from_bytes(bytes(parts["model"])), meta["width"], meta["window"])
        out._totals = [meta["total"], meta["n"], parts["sums"], parts["counts"]]
        out.chose_factors, out.choice_sum = meta["chose_factors"], meta["choice_sum"]
        out.choice_std, out.windows = meta["choice_std"], meta["windows"]
        if out.windows:
            dp = out.model.dp
            std = out._noise_of_pass()
            out.release = bias_estimates(*out._totals, dp.rating_range, std * math.sqrt(out.windows),
                                         DAMPING)
        return out

    # -- epoch training (holdout) ----------------------------------------------------------------
    def plan(self, z_total: float) -> list:
        """Set the fallback's multipliers from ``z_total`` (module docstring); its ledger entries."""
        from sketchrec.privacy.joint_dp import fallback_steps
        self.budget = fallback_budget(z_total) if z_total > 0 else None
        return fallback_steps(self.budget) if self.budget else []

    def fit_fallback(self, users, items, ratings) -> dict:
        """After DP-SGD's epochs: release the baseline from the (capped) training part and make
        the DP choice on per-user mean error differences there (add/remove neighbours)."""
        dp = self.model.dp
        ids, uidx = np.unique(np.asarray(users), return_inverse=True)
        enc = Encoded(uidx.astype(np.int64), self._buckets(items),
                      np.asarray(ratings, np.float64), ids, self.width)
        keep = capped(enc.users, dp.user_cap if dp.unit == "user" else None, self._rng())
        weights = None
        if dp.unit == "user":   # each user's contribution vector within the calibrated sqrt(2m)
            weights, _ = self._bounded(enc.users[keep], enc.items[keep], enc.ratings[keep],
                                       np.full(len(ids), 2.0 * dp.user_cap))
        (mean, _), (item_noise, std) = self._noise("mean"), self._noise("biases")
        self.release = release_biases(enc, keep, dp.rating_range, mean, item_noise, std, self._rng,
                                      DAMPING, weights=weights)
        diff = self._differences(users, items, ratings)
        per_user = np.bincount(enc.users, diff, len(ids)) / np.bincount(enc.users, minlength=len(ids))
        noise, self.choice_std = self._noise("choice")
        self.chose_factors, self.choice_sum = noisy_choice(per_user, noise, self.choice_std, self._rng())
        return self.fallback_figures()

    def _bounded(self, users, cells, ratings, allowance) -> tuple[np.ndarray, np.ndarray]:
        """``user_weights`` of these ratings (values clipped and centred as the statistics do)."""
        lo, hi = self.model.dp.rating_range
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        x = np.clip(np.asarray(ratings, np.float64) - mid, -half, half) / half
        return user_weights(users, cells, x, allowance)

    def _differences(self, users, items, ratings) -> np.ndarray:
        """Baseline's minus the factor model's squared error, per rating (clipped by the caller)."""
        r = np.asarray(ratings, np.float64)
        factors = self.model.predict_many(users, items)
        base = self.baseline(items)
        self._tally(r, factors=factors, baseline=base)
        return (base - r) ** 2 - (factors - r) ** 2

    def _tally(self, r: np.ndarray, **answers) -> None:
        for name, answer in answers.items():
            self._sq[name] += float(((answer - r) ** 2).sum())
        self._sq["n"] += len(r)

    # -- a stream pass ---------------------------------------------------------------------------
    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """DP-SGD's stream step on the batch; the answers given are the chosen model's, made
        before the batch is learned; every ``window`` stream positions the fallback releases."""
        if self.budget is None and self.position == 0:  # a new pass
            self.plan(self.model.dp.stream_multiplier())
            # no evidence before the first release: the midpoint (data-independent) rather
            # than an untrained factor model
            self.chose_factors = self.chose_factors and self.windows > 0
        ukeys, ikeys = self.model.id_keys.as_keys(users), self.model.id_keys.as_keys(items)
        r = np.ascontiguousarray(ratings, dtype=np.float64)
        base = self.baseline(ikeys)
        factors = self.model.learn_many(ukeys, ikeys, r, epoch=epoch)
        served = factors if self.chose_factors else base
        diff = (base - r) ** 2 - (factors - r) ** 2
        self._tally(r, factors=factors, baseline=base, served=served, mean=self.private_mean)
        keep = self._within_cap(ukeys)
        start = 0
        while start < len(r):  # windows at fixed stream positions (multiples of ``window``)
            end = min(len(r), start + self.window - self.position % self.window)
            part = slice(start, end)
            k = keep[part]
            self._pending.append((ukeys[part][k], ikeys[part][k], r[part][k], diff[part][k]))
            self.position += end - start
            if self.position % self.window == 0:
                self._release_window()
            start = end
        return served

    def _within_cap(self, ukeys: np.ndarray) -> np.ndarray:
        """The user unit's first ``user_cap`` ratings of each user in this pass (the same rule as
        DP-SGD's); every rating at the rating unit."""
        dp = self.model.dp
        keep = np.ones(len(ukeys), bool)
        if dp.unit != "user":
            return keep
        for n, key in enumerate(ukeys.tolist()):
            seen = self._counts.get(key, 0)
            keep[n] = seen < dp.user_cap
            self._counts[key] = seen + keep[n]
        return keep

    def _release_window(self) -> None:
        """The window's noisy statistics (replace-one: twice the add/remove sensitivity), added
        to the running totals; the baseline and the choice re-derived from the totals."""
        ukeys, ikeys, r, diff = (np.concatenate(parts) for parts in zip(*self._pending))
        self._pending = []
        dp = self.model.dp
        enc = Encoded(np.zeros(len(r), np.int64), buckets(ikeys, self.width).astype(np.int64), r,
                      np.zeros(1, np.int64), self.width)
        weights = None
        if dp.unit == "user":   # a user's windows together stay within the calibrated sqrt(2m)
            ids, uidx = np.unique(ukeys, return_inverse=True)
            left = np.array([self._allowance.get(key, 2.0 * dp.user_cap) for key in ids.tolist()])
            weights, used = self._bounded(uidx.reshape(-1), enc.items, r, left)
            self._allowance.update(zip(ids.tolist(), (left - used).tolist()))
        (mean, _), (item_noise, std) = self._noise("mean", 2.0), self._noise("biases", 2.0)
        stats = noisy_bias_statistics(enc, np.ones(len(r), bool), dp.rating_range, mean, item_noise,
                                      self._rng, weights)
        self._totals = [t + s for t, s in zip(self._totals, stats)]
        self.windows += 1
        self.release = bias_estimates(*self._totals, dp.rating_range, std * math.sqrt(self.windows),
                                      DAMPING)
        if self.windows == 1:  # the baseline answered the first window before any release:
            return             # comparing there would judge the midpoint, not the baseline
        noise, std_c = self._noise("choice", 2.0, "choice_ratings")
        # recent windows weigh more (both models change as they learn): each older window's
        # released sum counts half as much again (post-processing of the releases)
        window_sum = float(np.clip(diff, -CHOICE_CLIP, CHOICE_CLIP).sum() + noise((), self._rng()))
        self.choice_sum = DECAY * self.choice_sum + window_sum
        self.choice_std = math.sqrt(DECAY ** 2 * self.choice_std ** 2 + std_c ** 2)
        # the baseline is the stream's safe answer: the factor model takes over only on evidence
        # (its noisy advantage above STREAM_MARGIN std), so noise alone rarely hands it the answers
        self.chose_factors = self.choice_sum >= STREAM_MARGIN * self.choice_std

    def _noise_of_pass(self) -> float:
        """The item statistics' noise std of one window of a pass (replace-one)."""
        self.plan(self.model.dp.stream_multiplier())
        std = self._noise("biases", 2.0)[1]
        self.budget = None   # planned again when the next pass begins
        return std

    # -- reports ---------------------------------------------------------------------------------
    def component_rmse(self) -> dict:
        """Exact RMSEs of both models on the ratings their choice was made on (a replay figure,
        not a release: never on /privacy)."""
        names = {"factors": "dp_sgd_rmse", "baseline": "baseline_rmse"} | (   # a stream: served
            {"served": "served_rmse", "mean": "private_mean_rmse"} if self.position else {})
        return {out: math.sqrt(self._sq[name] / max(self._sq["n"], 1)) for name, out in names.items()}

    def test_rmse(self, users, items, ratings) -> dict:
        """Both models' RMSE on held-out ratings (a replay figure)."""
        r = np.asarray(ratings, np.float64)
        return {"dp_sgd_rmse": float(np.sqrt(np.mean((self.model.predict_many(users, items) - r) ** 2))),
                "baseline_rmse": float(np.sqrt(np.mean((self.baseline(items) - r) ** 2))),
                "private_mean_rmse": float(np.sqrt(np.mean((self.private_mean - r) ** 2)))}

    def fallback_figures(self) -> dict:
        """Which model answers and why: what /privacy and `replay --json` add to the guarantee."""
        return {"serving": FACTORS if self.chose_factors else BASELINE,
                "fallback": not self.chose_factors,
                "choice": {"noisy_sum": self.choice_sum, "noise_std": self.choice_std,
                           "windows": self.windows if self.position else None,
                           "rule": "baseline when the noisy sum of clipped (baseline - model) "
                                   "squared-error differences is below " +
                                   ("+1 noise std (stream: the factor model needs evidence; each "
                                    "older window weighs half as much again; decided every window)"
                                    if self.windows
                                    else "-3 noise std (holdout)")},
                "fallback_budget": f"{FALLBACK_SHARES} of the budget's 1/z^2 (DP-SGD: the rest), "
                                   "charged in the same ledger",
                "released": {"private_mean": self.private_mean,   # the baseline's, noised
                             "noisy_ratings": self._totals[1] if self.windows else None}}


def with_fallback(model, width: int):
    """A DP-SGD model wrapped with its private fallback (``width`` item buckets: a public size,
    e.g. the run's capacity); any other model unchanged."""
    return DPSGDFallback(model, width) if mode_of(model).dp_sgd else model


def fallback_of(learner) -> DPSGDFallback | None:
    """The fallback of a learner: itself, or the model it wraps (``Recommender``, ``Wrapped``)."""
    for obj in (learner, getattr(learner, "model", None)):
        if isinstance(obj, DPSGDFallback):
            return obj
    return None
