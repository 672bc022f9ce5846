"""Serving a joint-DP model (``models.private_als.PrivateALS``, issue 23): read-only, after it was
trained in one batch, through the same ``LearningService`` and HTTP app as the learning models.

The guarantee is *joint* DP: the release (global mean, item biases, item factors, the fallback
bit) is DP; user U's offset and vector are solved from the release and U's OWN training ratings,
so an answer about U may go only to U or to the trusted backend. Per-user access control is
therefore always on for this model (``privacy.release.access_control_default`` says so for every
``joint_dp`` model, and ``http.resolve_access`` refuses to turn it off):

- /predict?user=U&item=I: ``PrivateALS.answers`` for (U, I), clipped: exactly ``predict_many``.
- /recommend?user=U&k: the public catalogue scored for U, best first, minus U's own training
  items (what is excluded depends on U's data only, and goes to U only).
- /privacy: the model's ``figures()`` (epsilon, delta, unit, which model serves, fallback).
- /stats: no exact count (the number of training ratings is not released).
- /pause, /resume, /checkpoint: 409 (the service is read-only: nothing learns).

>>> import numpy as np
>>> from sketchrec.data import SyntheticStream
>>> from sketchrec.models.private_als import JointDPConfig, PrivateALS
>>> data = SyntheticStream(3000, n_users=60, n_items=40, seed=0).all()
>>> model = PrivateALS(JointDPConfig(epsilon=8.0), np.unique(data.items)).fit(
...     data.users, data.items, data.ratings)
>>> rec = JointRecommender(model, data)
>>> user = str(data.users[0])
>>> rated = set(data.items[data.users == data.users[0]].tolist())
>>> items, _ = rec.recommend(user, 40)
>>> not rated & {i for i, _ in items}, len(items) == 40 - len(rated)
(True, True)
>>> rec.predict(user, str(data.items[0])) == float(model.predict_many(data.users[:1], data.items[:1])[0])
True
"""

from __future__ import annotations

import threading
import time

import numpy as np

from sketchrec.data import Ratings
from sketchrec.models.private_als import PrivateALS
from sketchrec.models.private_bias import item_index
from sketchrec.stream.serving.service import LearningService

ACCESS_NOTE = ("on, always: joint DP — /predict and /recommend about user U answer only U's token "
               "or the backend (admin) token")


def as_id(text, ids: np.ndarray):
    """A query's id (text) in the dtype of ``ids`` (None: it cannot be one of them).

    >>> as_id("5", np.array([1, 5])), as_id("x", np.array([1, 5])), as_id("x", np.array(["x"]))
    (5, None, 'x')
    """
    if ids.dtype.kind in "iu":
        try:
            return int(text)
        except (TypeError, ValueError):
            return None
    if ids.dtype.kind == "f":
        try:
            return float(text)
        except (TypeError, ValueError):
            return None
    return text if ids.dtype.kind in "UO" or not len(ids) else None


class _Catalogue:
    """What the service counts of the catalogue (its size: public)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


class JointRecommender:
    """A fitted ``PrivateALS`` with what serving needs: U's own training items (to leave out of
    U's recommendations). Read-only: it has the attributes the service and the app read
    (``model``, ``monitor``, ``debias``, ``learning``, ``catalogue``, ...) and never learns."""

    def __init__(self, model: PrivateALS, train: Ratings, catalogue_source: str = ""):
        self.model, self.catalogue_source = model, catalogue_source
        rows = model.user_rows(np.asarray(train.users))
        pos = item_index(model.catalogue, np.asarray(train.items))
        keep = (rows >= 0) & (pos >= 0)
        order = np.argsort(rows[keep], kind="stable")
        self._rated = pos[keep][order]      # each user's rated positions, users in row order
        self._starts = np.searchsorted(rows[keep][order], np.arange(len(model.user_ids) + 1))
        self.n_train = int(keep.sum())      # operator state: never on a public route
        self.catalogue = _Catalogue(len(model.catalogue))
        self.monitor = self.debias = None
        self.learning = threading.Event()   # never paused: nothing learns
        self.learning.set()
        self.n_skipped_clip = 0

    @property
    def nbytes(self) -> int:
        return int(self._rated.nbytes + self._starts.nbytes + self.model.factors.nbytes
                   + self.model.coef.nbytes)

    def _row(self, user) -> int:
        uid = as_id(user, self.model.user_ids)
        return -1 if uid is None else int(self.model.user_rows(np.array([uid]))[0])

    def _pos(self, item) -> int:
        iid = as_id(item, self.model.catalogue)
        return -1 if iid is None else int(item_index(self.model.catalogue, np.array([iid]))[0])

    def predict(self, user, item) -> float:
        """U's answer for item I (only for U or the backend: joint DP)."""
        value = self.model.answers(np.array([self._row(user)]), np.array([self._pos(item)]))
        return float(np.clip(value, *self.model.config.rating_range)[0])

    def predict_many(self, users, items) -> np.ndarray:
        return self.model.predict_many(np.asarray(users), np.asarray(items))

    def recommend(self, user, k: int) -> tuple[list[tuple[object, float]], str]:
        """U's top-k catalogue items, best first, leaving out U's own training items."""
        row, n = self._row(user), len(self.model.catalogue)
        scores = self.model.answers(np.full(n, row), np.arange(n))
        if row >= 0:
            scores[self._rated[self._starts[row]:self._starts[row + 1]]] = -np.inf
        top = np.argpartition(-scores, k)[:k] if n > k else np.arange(n)
        top = top[np.argsort(-scores[top], kind="stable")]
        ids = self.model.catalogue
        return [(ids[j].item(), float(scores[j])) for j in top if np.isfinite(scores[j])], \
            "joint-dp" if row >= 0 else "release"


class JointService(LearningService):
    """The read-only service over a ``JointRecommender``: /privacy shows the model's figures."""

    def __init__(self, recommender: JointRecommender):
        super().__init__(recommender, None, read_only=True)

    @property
    def ratings_learned(self) -> int:
        return self.recommender.n_train

    def stats(self) -> dict:
        """The base service's fields; the exact counts stay operator state (``public_stats``)."""
        rec = self.recommender
        return {"ratings_learned": self.ratings_learned, "skipped": dict(self.skipped),
                "model_bytes": rec.nbytes, "serving_bytes": rec.nbytes,
                "catalogue_items": len(rec.catalogue), "uptime_s": time.time() - self.started,
                "paused": False, "read_only": True, "checkpoint": None, "checkpoint_age_s": None,
                "broker": self.health.broker(), "ready": self.health.ready, "offsets": {}}

    def warm_up(self) -> None:
        self.health.ready = True   # numpy only: nothing to compile

    def privacy(self) -> dict:
        figures = {**self.recommender.model.figures(), "access_control": ACCESS_NOTE}
        if self.recommender.catalogue_source:
            figures["catalogue"] = self.recommender.catalogue_source
        return figures
