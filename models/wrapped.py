"""A learner with two optional hooks: a monitor that sees every learned batch, and a map applied
to every prediction (post-processing, e.g. LDP debiasing). One class for the evaluation protocols,
the replay command and the serving recommender, instead of a proxy each.

Anything else is the wrapped model's: ``Wrapped(model).dp is model.dp``. The river ``Ranker``
verbs (``learn_one``, ``predict_one``, ``rank``) go through the hooks too, so a wrapped learner is
a Ranker that keeps its monitor and map whichever interface drives it.

>>> from sketchrec.models import SketchMF
>>> halves = Wrapped(SketchMF(capacity=50, dim=4), predict_map=lambda p: p / 2)
>>> _ = halves.learn_many(["ann", "bob"], ["film", "film"], [4.0, 5.0])
>>> bool(halves.predict_one("ann", "film") == halves.model.predict_one("ann", "film") / 2)
True
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sketchrec.models.base import FactorizationModel
from sketchrec.models.ranker import Ranker
from sketchrec.privacy.keys import id_keys_of


class Wrapped(Ranker):
    """``model`` seen through ``monitor`` (anything with ``observe(model, user keys, item keys,
    ratings, predictions)``, e.g. ``privacy.monitor.PrivacyMonitor``) and ``predict_map`` (a
    function of a prediction array). Either may be None, and both may be set later."""

    def __init__(self, model, monitor=None, predict_map: Callable[[np.ndarray], np.ndarray] | None = None):
        self.model, self.monitor, self.predict_map = model, monitor, predict_map

    @property
    def id_keys(self):
        """The wrapped model's ids-to-keys map (the keys a batch is learned under are its own)."""
        return id_keys_of(self.model)

    @id_keys.setter
    def id_keys(self, keys) -> None:
        self.model.id_keys = keys

    # the batch interface ---------------------------------------------------------------------------
    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """Learn a batch (the monitor sees it); the prediction made before each rating."""
        return self.learn_batch(users, items, ratings, epoch)[2]

    def noisy_step(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """One DP-SGD step of a private model on this batch (the monitor sees it)."""
        return self.learn_batch(users, items, ratings, epoch, private=True)[2]

    def learn_batch(self, users, items, ratings, epoch: int = 0,
                    private: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(user keys, item keys, predictions) of a learned batch, for callers that also index
        the batch by key; ``private`` takes a DP-SGD step instead of the model's ``learn_many``."""
        ukeys, ikeys = self.id_keys.as_keys(users), self.id_keys.as_keys(items)
        ratings = np.ascontiguousarray(ratings, dtype=np.float64)
        learn = self.model.noisy_step if private else self.model.learn_many
        predictions = learn(ukeys, ikeys, ratings, epoch=epoch)
        if self.monitor is not None:
            self.monitor.observe(self.model, ukeys, ikeys, ratings, predictions)
        return ukeys, ikeys, predictions

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        out = self.model.predict_many(users, items, clip=clip)
        return out if self.predict_map is None else self.predict_map(out)

    # river's reco.base.Ranker interface: the models' own verbs, which call this wrapper's batch
    # methods, so that the hooks apply (rank orders by mapped, unclipped predictions)
    learn_one = FactorizationModel.learn_one
    predict_one = FactorizationModel.predict_one
    rank = FactorizationModel.rank
    score_items = FactorizationModel.score_items

    def __getattr__(self, name: str):
        if name == "model":  # not set yet (copy, unpickling): no recursion through the model
            raise AttributeError(name)
        return getattr(self.model, name)
