"""A DP-SGD checkpoint served by `serve --workers 2`: two reader processes answer exactly what
one process serving the same checkpoint answers (the private fallback's choice and releases
included), and /privacy says the same."""

import os
import subprocess
import sys

import httpx

from sketchrec.cli.replay import replay_main
from sketchrec.privacy.admin_token import ENV as ADMIN_ENV
from sketchrec.stream.serving.joint import open_checkpoint
from sketchrec.stream.serving.workers.block import PREFIX
from conftest import served_url, stop_processes, wait_healthy

TOKEN = "dp-workers-admin"
PAIRS = [(u, i) for u in range(1, 11) for i in range(1, 11)]


def _readers(learner_pid: int) -> list[int]:
    """Reader processes of that learner (their command line names its block)."""
    mark = f"{PREFIX}{learner_pid}-".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if mark in cmd and b"supervision.py" in cmd:
            found.append(int(entry))
    return found


def test_a_dp_checkpoint_is_served_by_two_readers_as_by_one_process(tmp_path):
    ck = tmp_path / "ck"
    assert replay_main(["--synthetic-ratings", "25000", "--synthetic-users", "300", "--synthetic-items",
                        "200", "--seed", "1", "--capacity", "600", "--model", "sketch", "--dp-noise", "1",
                        "--checkpoint", str(ck), "--quiet", "--no-monitor"]) == 0
    one = open_checkpoint(ck)   # what one process serving this checkpoint answers
    assert type(one.recommender.model).__name__ == "DPSGDFallback"
    # the DP choice answers from the released baseline here (its noisy evidence is far below the
    # factor model's bar): readers serving the bare factor arrays would answer other ratings
    assert not one.recommender.model.chose_factors
    expected = {(u, i): float(one.recommender.predict(str(u), str(i))) for u, i in PAIRS}
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, ADMIN_ENV: TOKEN}   # the child's environment only
    proc = subprocess.Popen([sys.executable, "-m", "sketchrec", "serve", "--checkpoint", str(ck),
                             "--workers", "2", "--listen", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # the port the server bound itself (a port picked here could be taken before it binds)
        url, auth = served_url(tmp_path / "serve.log", proc, timeout=600), {"Authorization": f"Bearer {TOKEN}"}
        # readers on a cold kernel cache compile first
        wait_healthy(url, proc, timeout=600, log=tmp_path / "serve.log")
        with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            for _ in range(3):   # each pair several times: both readers answer some
                for (u, i), rating in expected.items():
                    answer = client.get("/predict", params={"user": u, "item": i})
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["rating"] == rating
            served_privacy = client.get("/privacy").json()
        assert len(_readers(proc.pid)) == 2   # two reader processes besides the learner
        assert served_privacy["serving"] == one.privacy()["serving"]
    finally:
        stop_processes([proc])
        log.close()
