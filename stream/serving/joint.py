"""Serving a joint-DP model (``models.private.joint_als.PrivateALS``): read-only, after it was
trained in one batch, through the same HTTP app as the learning models (a ``ServingSource``).

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

Checkpoints (`replay --dp-model joint --checkpoint DIR`, `sketchrec serve --checkpoint DIR`): the
fitted model (release, each user's own solution: operator state) and its ledger; a run into a
directory that holds a ledger extends it (``stream.checkpoint.continue_ledger``): a new fit on the
same data is charged on top, a crash or restart never resets the budget.

>>> import numpy as np
>>> from sketchrec.data import SyntheticStream
>>> from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS
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

import json
import threading
import time
from collections import Counter

import numpy as np

from sketchrec import frame
from sketchrec.data import Ratings
from sketchrec.models.private.joint_als import PrivateALS
from sketchrec.models.private.joint_baseline import item_index
from sketchrec.models.metrics import ErrorStats
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.stream.checkpoint import Checkpoint, CheckpointStore, operator_parts, restore_operator_parts
from sketchrec.stream.health import Health
from sketchrec.stream.service import LearningService, NoCheckpoint

RATED_MAGIC = b"SKJR"   # each user's training items, in a checkpoint (a sketchrec.frame)
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

    def __init__(self, model: PrivateALS, train: Ratings | None, catalogue_source: str = "",
                 rated: tuple[np.ndarray, np.ndarray] | None = None):
        self.model, self.catalogue_source = model, catalogue_source
        if rated is None:
            rows = model.user_rows(np.asarray(train.users))
            pos = item_index(model.catalogue, np.asarray(train.items))
            keep = (rows >= 0) & (pos >= 0)
            order = np.argsort(rows[keep], kind="stable")
            rated = (pos[keep][order],      # each user's rated positions, users in row order
                     np.searchsorted(rows[keep][order], np.arange(len(model.user_ids) + 1)))
        self._rated, self._starts = rated
        self.n_train = int(self._starts[-1])  # operator state: never on a public route
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


    def state_parts(self) -> dict[str, bytes]:
        """What a checkpoint holds: the fitted model with its ledger, each user's training items."""
        rated = frame.encode(RATED_MAGIC, {}, {"rated": self._rated, "starts": self._starts})
        return {"joint": self.model.to_bytes(), "rated": rated,
                "serving": json.dumps({"catalogue_source": self.catalogue_source}).encode()}

    @classmethod
    def from_parts(cls, parts: dict[str, bytes]) -> "JointRecommender":
        rated = frame.decode_arrays(parts["rated"], RATED_MAGIC, "joint-DP rated items").parts
        pair = (rated["rated"], rated["starts"])   # np.savez before the frame: still read
        source = json.loads(parts["serving"])["catalogue_source"]
        return cls(PrivateALS.from_bytes(parts["joint"]), None, source, pair)


