"""Serving from several processes (``stream.serving.workers``): reader processes answer from the
model the learner keeps in shared memory, while it learns."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from sketchrec.data import SyntheticStream, read_ratings
from sketchrec.models import SketchMF
from sketchrec.models.mix import Experts
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving.workers.block import PREFIX
from sketchrec.stream.serving.workers.pool import WorkerPool
from conftest import free_port, http, served_port, stop_processes, wait_for, wait_healthy

TOKEN = "workers-admin"
K = 10


# A client process: /recommend for the users in argv, round robin, for argv's seconds and at least
# 30 answers (readers on a cold numba cache compile their kernels first: up to a minute); the answers
# as JSON on stdout. A script of its own, not a function of this module: a spawned process would
# import the module, and with it the package, only to send requests.
_HAMMER = """
import json, sys, time
import httpx
url, users, seconds, k = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
out = []
with httpx.Client(base_url=url, timeout=90) as client:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or len(out) < 30:
        user = users[len(out) % len(users)]
        r = client.get("/recommend", params={"user": user, "k": k})
        out.append((user, r.status_code, r.text))
json.dump(out, sys.stdout)
"""


def _hammer(url: str, users: list, seconds: float, clients: int, log) -> list:
    """``clients`` client processes at once, each over its share of ``users``: every answer."""
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, url, json.dumps(users[n::clients]),
                               str(seconds), str(K)], stdout=subprocess.PIPE, stderr=log)
             for n in range(clients)]
    try:
        outs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        stop_processes(procs)
    assert all(proc.returncode == 0 for proc in procs), log.name
    return [tuple(answer) for out in outs for answer in json.loads(out)]


def _segments() -> set:
    """This process's shared-memory segments (the pools here publish in-process; other processes on
    the machine — other test runs — have their own and must not count)."""
    mine = f"{PREFIX}{os.getpid()}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(mine)}


@pytest.fixture(scope="module")
def data(ml100k):
    return read_ratings(ml100k)[0]


def test_readers_answer_from_the_live_model_while_it_learns(data, tmp_path):
    first, rest = data.take(slice(0, 50_000)), data.take(slice(50_000, None))
    # the default model (mix: Hedge over a bias baseline and a sketch learner) is shared too
    rec = Recommender(Experts(capacity=3000), pair_capacity=200_000, user_capacity=10_000)
    rec.learn_many(first.users, first.items, first.ratings)
    service = LearningService(rec, CheckpointStore(tmp_path))
    before = _segments()
    pool = WorkerPool(service, ("127.0.0.1", 0), 2, admin_token=TOKEN, access=False).start()
    mine = _segments() - before
    seen: dict = {}
    for u, i in zip(first.users.tolist(), first.items.tolist()):
        seen.setdefault(str(u), set()).add(str(i))
    users = sorted(seen)[:200]
    stop = threading.Event()

    def learn():   # the second half, over and over (slowly enough to leave the clients a core)
        while not stop.is_set():
            for batch in rest.batches(2000):
                if stop.is_set():
                    break
                rec.learn_many(batch.users, batch.items, batch.ratings)
                time.sleep(0.002)

    learner = threading.Thread(target=learn)
    try:
        base = http.get(f"{pool.url}/stats").json()["ratings_learned"]
        probe = http.get(f"{pool.url}/predict", params={"user": "1", "item": "1"}).json()["rating"]
        learner.start()
        with open(tmp_path / "clients.log", "w") as log:
            answers = _hammer(pool.url, users, 3.0, 3, log)
        assert len(answers) > 50
        for user, status, text in answers:
            assert status == 200, text
            body = json.loads(text)
            assert len(body["items"]) == K and body["source"] == "model"
            assert all(math.isfinite(x["score"]) for x in body["items"])
            assert not {str(x["item"]) for x in body["items"]} & seen[user], "a rated item was recommended"
        # the readers see learning progress: the counters live in the shared block, the cells too
        stats = http.get(f"{pool.url}/stats").json()
        assert stats["ratings_learned"] > base and stats["worker_pid"] in pool.pids()
        assert http.get(f"{pool.url}/predict", params={"user": "1", "item": "1"}).json()["rating"] != probe
        # a new item reaches every reader's catalogue within the publication interval (+ slack)
        stop.set()
        learner.join()
        # learning stopped: every reader answers the learner's own predictions (same cells, same weights)
        pairs = [(str(u), str(i)) for u, i in zip(rest.users[:30].tolist(), rest.items[-30:].tolist())]
        expected = rec.predict_many(*(np.array(c, dtype=object) for c in zip(*pairs)))
        with httpx.Client(base_url=pool.url) as client:
            served = [client.get("/predict", params={"user": u, "item": i}).json()["rating"]
                      for u, i in pairs]
        assert served == pytest.approx(expected.tolist(), abs=1e-6)
        # ... and ranks /recommend by the learner's served ranking (its popularity term, published
        # every POPULAR_S), not by the model alone: the same items, the same blended scores
        assert rec.item_snapshot().popular is not None, "the learner has no served ranking to share"
        # a bound on waiting, not a speed claim: the learner rebuilds its snapshot at most every
        # max(refresh_s, 10 x build time) and publishes it every POPULAR_S, both stretched on a
        # loaded machine (5 s was once too short beside a parallel suite)
        deadline = time.monotonic() + 30
        while True:   # the learner's snapshot settles (rebuilt at most every refresh_s), then the readers'
            wanted = {u: rec.recommend(u, K)[0] for u in users[:10]}
            got = {u: [(x["item"], x["score"]) for x in http.get(
                f"{pool.url}/recommend", params={"user": u, "k": K}).json()["items"]] for u in wanted}
            same = all([str(i) for i, _ in got[u]] == [str(i) for i, _ in wanted[u]]
                       and [s for _, s in got[u]] == pytest.approx([s for _, s in wanted[u]], abs=1e-6)
                       for u in wanted)
            if same:
                break
            assert time.monotonic() < deadline, f"readers do not serve the learner's ranking: {got['1'][:3]} {wanted['1'][:3]}"
            time.sleep(0.1)
        rec.learn_many(np.array(["1"], dtype=object), np.array(["brand-new"], dtype=object), np.array([5.0]))
        # published by the learner's publisher thread: a bound on waiting (it was 2 s, a speed
        # claim a loaded machine can break), polled slowly enough to leave that thread the interpreter
        wait_for(lambda: http.get(f"{pool.url}/stats").json()["catalogue_items"] == len(rec.catalogue),
                 "the catalogue published to the readers", timeout=60, every=0.05)
        # admin verbs sent to any worker act on the learner
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http.post(f"{pool.url}/pause", headers=auth).json() == {"paused": True}
        assert not rec.learning.is_set()
        assert http.post(f"{pool.url}/resume", headers=auth).json() == {"paused": False}
        assert rec.learning.is_set()
        assert http.post(f"{pool.url}/checkpoint", headers=auth).json()["ratings_learned"] == rec.model.n_learned
        assert http.post(f"{pool.url}/pause").status_code == 401
    finally:
        stop.set()
        readers = pool.pids()
        pool.stop()
    assert mine and not mine & _segments(), "a shared-memory segment was left behind"
    for pid in readers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_read_replica_moves_to_a_newer_checkpoint(tmp_path):
    data = SyntheticStream(n_ratings=8000, n_users=300, n_items=200, seed=0).all()
    rec = Recommender(SketchMF(capacity=500, dim=16), pair_capacity=50_000)
    rec.learn_many(data.users[:5000], data.items[:5000], data.ratings[:5000])
    writer = LearningService(rec, CheckpointStore(tmp_path))
    writer.checkpoint()
    replica = LearningService.from_checkpoint(tmp_path)
    before = _segments()
    pool = WorkerPool(replica, ("127.0.0.1", 0), 1, access=True, reload_every=0.1).start()   # one reader: lean
    token = {"token": pool.user_tokens.mint("3")}   # the learner's key
    try:
        assert http.get(f"{pool.url}/stats").json()["ratings_learned"] == 5000
        assert http.get(f"{pool.url}/predict", params={"user": "3", "item": "4"}).status_code == 401
        rec.learn_many(data.users[5000:], data.items[5000:], data.ratings[5000:])
        writer.checkpoint()
        wait_for(lambda: http.get(f"{pool.url}/stats").json()["ratings_learned"] == 8000,
                 "the newer checkpoint served", timeout=120, every=0.05)
        served = http.get(f"{pool.url}/predict", params={"user": "3", "item": "4", **token}).json()["rating"]
        assert served == pytest.approx(rec.predict("3", "4"))
    finally:
        pool.stop()
    assert not (_segments() - before)



def test_a_catalogue_beyond_the_block_is_mirrored_as_a_prefix_and_said_once(caplog):
    """Readers can only rank the items the block's catalogue buffers hold: past them the
    learner keeps learning every item, the readers keep the prefix, and the log says so once."""
    from sketchrec.stream.serving.workers.block import SharedBlock
    from sketchrec.stream.serving.workers.pool import Publisher
    rec = Recommender(SketchMF(dim=4, capacity=200), pair_capacity=1000, user_capacity=100)
    service = LearningService(rec)
    block = SharedBlock.create(rec, catalogue_capacity=8)
    try:
        publisher = Publisher(service)
        rec.learn_many(["u"] * 5, [f"i{n}" for n in range(5)], [4.0] * 5)
        with caplog.at_level("WARNING"):
            assert publisher.document(block)["catalogue"][0] == 5   # it fits: no warning
            assert "catalogue_truncated" not in caplog.text
            for round_ in range(2):   # grown past the buffers, twice: said once
                rec.learn_many(["u"] * 5, [f"j{round_}-{n}" for n in range(5)], [4.0] * 5)
                assert publisher.document(block)["catalogue"][0] == 8
        assert caplog.text.count("catalogue_truncated") == 1
        assert len(rec.catalogue) == 15
    finally:
        block.unlink()   # (the model's arrays live in it: unlinked, not closed, as WorkerPool.stop)


# --- supervision and health with real processes: a learner (`sketchrec serve --workers 2`) and its
# readers, stopped, killed and signalled -------------------------------------------------------------

def _checkpoint(tmp_path) -> str:
    data = SyntheticStream(n_ratings=4000, n_users=200, n_items=150, seed=1).all()
    rec = Recommender(SketchMF(capacity=400, dim=8), pair_capacity=20_000)
    rec.learn_many(data.users, data.items, data.ratings)
    LearningService(rec, CheckpointStore(tmp_path)).checkpoint()
    return str(tmp_path)


def _learner(ckpt: str, port: int, workers: int = 2, **popen) -> subprocess.Popen:
    """`serve --workers` over ``ckpt`` on ``port``; its output (and its readers') in the file
    ``proc.log`` (a pipe read only at the end could fill and block them)."""
    log = Path(ckpt).with_suffix(f".serve-{port}-{workers}.log")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sketchrec", "serve", "--checkpoint", ckpt,
                                 "--workers", str(workers), "--listen", f"127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT, **popen)
    proc.log = log
    return proc


def _ready(proc, port: int) -> None:
    """Until /healthz is 200 (a cold numba cache compiles for minutes on a busy machine)."""
    wait_healthy(f"http://127.0.0.1:{port}", proc, log=proc.log)


def _readers(learner_pid: int) -> list[int]:
    """Reader processes of that learner still running (their command line names its block)."""
    mark = f"{PREFIX}{learner_pid}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{entry}/stat", "rb") as f:
                    zombie = f.read().rpartition(b")")[2].split()[0] == b"Z"
            except OSError:
                continue
            if mark in cmd and b"supervision.py" in cmd and not zombie:
                found.append(int(entry))
    return found


def _until(check, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    return check()


def _healthz(port: int) -> tuple[int, dict] | None:
    try:
        r = http.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        return r.status_code, r.json()
    except httpx.TransportError:
        return None


def _binds(port: int) -> bool:
    try:
        socket.create_server(("127.0.0.1", port)).close()
        return True
    except OSError:
        return False


def test_healthz_of_the_readers_is_503_within_ten_seconds_of_the_learner_stopping(tmp_path):
    """Before: readers said ok while their learner was frozen (SIGSTOP) for minutes."""
    proc = _learner(_checkpoint(tmp_path), 0)   # port 0: the learner binds it, its log says which
    try:
        port = served_port(proc.log, proc)
        _ready(proc, port)
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        answer = _until(lambda: (h := _healthz(port)) and h[0] == 503 and h, 15)
        assert answer and time.monotonic() - t0 < 10, answer
        assert any(why.startswith("learner not responding") for why in answer[1]["reasons"])
        assert len(_readers(proc.pid)) == 2   # stopped for less than the watchdog: kept
        os.kill(proc.pid, signal.SIGCONT)
        assert _until(lambda: (_healthz(port) or (0,))[0] == 200, 60)   # a bound, not a claim
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("when", ["a reader starting", "readers serving"])
def test_readers_never_outlive_a_learner_killed_and_a_restart_binds(tmp_path, when):
    """Before: a learner kill -9'd while its readers started left them running, answering from a
    dead model and holding the port: the restart failed with 'Address already in use'."""
    ckpt, port = _checkpoint(tmp_path), free_port()
    proc = _learner(ckpt, port)
    try:
        if when == "a reader starting":   # the first reader exists, its imports not done
            assert _until(lambda: _readers(proc.pid), 300, 0.05), "no reader started"
        else:
            _ready(proc, port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        # bounds for a loaded machine: the readers end on their parent's death (a signal)
        assert _until(lambda: not _readers(proc.pid), 30), f"readers outlived the learner: {_readers(proc.pid)}"
        assert _until(lambda: _binds(port), 30), "the port is still held"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    # the restart binds the port and serves: one process is enough to show it (no readers of its
    # own, which the kill above is not about)
    again = _learner(ckpt, port, workers=1)
    try:
        _ready(again, port)
    finally:
        again.terminate()
        again.wait(timeout=30)


def test_a_reader_started_by_another_process_ends_with_its_learner(tmp_path):
    """The parent-death signal only covers the process that started a reader: the watchdog (the
    learner's pid and heartbeat in the block) ends one started by anybody else."""
    from sketchrec.stream.serving.workers import supervision
    learner = _learner(_checkpoint(tmp_path), 0)
    strays = []
    try:
        _ready(learner, served_port(learner.log, learner))
        block = next(n for n in os.listdir("/dev/shm") if n.startswith(f"{PREFIX}{learner.pid}-"))
        env = {k: v for k, v in os.environ.items() if k != supervision.PARENT_ENV}
        for watchdog in ("60", "3"):
            sock = socket.create_server(("127.0.0.1", 0))
            secrets_in, secrets_out = os.pipe()   # a reader takes its secrets from a pipe
            os.write(secrets_out, json.dumps({"user_token_key": None, "admin_token": None}).encode())
            os.close(secrets_out)
            strays.append((subprocess.Popen(
                [sys.executable, supervision.__file__, block, str(sock.fileno()), "9", "", "off", "0",
                 str(secrets_in)], pass_fds=(sock.fileno(), secrets_in),
                env={**env, supervision.WATCHDOG_ENV: watchdog},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), sock))
            os.close(secrets_in)
        for stray, sock in strays:
            assert _until(lambda: (_healthz(sock.getsockname()[1]) or (0,))[0] == 200, 300), "no answer"
        os.kill(learner.pid, signal.SIGSTOP)   # frozen: the reader with a 3 s watchdog ends
        short, long_ = strays[1][0], strays[0][0]
        assert short.wait(timeout=60) == 0 and "no heartbeat from learner" in short.communicate()[1]
        assert long_.poll() is None
        os.kill(learner.pid, signal.SIGKILL)   # gone: the other ends too
        assert long_.wait(timeout=60) == 0 and "ended" in long_.communicate()[1]
    finally:
        os.kill(learner.pid, signal.SIGCONT)
        for stray, sock in strays:
            if stray.poll() is None:
                stray.kill()
            sock.close()
        if learner.poll() is None:
            learner.kill()
        learner.wait(timeout=10)


@pytest.mark.parametrize("how", ["SIGTERM to the learner", "Ctrl-C to the group"])
def test_a_stop_during_worker_start_up_ends_quietly(tmp_path, how):
    """Before: a KeyboardInterrupt traceback."""
    port = free_port()   # picked here: the stop may come before the learner says where it serves
    proc = _learner(_checkpoint(tmp_path), port, start_new_session=True)
    try:
        # every 50 ms: a reader's imports take far longer, and each look walks /proc
        assert _until(lambda: _readers(proc.pid), 300, 0.05), "no reader started"
        time.sleep(0.3)   # the readers are importing
        if how == "SIGTERM to the learner":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.log.read_text()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _until(lambda: not _readers(proc.pid), 30) and _until(lambda: _binds(port), 30)
