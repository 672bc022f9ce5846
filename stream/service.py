"""A learning service: the recommender, the figures about its learning, and its checkpoints."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from sketchrec.models.metrics import ErrorStats
from sketchrec.models.registry import MODELS
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.audit import real_rows
from sketchrec.privacy.keys import key_local_ids
from sketchrec.privacy.ldp import MIXED, MIXED_LINE, LDPSettings, combine
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.privacy.release import service_mode
from sketchrec.privacy.report import privacy_figures, versus_private_mean
from sketchrec.stream.checkpoint import (Checkpoint, CheckpointStore, operator_parts,
                                         restore_operator_parts)
from sketchrec.stream.health import Health
from sketchrec.stream.recommender import Recommender


class NoCheckpoint(FileNotFoundError):
    """The checkpoint directory holds no checkpoint."""


class UnreadableCheckpoints(ValueError):
    """The checkpoint directory holds checkpoints, and none of them verifies: starting afresh
    would learn from the group's offsets with an empty model and write a checkpoint that wins."""


class LearningService:
    """What the live endpoint reads: the recommender and the figures about its learning.

    Built complete: ``ledger`` is the DP-SGD model's ``PrivacyLedger`` (None: nothing accounted
    yet), ``audit`` a canary audit's result, ``debias_ldp`` maps predictions back through the
    mean of the local-DP mechanism the stream's headers name (``privacy.ldp``), and ``restored``
    a checkpoint whose counters, offsets, ledger and LDP origin the service continues from (use
    ``from_checkpoint`` or ``kafka.consumer.resume_or_create`` rather than passing it yourself).
    ``read_only`` services (``sketchrec serve --checkpoint DIR``) never learn; they reload the
    newest checkpoint when a newer one appears.
    """

    def __init__(self, recommender: Recommender, checkpoints: CheckpointStore | None = None, *,
                 read_only: bool = False, model_cls: type | None = None,
                 ledger: PrivacyLedger | None = None, audit: dict | None = None,
                 debias_ldp: bool = False, restored: Checkpoint | None = None):
        self.recommender = recommender
        self.checkpoints = checkpoints
        self.read_only = read_only
        self.model_cls = model_cls or type(recommender.model)
        self.skipped: Counter = Counter()
        self.errors = ErrorStats()    # prequential errors of what was learned (checkpointed)
        self.offsets: dict = {}       # partition (str) -> next offset to consume
        self.topic_id: str | None = None   # the input topic's id the offsets belong to (kafka.identity)
        self.started = time.time()
        self.last_checkpoint: dict | None = None
        self.audit = audit
        self.ledger = ledger
        self.budget: float | None = None  # the epsilon budget of the private passes (public)
        self.budget_stopped = False     # learning refused: the privacy budget is spent
        self.finished = False           # the stream ended (a replay): served, learning no more
        self.origin = {"perturbed_on_device": 0, "raw": 0, "mechanism": None}  # local DP (headers)
        self.debias_ldp = debias_ldp
        self.health = Health()
        # POST /ratings: how posted ratings are taken (stream.feedback; None: learned directly)
        self.feedback = None
        self.titles = None   # --items: item titles on the answers (stream.titles.Titles)
        self._lock = threading.Lock()
        self._rate = (time.perf_counter(), 0)  # for ratings/s between two reads of stats
        if restored is not None:
            if ledger is not None:
                raise ValueError("a restored service takes its ledger from the checkpoint")
            self._adopt(restored)
        self.apply_ldp_debias()  # from the mechanism a restored checkpoint recorded, if any

    @property
    def ratings_learned(self) -> int:
        return self.recommender.model.n_learned

    def record_skipped(self, reasons: Counter | dict) -> None:
        with self._lock:
            self.skipped.update(reasons)

    def stats(self) -> dict:
        now, learned = time.perf_counter(), self.ratings_learned
        then, before = self._rate
        self._rate = (now, learned)
        uptime = time.time() - self.started
        skipped = dict(self.skipped)
        memory = self.recommender.memory()
        for reason, count in (("loss clipped", self.recommender.n_skipped_clip),
                              ("diverged", getattr(self.recommender.model, "n_skipped_diverged", 0))):
            if count:
                skipped[reason] = count
        return {"ratings_learned": learned, "skipped": skipped,
                "throughput_per_s": (learned - before) / max(now - then, 1e-9),
                "mean_throughput_per_s": learned / max(uptime, 1e-9),
                "model_bytes": int(self.recommender.model.nbytes),
                "serving_bytes": int(sum(memory.values())),
                # per component: each is sized by configuration, not by the stream
                "memory_bytes": memory,
                "catalogue_items": len(self.recommender.catalogue),
                "catalogue_max_items": getattr(self.recommender.catalogue, "max_items", None),
                "catalogue_evicted": getattr(self.recommender.catalogue, "evicted", 0),
                "uptime_s": uptime, "paused": not self.recommender.learning.is_set(),
                "state": self.state(), **self._versus_private_mean(),
                "read_only": self.read_only, "checkpoint": self.last_checkpoint,
                "checkpoint_age_s": (round(time.time() - self.last_checkpoint["at"], 3)
                                     if self.last_checkpoint and self.last_checkpoint.get("at") else None),
                "checkpoint_error": self.health.checkpoint_error,
                "broker": self.health.broker(), "ready": self.health.ready,
                "prequential_rmse": self.errors.rmse if self.errors.n else None,
                "offsets": self.offsets}

    def state(self) -> str:
        """What the service is doing, in words (the dashboard's status line)."""
        broker = self.health.broker()
        for state, now in (("read-only", self.read_only), ("finished", self.finished),
                           ("stopped: privacy budget spent", self.budget_stopped),
                           ("paused", not self.recommender.learning.is_set()),
                           ("waiting for the broker", broker is not None and not broker["connected"])):
            if now:
                return state
        return "learning"

    def finish(self) -> None:
        """The stream ended (a replay's file): the service serves on and says it learns no more."""
        self.finished = True

    def _versus_private_mean(self) -> dict:
        """A DP model with its private fallback: whether what it served was worse than the
        private global mean alone (exact errors: operator state in the DP modes)."""
        rmse = getattr(self.recommender.model, "component_rmse", None)
        figures = rmse() if rmse is not None else {}
        if "private_mean_rmse" not in figures:
            return {}
        return {"versus_private_mean": versus_private_mean(figures["served_rmse"],
                                                           figures["private_mean_rmse"])}

    def warm_up(self) -> None:
        """Compile the prediction kernels (numba; seconds on a cold cache) before answering: until
        then /predict and /recommend answer 503 at once instead of blocking, and /healthz says why."""
        self.health.ready = False
        try:
            self.recommender.predict_many(np.array([0, 1]), np.array([0, 1]))
            self.recommender.predict_many(np.array(["warm-up"], dtype=object), np.array([0]))
        finally:
            self.health.ready = True

    def privacy(self) -> dict:
        """What /privacy reports (see ``privacy_figures``)."""
        figures = privacy_figures(self.recommender.model, self.recommender.monitor, self.audit,
                                  self.ledger)
        figures["budget_exhausted"] = self.budget_stopped
        fallback = getattr(self.recommender.model, "fallback_figures", None)
        if fallback is not None:  # which model answers (factors or the private baseline) and why
            figures.update(fallback())
        figures["epsilon_budget"] = self.budget
        figures.update(self._versus_private_mean())   # exact: withheld by the release in DP
        mech = self.origin.get("mechanism")
        mixed = mech == MIXED
        if mech and not mixed and not self.origin["raw"] and figures["mode"] == "non-private":
            figures.update(LDPSettings.from_mechanism(mech).figures())  # every rating came perturbed
        if self.origin["perturbed_on_device"] or self.origin["raw"]:
            figures["local_dp"] = {**self.origin, "debiased": self.recommender.debias is not None,
                                   "server_saw_raw_ratings": self.origin["raw"] > 0,
                                   **({"guarantee": MIXED_LINE} if mixed else {})}
        return figures

    @property
    def privacy_mode(self) -> PrivacyMode:
        """The mode the served model trains in (LDP when its ratings came perturbed)."""
        return service_mode(self)

    def record_origin(self, headers, n_ratings: int) -> None:
        """Count ratings that arrived perturbed on the device (an LDP header) or raw."""
        from sketchrec.privacy.ldp import HEADER, parse_header
        named = dict(headers or []).get(HEADER)
        mechanism = parse_header(named) if named is not None else None
        if mechanism is None:
            self.origin["raw"] += n_ratings
            return
        self.origin["perturbed_on_device"] += n_ratings
        key_local_ids(self.recommender.model)
        combined = combine(self.origin["mechanism"], mechanism)
        if self.origin["mechanism"] != combined:
            self.origin["mechanism"] = combined
            self.apply_ldp_debias()

    def record_audit(self, audit: dict | None) -> None:
        """The canary audit's result: it reads the trained model, so it exists only once
        learning has ended (after construction); /privacy reports it from then on."""
        self.audit = audit

    def apply_ldp_debias(self) -> None:
        """With ``debias_ldp``: map predictions back through the recorded mechanism's mean."""
        mech = self.origin["mechanism"]
        if self.debias_ldp and mech:   # a mixed origin has no one map: an earlier one is dropped
            from sketchrec.privacy.ldp import Debias
            self.recommender.debias = (Debias(mech["epsilon"], *mech["range"])
                                       if mech["mechanism"] == "BoundedLaplace" else None)

    def begin_private_pass(self, unit: str, delta: float, budget: float | None) -> bool:
        """For a DP-SGD model: account one more pass over the stream before learning from it
        (the ledger comes from the checkpoint when there is one, so a restart never resets it).
        False when that pass would exceed the budget: the service then serves without learning."""
        if not self.privacy_mode.dp_sgd or self.recommender.model.dp.noise_multiplier == 0:
            return True
        dp = self.recommender.model.dp
        if self.ledger is None:
            self.ledger = PrivacyLedger(unit, delta)
        self.budget = budget
        self.budget_stopped = not self.ledger.begin_pass(dp.stream_multiplier(), budget)
        return not self.budget_stopped

    def pause(self) -> None:
        self.recommender.learning.clear()

    def resume(self) -> None:
        self.recommender.learning.set()

    def checkpoint(self) -> dict:
        """Write a checkpoint of the whole serving state now; what /stats shows of it, and its path.
        OSError (full disk, ...) leaves no partial file and the previous checkpoint in force."""
        if self.checkpoints is None:
            raise RuntimeError("no checkpoint directory configured")
        with self._lock:
            parts = {**self.recommender.state_parts(), **operator_parts(self.recommender.model)}
            path = self.checkpoints.save(parts,
                                         {"ratings_learned": self.ratings_learned,
                                          "offsets": self.offsets, "topic_id": self.topic_id,
                                          "skipped": dict(self.skipped),
                                          "errors": self.errors.to_dict(),
                                          "model_class": self.model_cls.__name__,
                                          "privacy_ledger": self.ledger and self.ledger.to_dict(),
                                          "origin": self.origin})
            # its name, not its filesystem path: /stats is public
            self.last_checkpoint = {"name": path.name, "seq": self.checkpoints.newest_seq(),
                                    "ratings_learned": self.ratings_learned, "at": time.time()}
            return {**self.last_checkpoint, "path": str(path)}

    @classmethod
    def from_checkpoint(cls, directory: str | Path, model_classes: dict | None = None, *,
                        read_only: bool = True, monitor=None,
                        debias_ldp: bool = False) -> "LearningService":
        """The service continuing from the newest valid checkpoint in ``directory`` (NoCheckpoint
        when there is none). ``model_classes`` maps the recorded class name to the class
        (default ``models.registry.MODELS``); ``monitor`` is fed by what it learns from now on
        (a monitor's reservoir is never checkpointed). UnreadableCheckpoints when there are
        checkpoints and none verifies (``CheckpointStore.set_aside`` starts over knowingly)."""
        store = CheckpointStore(directory)
        ckpt = store.latest()
        if ckpt is None and store.paths():
            raise UnreadableCheckpoints(
                f"none of the {len(store.paths())} checkpoints in {directory} verifies: "
                "refusing to start over with an empty model (restore one, or start over knowingly)")
        if ckpt is None:
            raise NoCheckpoint(f"no valid checkpoint in {directory}")
        model_cls = (model_classes or MODELS)[ckpt.meta["model_class"]]
        return cls(Recommender.from_parts(ckpt.parts, model_cls, monitor=monitor), store,
                   read_only=read_only, model_cls=model_cls, debias_ldp=debias_ldp, restored=ckpt)

    def _adopt(self, ckpt: Checkpoint) -> None:
        restore_operator_parts(self.recommender.model, ckpt.parts)
        self.offsets = dict(ckpt.meta.get("offsets", {}))
        self.topic_id = ckpt.meta.get("topic_id")
        self.skipped = Counter(ckpt.meta.get("skipped", {}))
        self.errors = ErrorStats.from_dict(ckpt.meta.get("errors", ErrorStats().to_dict()))
        self.origin = ckpt.meta.get("origin", self.origin)
        ledger = ckpt.meta.get("privacy_ledger")
        self.ledger = PrivacyLedger.from_dict(ledger) if ledger else None
        self.last_checkpoint = ckpt.summary()

    def reload_if_newer(self) -> bool:
        """Read-only mode: swap in the newest valid checkpoint if it is newer than ours."""
        if self.checkpoints is None or self.checkpoints.newest_seq() <= (self.last_checkpoint or {}).get("seq", 0):
            return False
        ckpt = self.checkpoints.latest()
        if ckpt is None or ckpt.seq <= (self.last_checkpoint or {}).get("seq", 0):
            return False
        self.recommender = Recommender.from_parts(ckpt.parts, self.model_cls)  # one reference swap
        self._adopt(ckpt)
        return True


class FeedingLearner:
    """The service's recommender as a prequential replay's learner: each batch's errors also go
    to the service (its /stats and the dashboard's RMSE), as ``consume`` feeds them."""

    def __init__(self, service: LearningService):
        self.service = service

    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        from sketchrec.stream.kafka.intake import finite_errors   # as the consumer drops them
        predictions = self.service.recommender.learn_many(users, items, ratings, epoch=epoch)
        real = real_rows(users)   # audit canaries are not part of the reported accuracy
        self.service.errors.add(*finite_errors(predictions[real], np.asarray(ratings)[real]))
        return predictions

    def __getattr__(self, name: str):
        return getattr(self.service.recommender, name)
