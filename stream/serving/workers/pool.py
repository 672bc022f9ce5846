"""Serving from several processes: the learner keeps the model in shared memory, N reader
processes (``serving.reader``) answer from it on one listening port.

``WorkerPool`` (in the learner's process) moves the recommender's arrays into a ``SharedBlock``,
binds the port once and hands the socket to each reader (the kernel gives each new connection to
whichever process accepts first), publishes what is not a fixed array every ``PUBLISH_S``,
restarts a reader that dies, and on ``stop`` ends the readers (SIGTERM, then SIGKILL after
5 s) and unlinks every segment it made. The learner itself answers on a loopback port the readers
forward the admin verbs to (pause, resume, checkpoint: they act on the learner), and, with
``learner_serves``, on the public socket too. A read replica (a read-only service) reloads a
newer checkpoint into a NEW block and tells the readers to move to it, so no reader ever sees a
mix of two checkpoints; the old block is unlinked a few seconds later.

Readers never outlive the learner (``supervision``): each is started through ``supervision.py``,
which asks for the parent-death signal before any heavy import, and watches the learner's pid and
the heartbeat the publisher beats into the block; they run in a process group of their own.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time

from sketchrec.stream.health import log_event
from sketchrec.stream.serving.workers import supervision
from sketchrec.stream.serving.workers.reader import READY_BASE
from sketchrec.stream.serving.workers.supervision import PARENT_ENV
from sketchrec.stream.serving.server import listen, uvicorn_server
from sketchrec.stream.serving.workers.binding import publish_release
from sketchrec.stream.serving.workers.block import PUBLISH_S, SharedBlock, shareable

__all__ = ["WorkerPool", "default_workers", "shareable"]


def default_workers() -> int:
    """One serving process per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


POPULAR_S = 1.0   # the popular list (the dearest part to rank and encode) is refreshed this often


class Publisher:
    """The document readers take (catalogue, LDP map, figures, and every ``POPULAR_S`` the
    popular list, which readers keep meanwhile), built every ``PUBLISH_S`` by the learner's
    publisher thread."""

    def __init__(self, service):
        self.service, self._ranked_at = service, -math.inf
        self._warned = False   # the catalogue outgrew the block (logged once)

    def document(self, block: SharedBlock, popular: bool = False) -> dict:
        svc, rec = self.service, self.service.recommender
        rate = svc._rate
        stats = svc.stats()
        svc._rate = rate   # the learner's own /stats keeps its throughput window
        mech = svc.origin.get("mechanism")
        ids, keys, generation = rec.catalogue.view()   # compacted: a new generation, mirrored afresh
        grown = len(ids) > block.mirrored[0] or generation != getattr(block, "_generation", 0)
        doc = {"catalogue": block.mirror(ids, keys, generation) if grown else block.mirrored,
               "debias": [mech["epsilon"], *mech["range"]] if rec.debias is not None and mech else None,
               "stats": stats, "privacy": svc.privacy(), "problems": svc.health.problems()}
        if grown and not self._warned and block.mirrored[0] < len(rec.catalogue):
            # the block's catalogue buffers are full: readers rank the prefix they hold
            self._warned = True
            log_event("catalogue_truncated", logging.WARNING, items=len(rec.catalogue),
                      readers_hold=block.mirrored[0],
                      fix="serve this catalogue with --workers 1 (the learner answers every item)")
        if popular or time.monotonic() - self._ranked_at >= POPULAR_S:
            doc["popular"], self._ranked_at = rec.popularity.most_common(1000), time.monotonic()
            doc["served"] = self._served_term(block)
        return doc

    def _served_term(self, block: SharedBlock) -> list | None:
        """Write the served ranking's popularity term per catalogue row (the mirrored order) into
        the block and return [rows, the model's share] for the readers, or None where the model is
        ranked by itself (central DP, no served ranking). Rebuilding the learner's item snapshot
        here also keeps the ranking's feedback going while the readers answer every request."""
        snap = self.service.recommender.item_snapshot()
        if snap.popular is None:
            return None
        term = block.view("popular_term")
        rows = min(len(snap.popular), len(term))
        term[:rows] = snap.popular[:rows]
        return [rows, snap.share]

    def publish(self, block: SharedBlock, popular: bool = False) -> None:
        publish_release(self.service.recommender.model)   # a private fallback's new release, if any
        block.publish(self.document(block, popular))


def _items_file(service) -> str | None:
    path = getattr(getattr(service, "titles", None), "path", None)
    return str(path) if path is not None else None


