"""The serving readers get their secrets (the user-token key, the admin token) down a pipe, never in
their environment, which every process of the same user can read in /proc/PID/environ."""

import os
import subprocess
import sys

import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.privacy.access import KEY_ENV
from sketchrec.privacy.admin_token import ENV
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving.workers.pool import WorkerPool
from conftest import http

ADMIN = "secret-admin-token-for-the-test"


def environ_of(pid: int) -> bytes:
    """What another process of the same user reads of ``pid``'s environment (the attack)."""
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read()


def test_the_attack_reads_a_secret_from_a_readers_environment():
    # the deliberately broken variant: a secret copied into a child's environment is readable
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                            env={**os.environ, KEY_ENV: "ab" * 16}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"   # running its program (not between fork and exec)
        assert f"{KEY_ENV}={'ab' * 16}".encode() in environ_of(proc.pid)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs procfs")
def test_no_reader_environment_holds_the_token_key_or_the_admin_token(monkeypatch):
    monkeypatch.setenv(ENV, ADMIN)          # as an operator may start the learner
    data = SyntheticStream(n_ratings=3000, n_users=100, n_items=80, seed=0).all()
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=20_000)
    rec.learn_many(data.users, data.items, data.ratings)
    pool = WorkerPool(LearningService(rec), ("127.0.0.1", 0), 2, admin_token=ADMIN, access=True).start(timeout=600)
    try:
        key = pool.user_tokens._key.hex()
        pids = [p.pid for p in pool.procs]
        assert len(pids) == 2
        for pid in pids:
            environ = environ_of(pid)
            assert key.encode() not in environ and ADMIN.encode() not in environ
            assert KEY_ENV.encode() not in environ
        # the readers did get the secrets: a token minted under the learner's key is accepted,
        # as is the admin token, by whichever reader answers
        params = {"user": str(int(data.users[0])), "k": 3}
        for _ in range(6):
            assert http.get(f"{pool.url}/recommend", params=params).status_code == 401
            ok = http.get(f"{pool.url}/recommend", params={**params, "token": pool.user_tokens.mint(params["user"])})
            assert ok.status_code == 200
            admin = http.get(f"{pool.url}/recommend", params=params,
                             headers={"Authorization": f"Bearer {ADMIN}"})
            assert admin.status_code == 200
    finally:
        pool.stop()
