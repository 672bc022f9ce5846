"""A reader process: the HTTP app over the live model a learner keeps in shared memory.

``ReplicaService`` stands where a ``LearningService`` stands for ``http.create_app``: its
recommender reads the model and the filters straight from a ``SharedBlock``, a follower thread
takes the learner's published document every ``POLL_S`` (new catalogue ids, the popular list,
/stats and /privacy figures, health), and the admin verbs (pause, resume, checkpoint) and posted
ratings (``POST /ratings``, relayed with their credentials: ``stream.feedback.ForwardedFeedback``)
are forwarded to the learner's loopback endpoint. When the learner moves to a new block (a read
replica that loaded a newer checkpoint) the follower attaches to it and swaps the recommender in
one reference assignment, as ``LearningService.reload_if_newer`` does.

Run as ``python -m sketchrec.stream.serving.workers.reader BLOCK FD INDEX ADMIN_URL ACCESS NICE SECRETS_FD`` (the
pool runs ``supervision.py`` by path, which guards first): it serves the listening socket FD
(inherited) until SIGINT/SIGTERM, or until its learner is gone (``supervision``: the parent-death
signal and the watchdog on the block's heartbeat). /healthz answers 503 once the learner's
heartbeat is older than ``HEARTBEAT_STALE_S`` (a stalled or frozen learner), with the learner's
own published problems (broker, lag, checkpoints) beside the reader's.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import threading
import time
import urllib.request
from dataclasses import replace

import numpy as np

from sketchrec.stream.feedback import ForwardedFeedback, Refusal, loopback_call
from sketchrec.stream.health import Health
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.titles import Titles
from sketchrec.stream.serving.workers.block import SharedBlock
from sketchrec.stream.serving.workers.supervision import PARENT_ENV, guard, orphaned, watchdog_s

__all__ = ["PARENT_ENV", "READY_BASE", "ReplicaService", "reader_main"]

POLL_S = 0.025   # how often a reader looks for a newer published document
HEARTBEAT_STALE_S = 3.0   # a learner silent this long is reported on /healthz (it beats every 50 ms)
WATCH_EVERY = 20          # polls between two checks that the learner is alive (0.5 s)
READY_BASE = 4   # control word READY_BASE + index: reader ``index`` is up (its pid)


class SharedCatalogue:
    """The learner's catalogue as published: ids decoded once, keys read from the shared buffer."""

    def __init__(self, block: SharedBlock):
        self.block, self.ids = block, []
        self._keys = block.view("catalogue_keys")
        self._own = np.empty(0, dtype=np.uint64)   # this reader's copy of the keys it holds
        self._n = self._bytes = self._generation = 0

    def sync(self, n: int, nbytes: int, generation: int = 0) -> None:
        if generation != self._generation:   # the learner compacted its catalogue: taken afresh
            self.ids, self._n, self._bytes, self._generation = [], 0, 0, generation
            self._own = np.empty(0, dtype=np.uint64)
        if n > self._n:
            self.ids.extend(self.block.read_ids(self._bytes, nbytes))
            # the keys are copied: the learner rewrites the shared rows when it compacts
            self._own = np.concatenate([self._own, self._keys[self._n:n]])
            self._n, self._bytes = n, nbytes   # after the ids: a reader never sees more than exist

    def snapshot(self) -> tuple[list, np.ndarray]:
        n = self._n
        return self.ids[:n], self._own[:n]

    def __len__(self) -> int:
        return self._n


class PublishedPopular:
    """The learner's most rated items, as it last published them."""

    def __init__(self, capacity: int = 1000):
        self.capacity, self.items = capacity, []

    def most_common(self, n: int | None = None) -> list[tuple[object, int]]:
        return [tuple(pair) for pair in self.items[:n]]

    def __len__(self) -> int:
        return len(self.items)


