"""Bridges to river: its BiasedMF behind our batch interface (for side-by-side runs), and any
Ranker as a river Regressor (so `river.evaluate.progressive_val_score` and river metrics apply)."""

from __future__ import annotations

import numpy as np
from river import base, optim, reco


class RiverBiasedMF:
    """river's ``reco.BiasedMF`` with ``learn_many``/``predict_many``, same hyper-parameters as ours.

    Predictions are clipped to the rating range seen, as ours are, so errors compare fairly.

    Parameters
    ----------
    dim, lr, reg, init_std, lr_schedule_T, seed : as ``SketchMF``'s (translated to river's terms).

    Examples
    --------
    >>> import numpy as np
    >>> from sketchrec import RiverBiasedMF
    >>> model = RiverBiasedMF(dim=4, seed=0)
    >>> _ = model.learn_many(np.array([1, 2]), np.array([7, 8]), np.array([5.0, 2.0]))
    >>> bool(2.0 <= model.predict_many(np.array([1]), np.array([7]))[0] <= 5.0)
    True
    """

    def __init__(self, dim: int = 64, lr: float = 0.03, reg: float = 0.085, init_std: float = 0.05,
                 lr_schedule_T: float = 20.0, seed: int = 0):
        # river's squared loss has gradient 2 (y^ - y) while ours is (y^ - y): river's step
        # lr_r * (2 e q + l2 w) equals ours, lr * (e q + reg w), at lr_r = lr / 2 and l2 = 2 reg.
        self.lr, self.lr_schedule_T = lr / 2, lr_schedule_T
        self.model = reco.BiasedMF(
            n_factors=dim, bias_optimizer=optim.SGD(lr / 2), latent_optimizer=optim.SGD(lr / 2),
            l2_bias=2 * reg, l2_latent=2 * reg,
            latent_initializer=optim.initializers.Normal(mu=0.0, sigma=init_std, seed=seed), seed=seed)
        self.low, self.high = np.inf, -np.inf
        self.n_learned = 0

    def _set_lr(self, epoch: int) -> None:
        lr = self.lr / (1.0 + epoch / self.lr_schedule_T)
        for opt in (self.model.u_bias_optimizer, self.model.i_bias_optimizer,
                    self.model.u_latent_optimizer, self.model.i_latent_optimizer):
            opt.lr = optim.schedulers.Constant(lr)

    def _clip(self, value: float) -> float:
        return min(max(value, self.low), self.high) if self.n_learned else value

    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        self._set_lr(epoch)
        out = np.empty(len(ratings))
        learn, predict = self.model.learn_one, self.model.predict_one
        for n, (u, i, r) in enumerate(zip(users.tolist(), items.tolist(), np.asarray(ratings).tolist())):
            out[n] = self._clip(predict(u, i))
            learn(u, i, r)
            self.low, self.high = min(self.low, r), max(self.high, r)
            self.n_learned += 1
        return out

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        predict = self.model.predict_one
        raw = (predict(u, i) for u, i in zip(np.asarray(users).tolist(), np.asarray(items).tolist()))
        return np.fromiter((self._clip(p) if clip else p for p in raw), dtype=np.float64,
                           count=len(users))

    @property
    def nbytes(self) -> int:
        m = self.model
        n = len(m.u_latents) + len(m.i_latents)
        # each entry: a numpy vector (112-byte header + data) plus bias floats and dict slots
        return n * (112 + 8 * m.n_factors + 24 + 2 * 100)


class RankerRegressor(base.Regressor):
    """A river Regressor over ``x = {"user": ..., "item": ...}`` that delegates to a Ranker."""

    def __init__(self, ranker: reco.base.Ranker):
        self.ranker = ranker

    def learn_one(self, x: dict, y: float) -> None:
        self.ranker.learn_one(x["user"], x["item"], y)

    def predict_one(self, x: dict) -> float:
        return self.ranker.predict_one(x["user"], x["item"])