class WorkerPool:
    """``workers`` reader processes serving ``service`` on ``listen`` (see module docstring);
    the same interface as ``server.ServerThread`` (``url``, ``port``, ``thread``, ``stop``)."""

    def __init__(self, service, address: tuple[str, int], workers: int, admin_token: str | None = None,
                 access="auto", learner_serves: bool = False, reload_every: float | None = None,
                 nice: int = 0):
        if not shareable(service.recommender):
            raise ValueError("only a model of fixed arrays (sketch, bias, mix, DP-SGD) can be served "
                             "from several processes")
        self.service, self.workers, self.learner_serves = service, int(workers), learner_serves
        self.admin_token, self.access, self.reload_every = admin_token, access, reload_every
        self.host, self.nice = address[0], int(nice)
        self.sock = listen(*address)
        self.sock.set_inheritable(True)
        self.blocks: list[tuple[SharedBlock, float]] = []   # (block, unlink after): moved away from
        self.procs: list[subprocess.Popen | None] = []
        self._stop = threading.Event()

    # starting ---------------------------------------------------------------------------------
    def start(self, timeout: float = 600.0) -> "WorkerPool":
        """Start the learner's server, the readers and the publisher; return when every reader
        answers (RuntimeError after ``timeout`` s: generous, since readers on a cold numba cache
        compile for minutes on a busy machine, and a reader that dies is seen at once; on any
        exception everything is stopped)."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> "WorkerPool":
        from sketchrec.stream.serving.http import create_app, resolve_access
        tokens = resolve_access(self.service, self.access)
        from sketchrec.privacy.access import KEY_ENV
        from sketchrec.privacy.admin_token import ENV
        # the secrets (the user-token key the readers verify under, the admin token) go down a pipe
        # each reader reads once (``_spawn``), never into its environment: /proc/PID/environ is
        # readable by every process of the same user for as long as the reader runs
        self.env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, ENV)}
        self.user_tokens = tokens
        self._secrets = json.dumps({"user_token_key": None if tokens is None else tokens._key.hex(),
                                    "admin_token": self.admin_token}).encode()
        self.env[PARENT_ENV] = str(os.getpid())   # a reader started after this process died exits
        self.access_flag = "on" if tokens is not None else "off"
        self.app = create_app(self.service, self.admin_token, tokens or False)
        self.publisher = Publisher(self.service)
        self.block = self._new_block()
        atexit.register(self.stop)
        self._serve_learner()
        self.service.health.ready = False
        threading.Thread(target=self.service.warm_up, daemon=True, name="warm-up").start()
        self.procs = [self._spawn(i) for i in range(self.workers)]
        self.publishing = threading.Thread(target=self._publish_loop, daemon=True, name="publish")
        self.publishing.start()
        deadline = time.monotonic() + timeout
        while not all(self.block.ctl[READY_BASE + i] for i in range(self.workers)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError("the serving workers failed to start")
            time.sleep(0.05)
        return self

    def _new_block(self) -> SharedBlock:
        svc = self.service
        block = SharedBlock.create(svc.recommender, extra={
            "read_only": svc.read_only, "origin": svc.origin,
            "checkpoints": svc.checkpoints is not None,
            # how the learner reads posted ratings, which the readers relay to it
            "rating_range": getattr(svc.feedback, "rating_range", None),
            # --items: the readers read the same file, so their answers carry the titles too
            "items_file": _items_file(svc)})
        self.publisher.publish(block, popular=True)
        return block

    def _serve_learner(self) -> None:
        self.admin_sock = socket.create_server(("127.0.0.1", 0))
        self.server = uvicorn_server(self.app)
        sockets = [self.admin_sock] + ([self.sock] if self.learner_serves else [])
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets},
                                       daemon=True, name="http")
        self.thread.start()

    def _spawn(self, index: int) -> subprocess.Popen:
        self.block.ctl[READY_BASE + index] = 0
        admin_url = "http://127.0.0.1:%d" % self.admin_sock.getsockname()[1]
        secrets_in, secrets_out = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, supervision.__file__, self.block.name,
                 str(self.sock.fileno()), str(index), admin_url, self.access_flag, str(self.nice), str(secrets_in)],
                pass_fds=(self.sock.fileno(), secrets_in), env=self.env, stdin=subprocess.DEVNULL,
                # a group of their own: a terminal's Ctrl-C reaches the learner, which stops them
                # (one mid-start-up would print a KeyboardInterrupt traceback)
                process_group=0)
        except BaseException:
            os.close(secrets_out)
            raise
        finally:
            os.close(secrets_in)
        with os.fdopen(secrets_out, "wb") as pipe:   # far below a pipe's buffer: never blocks
            pipe.write(self._secrets)
        return proc

    # running ----------------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        next_reload = time.monotonic() + (self.reload_every or 0)
        while not self._stop.wait(PUBLISH_S):
            self.block.beat()   # the readers' watchdog and health read it
            if self.reload_every and time.monotonic() >= next_reload:
                next_reload = time.monotonic() + self.reload_every
                if self.service.reload_if_newer():
                    self._move()
            self.publisher.publish(self.block)
            self._tend()

    def _move(self) -> None:
        """A newer checkpoint was loaded: readers move to a new block; the old one goes later."""
        old, self.block = self.block, self._new_block()
        old.publish(json.dumps({"moved_to": self.block.name}))
        self.blocks.append((old, time.monotonic() + 5.0))

    def _tend(self) -> None:
        """Unlink blocks every reader has left; restart a reader that died."""
        now = time.monotonic()
        for old, after in [b for b in self.blocks if b[1] <= now]:
            old.unlink()
            self.blocks.remove((old, after))
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None and not self._stop.is_set():
                print(f"serving worker {proc.pid} ended ({proc.returncode}); restarting it",
                      file=sys.stderr, flush=True)
                self.procs[i] = self._spawn(i)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    # stopping ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """End the readers, the learner's server and the publisher; unlink every segment."""
        if self._stop.is_set():
            return
        self._stop.set()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "server", None) is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)
        if getattr(self, "publishing", None) is not None:
            self.publishing.join(timeout=5)
        for block in [getattr(self, "block", None)] + [b for b, _ in self.blocks]:
            if block is None:
                continue
            block.unlink()
        self.sock.close()
        atexit.unregister(self.stop)