class ReplicaRecommender(Recommender):
    """A recommender over a shared block. Reads only; a score that is not finite (a learner
    diverging, caught mid-write) is never answered: predictions fall back to the global mean and
    such items are left out of recommendations."""

    _served: tuple | None = None   # [rows, share] of the published served-ranking term (``adopt``)
    _ranked: tuple | None = None   # (snapshot, served, the snapshot with the term attached)

    @classmethod
    def over(cls, block: SharedBlock) -> "ReplicaRecommender":
        # the served ranking's state (its weights, the count-min's counts) stays in the learner's
        # process, which publishes its popularity term: readers add it (``item_snapshot``)
        rec = cls(block.model(), pair_capacity=1, user_capacity=1, served_ranking=False)
        rec.pairs_seen, rec.users_seen = block.bloom("pairs_seen"), block.bloom("users_seen")
        rec.catalogue, rec.popularity, rec.block = SharedCatalogue(block), PublishedPopular(), block
        return rec

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        out = super().predict_many(users, items, clip=clip)
        bad = ~np.isfinite(out)
        if bad.any():
            out = np.where(bad, self.model.global_mean if np.isfinite(self.model.global_mean) else 0.0, out)
        return out

    def recommend(self, user, k: int):
        items, source = super().recommend(user, k)
        return [(i, s) for i, s in items if np.isfinite(s)], source

    def item_snapshot(self, wait: bool = True):
        """The item snapshot with the learner's served-ranking term (see ``adopt``) attached, so a
        reader ranks as the learner does. The term is per catalogue row, written in place every
        ``POPULAR_S``: a reader may combine it with factors up to that much newer, or catch a write
        halfway (per cell, each cell finite); rows the term does not cover yet (items newer than
        it) get its lowest value: ranked as the least popular."""
        snap = super().item_snapshot(wait)
        served, cached = self._served, self._ranked
        if served is None or not len(snap.ids):
            return snap
        if cached is None or cached[0] is not snap or cached[1] is not served:
            rows = min(served[0], len(snap.ids))
            term = self.block.view("popular_term")[:len(snap.ids)].copy()
            term[rows:] = term[:rows].min() if rows else 0.0
            cached = self._ranked = (snap, served, replace(snap, popular=term, share=served[1]))
        return cached[2]

    def adopt(self, doc: dict) -> None:
        """Take the published catalogue, popular list, served-ranking term and LDP map."""
        self.catalogue.sync(*doc["catalogue"])
        self.popularity.items = doc.get("popular", self.popularity.items)   # sent every POPULAR_S
        if "served" in doc:   # sent with the popular list
            self._served = tuple(doc["served"]) if doc["served"] else None
        if doc.get("debias") and self.debias is None:
            from sketchrec.privacy.ldp import Debias
            self.debias = Debias(*doc["debias"])


class ReplicaHealth(Health):
    """This reader's readiness (its own warm-up), the learner's heartbeat in the block and the
    learner's published problems."""

    def __init__(self, heartbeat_age=lambda: 0.0):
        super().__init__()
        self.published: dict = {"problems": [], "stats": {}}
        self.heartbeat_age = heartbeat_age

    def problems(self) -> list[str]:
        age = self.heartbeat_age()
        stale = [f"learner not responding (no heartbeat for {age:.0f} s)"] if age > HEARTBEAT_STALE_S else []
        return super().problems() + stale + [p for p in self.published["problems"]
                                             if not (p.startswith("model not ready") and self.ready)]

    def broker(self) -> dict | None:
        return self.published["stats"].get("broker")


