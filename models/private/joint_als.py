"""Private alternating least squares with joint differential privacy (Chien et al., ICML 2021),
on top of the private bias baseline.

Training (every release noised and charged to the ledger, ``privacy.joint_dp``):

1. Release the bias model (``models.private_bias``): global mean mu and damped item biases b_j.
2. T times: every user solves (offset c_u, vector u) by ridge from their OWN ratings' residuals
   y = r - mu - b_j against the current item factors; the vector is clipped to norm 1; the per-item
   statistics sum u u^T and sum clip(y - c_u) u over each user's ``cap`` kept ratings are released
   with Gaussian noise and the item factors re-solved from them (noisy Gram projected to PSD,
   ridge growing with the noise).
3. Release one bit: a DP comparison of the joint model with the baseline (the noisy sum over
   users of the clipped leave-one-out error difference, a one-sided test). If the baseline is
   clearly better, every answer is the baseline's and ``figures()['fallback']`` says so.

Answering user U (joint DP: not released, shown to U only): U's offset and vector from U's own
training ratings and the released item side; U uses the vector only if that lowers U's own
leave-one-out error (a per-user choice from U's own data: free).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> users, items = rng.integers(0, 50, 2000), rng.integers(0, 30, 2000)
>>> ratings = np.clip(np.round(3 + (users % 3 - 1) + (items % 2)), 1, 5).astype(float)
>>> model = PrivateALS(JointDPConfig(epsilon=8.0, rank=2, cap=20), np.arange(30)).fit(users, items, ratings)
>>> model.figures()["proven_bound"], round(model.figures()["epsilon"], 2)
(True, 8.0)
>>> bool(np.abs(model.predict_many(users, items) - ratings).mean() < 1.0)
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sketchrec import frame
from sketchrec.models.private.joint_baseline import (BiasRelease, Encoded, capped, encode, item_index,
                                           loo_residuals, release_biases, ridge_per_user)
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.entropy import DEBUG_NOTE, fresh_generator, noise_generator
from sketchrec.privacy.mode import PrivacyMode, learner_mode
from sketchrec.privacy.joint_dp import (BASELINE_SHARES, FALLBACK, SHARES, Budget, gaussian,
                                        joint_figures, noisy_choice, stage_noise, symmetric_noise)

MAGIC = b"SKJA"   # the fitted model's checkpoint blob (a sketchrec.frame)


@dataclass(frozen=True)
class JointDPConfig:
    """Public hyper-parameters (data-set independent). ``iterations`` = 0 or ``rank`` = 0: no
    factors (bias model with each user's own offset). ``epsilon`` = inf: the same algorithm
    without noise (the non-private reference)."""

    epsilon: float = 8.0
    delta: float = 1e-5
    unit: str = "user"          # "user" or "rating" (add/remove)
    rank: int = 0               # 0: the bias model (factors lose at user level on ML-100k, eps <= 64)
    iterations: int = 4
    cap: int = 80               # ratings each user contributes to the item statistics
    reg_user: float = 5.0       # ridge on the user's vector
    reg_offset: float = 5.0     # ridge on the user's offset
    reg_item: float = 20.0      # ridge on the item factors (plus noise_ridge * noise spectral norm)
    noise_ridge: float = 8.0
    damping: float = 5.0        # item-bias damping (plus 2 noise std)
    clip_residual: float = 2.0  # |y - c_u| clip in the factor statistics
    rating_range: tuple[float, float] = (1.0, 5.0)
    debug_noise_seed: int | None = None  # reproducible noise: NO guarantee (tests only)


def item_statistics(n_items: int, users: np.ndarray, items: np.ndarray, y: np.ndarray,
                    sol: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact per-item statistics of one ALS release, in scaled units: sum u u^T and
    sum clip(y - c_user, clip) / clip * u over the given (kept) ratings, with each user's vector
    ``sol[:, :-1]`` clipped to norm 1 and offset ``sol[:, -1]``."""
    d = sol.shape[1] - 1
    vec = sol[:, :d] / np.maximum(1.0, np.linalg.norm(sol[:, :d], axis=1))[:, None]  # ||u|| <= 1
    u = vec[users]
    x = np.clip(y - sol[users, d], -clip, clip) / clip
    gram = np.zeros((n_items, d, d))
    for a in range(d):
        for b in range(a, d):
            gram[:, a, b] = gram[:, b, a] = np.bincount(items, u[:, a] * u[:, b], n_items)
    rhs = np.stack([np.bincount(items, x * u[:, a], n_items) for a in range(d)], axis=1)
    return gram, rhs


class PrivateALS:
    """Joint-DP ALS over a public item ``catalogue``; ``fit`` then ``predict_many`` (module docstring).

    Parameters
    ----------
    config : a ``JointDPConfig`` (epsilon, delta, the privacy unit, rank, caps and ridges).
    catalogue : the public item ids (never learned from the data).

    Examples
    --------
    >>> import numpy as np
    >>> from sketchrec import PrivateALS
    >>> from sketchrec.models.private.joint_als import JointDPConfig
    >>> model = PrivateALS(JointDPConfig(epsilon=8.0, debug_noise_seed=0), catalogue=np.arange(3))
    >>> preds = model.fit(np.array([0, 0, 1]), np.array([0, 1, 2]), np.array([5.0, 3.0, 4.0])).predict_many(
    ...     np.array([0]), np.array([2]))
    >>> bool(1.0 <= preds[0] <= 5.0)
    True
    """

    joint_dp = True   # its answers about U may go only to U or the backend (``privacy.release``)

    @property
    def privacy_mode(self) -> PrivacyMode:
        return learner_mode(joint_unit=self.config.unit)

    def __init__(self, config: JointDPConfig, catalogue: np.ndarray):
        if config.unit not in ("user", "rating"):
            raise ValueError("unit must be 'user' or 'rating'")
        self.config, self.catalogue = config, np.asarray(catalogue)
        self.private = math.isfinite(config.epsilon)
        self.rank = config.rank if config.iterations > 0 else 0
        iters = config.iterations if self.rank else 0
        self.budget = Budget.calibrate(config.epsilon, config.delta, iters,
                                       laplace=config.unit == "rating") if self.private else None
        self.ledger = PrivacyLedger(config.unit, config.delta, self.budget.accountant) \
            if self.private else None
        self._step = 0

    # -- noise ---------------------------------------------------------------------------------
    def _rng(self) -> np.random.Generator:
        self._step += 1
        return noise_generator(self.config.debug_noise_seed, self._step)

    def _noise(self, stage: str):
        return stage_noise(self.budget, stage, self.config.unit, self.config.cap)

    # -- training ------------------------------------------------------------------------------
    def fit(self, users: np.ndarray, items: np.ndarray, ratings: np.ndarray) -> "PrivateALS":
        c, enc = self.config, encode(np.asarray(users), np.asarray(items), ratings, self.catalogue)
        bias_cap = c.cap if c.unit == "user" else None  # a rating moves one item's bias stats
        (mean, _), (items_noise, std) = self._noise("mean"), self._noise("biases")
        self.release: BiasRelease = release_biases(enc, capped(enc.users, bias_cap, self._rng()),
                                                   c.rating_range, mean, items_noise, std, self._rng,
                                                   c.damping)
        y = enc.ratings - self.release.baseline(enc.items)
        n_users = len(enc.user_ids)
        self.factors = np.zeros((enc.n_items, self.rank))
        if self.rank:
            keep = capped(enc.users, c.cap, self._rng())
            init = self._rng() if c.debug_noise_seed is not None else fresh_generator()
            self.factors = init.standard_normal((enc.n_items, self.rank)) / math.sqrt(self.rank)
            for _ in range(c.iterations):
                (sol, _), _ = self._solve(enc.users, enc.items, y, n_users)
                self.factors = self._item_release(enc, y, keep, sol)
        coef, loo = self._answer_model(enc.users, enc.items, y, n_users)
        # the DP choice: baseline minus final leave-one-out squared error, mean per user
        diff = np.bincount(enc.users, y ** 2 - loo ** 2, n_users) / np.bincount(enc.users, minlength=n_users)
        self.chose_factors, self.choice_sum = noisy_choice(diff, *self._noise("choice"), self._rng())
        if self.private:
            self.budget.record(self.ledger)
        self.user_ids, self.coef = enc.user_ids, coef
        return self

    def _solve(self, users, items, y, n_users):
        c = self.config
        feats = np.column_stack([self.factors[items], np.ones(len(y))])
        penalty = np.r_[np.full(self.rank, c.reg_user), c.reg_offset]
        return ridge_per_user(users, feats, y, n_users, penalty), feats

    def _item_release(self, enc: Encoded, y: np.ndarray, keep: np.ndarray, sol: np.ndarray) -> np.ndarray:
        c, d = self.config, self.rank
        gram, rhs = item_statistics(enc.n_items, enc.users[keep], enc.items[keep], y[keep], sol,
                                    c.clip_residual)
        std = self._noise("factors")[1]
        gram, rhs = gram + symmetric_noise(enc.n_items, d, std, self._rng()), \
            rhs + gaussian(rhs.shape, std, self._rng())
        w, q = np.linalg.eigh(gram)  # post-processing: project the noisy Gram to PSD, then ridge
        ridge = c.reg_item + c.noise_ridge * 2.0 * std * math.sqrt(d)
        inv = np.einsum("nab,nb,ncb->nac", q, 1.0 / (np.maximum(w, 0.0) + ridge), q)
        return np.einsum("nab,nb->na", inv, rhs * c.clip_residual)

    def _answer_model(self, users, items, y, n_users) -> tuple[np.ndarray, np.ndarray]:
        """Each user's coefficients (vector, offset) and leave-one-out residuals: the offset
        alone, or with the vector when that lowers the user's own leave-one-out error."""
        ones = np.ones((len(y), 1))
        off, off_inv = ridge_per_user(users, ones, y, n_users, np.array([self.config.reg_offset]))
        loo = loo_residuals(users, ones, y, off, off_inv)
        coef = np.zeros((n_users, self.rank + 1))
        coef[:, -1] = off[:, 0]
        if self.rank:
            (sol, inv), feats = self._solve(users, items, y, n_users)
            loo_f = loo_residuals(users, feats, y, sol, inv)
            use = np.bincount(users, loo_f ** 2, n_users) < np.bincount(users, loo ** 2, n_users)
            coef[use] = sol[use]
            loo = np.where(use[users], loo_f, loo)
        return coef, loo

    # -- answers -------------------------------------------------------------------------------
    def predict_many(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Answers for (user, item) pairs, each from that user's own solution (unknown users:
        the baseline). Only ever shown to the user asked about (joint DP)."""
        pos = item_index(self.catalogue, np.asarray(items))
        return np.clip(self.answers(self.user_rows(np.asarray(users)), pos), *self.config.rating_range)

    def user_rows(self, users: np.ndarray) -> np.ndarray:
        """Each user's row of the per-user solutions (-1: a user without training ratings)."""
        upos = np.minimum(np.searchsorted(self.user_ids, users), len(self.user_ids) - 1)
        return np.where(self.user_ids[upos] == users, upos, -1)

    def answers(self, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Unclipped answers for user rows (``user_rows``) and catalogue positions (-1: unknown)."""
        base = self.release.baseline(pos)
        if not self.chose_factors:
            return base
        coef = np.where((rows >= 0)[:, None], self.coef[np.maximum(rows, 0)], 0.0)
        vecs = np.where((pos >= 0)[:, None], self.factors[np.maximum(pos, 0)], 0.0)
        return base + coef[:, -1] + np.einsum("nk,nk->n", coef[:, :-1], vecs)

    def figures(self) -> dict:
        """The /privacy figures (the ledger's proven epsilon, or the non-private label)."""
        extra = {"hyper_parameters": {k: v for k, v in asdict(self.config).items()
                                      if k not in ("epsilon", "delta", "debug_noise_seed")},
                 "budget_shares": f"{SHARES} of 1/z^2 (the factors' share goes to the biases "
                                  "when rank 0)"}
        if not self.private:
            return {"mode": "joint-dp", "epsilon": math.inf, "proven_bound": False,
                    "guarantee": "none: the non-private reference (no noise)", "serving": self.serving(),
                    "fallback": not self.chose_factors, **extra}
        void = DEBUG_NOTE if self.config.debug_noise_seed is not None else None
        return joint_figures(self.ledger, "joint-dp", self.serving(), not self.chose_factors, void, extra)

    # -- checkpoints ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The fitted model: the release (mean, item biases and statistics, item factors, the
        fallback bit), each user's own solution (operator state: never released) and the ledger."""
        meta = {"config": asdict(self.config), "chose_factors": bool(self.chose_factors),
                "choice_sum": self.choice_sum, "mu": self.release.mu,
                "ledger": self.ledger.to_dict() if self.ledger is not None else None}
        return frame.encode(MAGIC, {"meta": meta}, {
            "catalogue": self.catalogue, "item_bias": self.release.item_bias,
            "counts": self.release.counts, "sums": self.release.sums, "factors": self.factors,
            "coef": self.coef, "user_ids": self.user_ids})

    @classmethod
    def from_bytes(cls, blob: bytes) -> "PrivateALS":
        """Back from ``to_bytes``, with its ledger (a restart never resets the budget spent)."""
        got = frame.decode_arrays(blob, MAGIC, "joint-DP model")   # np.savez before the frame
        meta, arrays = got.header["meta"], got.parts
        cfg = meta["config"]
        model = cls(JointDPConfig(**{**cfg, "rating_range": tuple(cfg["rating_range"])}), arrays["catalogue"])
        model.release = BiasRelease(meta["mu"], arrays["item_bias"], arrays["counts"], arrays["sums"])
        model.factors, model.coef, model.user_ids = arrays["factors"], arrays["coef"], arrays["user_ids"]
        model.chose_factors, model.choice_sum = meta["chose_factors"], meta["choice_sum"]
        model.ledger = PrivacyLedger.from_dict(meta["ledger"]) if meta["ledger"] else None
        return model

    def serving(self) -> str:
        """Which model answers (what /privacy shows)."""
        if not self.chose_factors:
            return FALLBACK
        if self.rank:
            return f"private ALS (rank {self.rank} item factors; each user's own offset and vector)"
        return "joint-DP bias model (DP mean and item biases; each user's own offset)"


class PrivateBaseline:
    """The private baseline under the same budget: DP global mean + damped DP item biases, the
    whole budget on the bias statistics (no per-user part at all)."""

    joint_dp = True

    @property
    def privacy_mode(self) -> PrivacyMode:
        return learner_mode(joint_unit=self.config.unit)

    def __init__(self, config: JointDPConfig, catalogue: np.ndarray):
        self.config, self.catalogue = config, np.asarray(catalogue)
        self.private = math.isfinite(config.epsilon)
        laplace = config.unit == "rating"
        self.budget = Budget.calibrate(config.epsilon, config.delta, 0, BASELINE_SHARES, laplace) \
            if self.private else None
        self.ledger = PrivacyLedger(config.unit, config.delta, self.budget.accountant) \
            if self.private else None

    def fit(self, users: np.ndarray, items: np.ndarray, ratings: np.ndarray) -> "PrivateBaseline":
        c, enc = self.config, encode(np.asarray(users), np.asarray(items), ratings, self.catalogue)
        cap = c.cap if c.unit == "user" else None
        def rng():
            return noise_generator(c.debug_noise_seed, 0)  # fresh unless debugging
        (mean, _), (items_noise, std) = (stage_noise(self.budget, k, c.unit, c.cap)
                                         for k in ("mean", "biases"))
        self.release = release_biases(enc, capped(enc.users, cap, rng()), c.rating_range, mean,
                                      items_noise, std, rng, c.damping)
        if self.private:
            self.budget.record(self.ledger)
        return self

    def predict_many(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        pos = item_index(self.catalogue, np.asarray(items))
        return np.clip(self.release.baseline(pos), *self.config.rating_range)

    def figures(self) -> dict:
        if not self.private:
            return {"mode": "private-baseline", "epsilon": math.inf, "proven_bound": False,
                    "guarantee": "none: the non-private reference (no noise)"}
        void = DEBUG_NOTE if self.config.debug_noise_seed is not None else None
        return joint_figures(self.ledger, "private-baseline", "private baseline (DP mean and "
                             "item biases)", False, void)