class JointService:
    """The read-only ``ServingSource`` (``stream.serving.source``) over a ``JointRecommender``:
    /privacy shows the model's figures. With a ``CheckpointStore`` it writes the fitted model and
    its ledger (``checkpoint``) and comes back from them (``from_checkpoint``): a restart serves the
    same release, never a new one. Not a ``LearningService``: nothing here learns, so it has no
    offsets, budget, pass accounting or pause (the app answers 409 to the learning endpoints of a
    read-only source).

    Parameters
    ----------
    recommender:
        The fitted model's recommender.
    checkpoints:
        Where ``checkpoint`` writes (None: nowhere).
    restored:
        The checkpoint it was read from (``from_checkpoint``): its ledger is the model's.

    Examples
    --------
    >>> [m for m in ("stats", "privacy", "checkpoint", "pause", "resume", "warm_up")
    ...  if not callable(getattr(JointService, m, None))]
    []
    >>> issubclass(JointService, LearningService)   # nothing here learns
    False
    """

    read_only = True
    model_cls = PrivateALS

    def __init__(self, recommender: JointRecommender, checkpoints: CheckpointStore | None = None,
                 restored: Checkpoint | None = None):
        self.recommender, self.checkpoints = recommender, checkpoints
        self.health = Health()
        self.feedback = None   # read-only: posted ratings are refused (stream.serving.feedback)
        self.titles = None     # --items: item titles on the answers
        self.origin = {"perturbed_on_device": 0, "raw": 0, "mechanism": None}   # no local DP
        self.skipped: Counter = Counter()
        self.started = time.time()
        self.last_checkpoint: dict | None = None
        self.ledger = recommender.model.ledger
        self._lock = threading.Lock()
        if restored is not None:
            self._adopt(restored)
        recommender.model.ledger = self.ledger   # one ledger: the checkpoint's when restored

    @classmethod
    def from_checkpoint(cls, directory, model_classes=None, **_) -> "JointService":
        """The service over the newest valid checkpoint in ``directory`` (NoCheckpoint: none)."""
        store = CheckpointStore(directory)
        ckpt = store.latest()
        if ckpt is None:
            raise NoCheckpoint(f"no valid checkpoint in {directory}")
        return cls(JointRecommender.from_parts(ckpt.parts), store, restored=ckpt)

    def _adopt(self, ckpt: Checkpoint) -> None:
        restore_operator_parts(self.recommender.model, ckpt.parts)
        ledger = ckpt.meta.get("privacy_ledger")
        self.ledger = PrivacyLedger.from_dict(ledger) if ledger else None
        self.last_checkpoint = ckpt.summary()

    def checkpoint(self) -> dict:
        """Write the fitted model and its ledger now (the layout of ``LearningService.checkpoint``,
        whose reader ``open_checkpoint`` picks this class by ``model_class``)."""
        if self.checkpoints is None:
            raise RuntimeError("no checkpoint directory configured")
        with self._lock:
            model = self.recommender.model
            path = self.checkpoints.save(
                {**self.recommender.state_parts(), **operator_parts(model)},
                {"ratings_learned": self.ratings_learned, "offsets": {}, "topic_id": None,
                 "skipped": dict(self.skipped), "errors": ErrorStats().to_dict(),
                 "model_class": PrivateALS.__name__, "privacy_ledger": self.ledger and self.ledger.to_dict(),
                 "origin": self.origin})
            self.last_checkpoint = {"name": path.name, "seq": self.checkpoints.newest_seq(),
                                    "ratings_learned": self.ratings_learned, "at": time.time()}
            return {**self.last_checkpoint, "path": str(path)}

    def reload_if_newer(self) -> bool:
        """Swap in a newer checkpoint's model (`sketchrec serve` polls this)."""
        ckpt = self.checkpoints.latest() if self.checkpoints is not None else None
        if ckpt is None or ckpt.seq <= (self.last_checkpoint or {}).get("seq", 0):
            return False
        self.recommender = JointRecommender.from_parts(ckpt.parts)
        self._adopt(ckpt)
        self.recommender.model.ledger = self.ledger
        return True

    @property
    def ratings_learned(self) -> int:
        return self.recommender.n_train

    def stats(self) -> dict:
        """The learning services' fields; the exact counts stay operator state (``privacy.release``)."""
        rec = self.recommender
        return {"ratings_learned": self.ratings_learned, "skipped": dict(self.skipped),
                "model_bytes": rec.nbytes, "serving_bytes": rec.nbytes,
                "catalogue_items": len(rec.catalogue), "uptime_s": time.time() - self.started,
                "paused": False, "read_only": True, "checkpoint": self.last_checkpoint, "checkpoint_age_s": None,
                "broker": self.health.broker(), "ready": self.health.ready, "offsets": {}}

    def warm_up(self) -> None:
        self.health.ready = True   # numpy only: nothing to compile

    def pause(self) -> None:
        raise RuntimeError("a joint-DP model never learns: there is nothing to pause")

    def resume(self) -> None:
        raise RuntimeError("a joint-DP model never learns: there is nothing to resume")

    def privacy(self) -> dict:
        figures = {**self.recommender.model.figures(), "access_control": ACCESS_NOTE}
        if self.recommender.catalogue_source:
            figures["catalogue"] = self.recommender.catalogue_source
        return figures


def open_checkpoint(directory) -> "LearningService | JointService":
    """The read-only service over the newest checkpoint in ``directory``: a joint-DP model's
    (``JointService``) or a learning model's (``LearningService.from_checkpoint``)."""
    ckpt = CheckpointStore(directory).latest()
    if ckpt is not None and ckpt.meta.get("model_class") == PrivateALS.__name__:
        return JointService.from_checkpoint(directory)
    return LearningService.from_checkpoint(directory)