class ReplicaService:
    """What ``create_app`` needs of a service, read from the learner's block (module docstring)."""

    def __init__(self, block: SharedBlock, admin_url: str | None = None, admin_token: str | None = None):
        self.block, self.admin_url, self.admin_token = block, admin_url, admin_token
        self.read_only = bool(block.header.get("read_only"))
        self.checkpoints = True if block.header.get("checkpoints") else None   # the learner has a store
        self.origin = block.header.get("origin", {})
        # posted ratings are relayed to the learner's own endpoint, which takes them as one process does
        self.feedback = (ForwardedFeedback(admin_url, block.header.get("rating_range"))
                         if admin_url else Refusal("readers"))
        items = block.header.get("items_file")   # --items: the learner's titles, from its file
        self.titles = Titles.load(items) if items else None
        self.health = ReplicaHealth(lambda: self.block.heartbeat_age())
        self.recommender = ReplicaRecommender.over(block)
        self._seq = 0
        self._rate = (time.perf_counter(), self.ratings_learned)
        self.follow()

    @property
    def ratings_learned(self) -> int:
        return self.recommender.model.n_learned

    def follow(self) -> bool:
        """Take the newest published document, moving to a new block if the learner did."""
        self._seq, doc = self.block.read_meta(self._seq)
        if doc is None:
            return False
        if doc.get("moved_to"):
            block = SharedBlock.attach(doc["moved_to"])
            rec = ReplicaRecommender.over(block)
            rec.popularity.items = self.recommender.popularity.items   # until the next ranking
            self._seq, doc = block.read_meta(0)
            if doc is None:
                return False
            rec.adopt(doc)
            self.block, self.recommender = block, rec   # the app reads service.recommender per request
        else:
            self.recommender.adopt(doc)
        self.health.published = doc
        return True

    def follow_forever(self, stop: threading.Event) -> None:
        """Follow the learner's documents until it is gone (its parent, its pid, or its heartbeat
        for longer than the watchdog's limit): then set ``stop``."""
        parent, limit = os.getppid(), watchdog_s()
        for n in itertools.count():
            if stop.wait(POLL_S):
                return
            why = "parent ended" if os.getppid() != parent else (
                orphaned(self.block, limit) if n % WATCH_EVERY == 0 else None)
            if why is not None:
                print(f"serving worker {os.getpid()} ends: {why}", file=sys.stderr, flush=True)
                stop.set()   # no model to answer from
                return
            self.follow()

    def stats(self) -> dict:
        """The learner's published figures, with the live count of ratings learned."""
        now, learned = time.perf_counter(), self.ratings_learned
        then, before = self._rate
        self._rate = (now, learned)
        return {**self.health.published["stats"], "ratings_learned": learned,
                "throughput_per_s": (learned - before) / max(now - then, 1e-9), "worker_pid": os.getpid()}

    def privacy(self) -> dict:
        return self.health.published.get("privacy", {})

    warm_up = LearningService.warm_up   # the same kernels, compiled (or loaded) before answering

    # admin verbs: the learner's (this process only reads)
    def _forward(self, verb: str) -> dict:
        request = urllib.request.Request(f"{self.admin_url}/{verb}", method="POST",
                                         headers={"Authorization": f"Bearer {self.admin_token}"})
        status, answer = loopback_call(request, 60)
        if status >= 400:   # the learner's refusal, raised as its own process would raise it
            detail = answer.get("detail", f"the learner answered {status}")
            raise (OSError if status == 507 else RuntimeError)(detail)
        return answer

    def pause(self) -> None:
        self._forward("pause")

    def resume(self) -> None:
        self._forward("resume")

    def checkpoint(self) -> dict:
        return self._forward("checkpoint")


def reader_main(argv: list[str]) -> int:
    """The reader process (see module docstring)."""
    guard()   # again when run with -m: idempotent
    from sketchrec.privacy.access import UserTokens
    from sketchrec.stream.serving import server as servers
    from sketchrec.stream.serving.http import create_app
    name, fd, index, admin_url, access, nice, secrets_fd = argv
    with os.fdopen(int(secrets_fd), "rb") as pipe:   # the pool's secrets: never in our environment
        secrets = json.loads(pipe.read())
    os.nice(int(nice))   # > 0: the learner (and its learning rate) goes first on a busy machine
    block = SharedBlock.attach(name)
    service = ReplicaService(block, admin_url or None, secrets["admin_token"])
    key = secrets["user_token_key"]
    if access == "on" and key is None:
        raise SystemExit("reader: per-user access control is on but the pool sent no user-token key")
    tokens = UserTokens(bytes.fromhex(key)) if access == "on" else False
    app = create_app(service, service.admin_token, tokens)
    server = servers.uvicorn_server(app)
    stop = threading.Event()
    threading.Thread(target=service.follow_forever, args=(stop,), daemon=True, name="follow").start()

    def end_when_stopped():   # the learner is gone: end gracefully, and surely within 2 s
        stop.wait()
        server.should_exit = True
        time.sleep(2)
        os._exit(0)

    threading.Thread(target=end_when_stopped, daemon=True).start()

    service.warm_up()   # before accepting: a connection waits for a warm worker, never a 503
    deadline = time.monotonic() + 2   # and for the popular list (published every POPULAR_S)
    while not len(service.recommender.popularity) and len(service.recommender.catalogue) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    # the serving process's settings of server.ServerThread's (a frozen start-up heap: no GC stall)
    servers.settle_for_serving()
    block.ctl[READY_BASE + int(index)] = os.getpid()
    server.run(sockets=[socket.socket(fileno=int(fd))])
    return 0


if __name__ == "__main__":
    sys.exit(reader_main(sys.argv[1:]))
