"""The commands run one BLAS thread (``cli.one_blas_thread``): OpenBLAS's workers spin after each
call they shared, taking the cores a learner, a server or a fleet's members need; an operator's own
setting wins. Checked in fresh processes: the suite's own process has the setting already."""

import json
import os
import subprocess
import sys

import pytest

from sketchrec.cli import BLAS_THREADS

PROBE = """
import json, os, sys
import sketchrec.cli as cli
if sys.argv[1] == "call":
    cli.one_blas_thread()
from threadpoolctl import threadpool_info
print(json.dumps({"threads": [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"],
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def _probe(call: bool, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in BLAS_THREADS}
    out = subprocess.run([sys.executable, "-c", PROBE, "call" if call else "skip"], env={**clean, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenBLAS starts one thread anyway")
def test_a_command_runs_one_blas_thread_and_hands_the_setting_to_its_children():
    assert max(_probe(call=False)["threads"]) > 1      # the broken variant: OpenBLAS's default
    got = _probe(call=True)
    assert got["threads"] and set(got["threads"]) == {1} and got["env"] == "1"


def test_an_operators_own_setting_is_kept():
    got = _probe(call=True, OPENBLAS_NUM_THREADS="2")
    assert set(got["threads"]) == {2} and got["env"] == "2"
