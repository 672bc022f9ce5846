"""The suite's root: settings every test process shares, and its fixtures loaded as plugins from
``tests/fixtures/`` by what they hold (data sets, waiting on processes, the Kafka broker, the
numba kernels, the workers' order; see ``fixtures/__init__.py``).

The helpers tests import (``from conftest import wait_for, http, ...``) are re-exported here.
"""

import os

# One BLAS thread, in this process and every child (set before numpy is first imported): the tests
# run servers, consumers and brokers beside each other on few cores, where OpenBLAS's threads spin
# against them (a 65,536 x 8 matrix-vector product measured 50 ms threaded, 0.8 ms on one thread).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# The fixture modules' asserts are rewritten as the tests' are (marked before the imports below).
pytest.register_assert_rewrite("fixtures")

# Re-exported for the tests' ``from conftest import ...`` (helpers only: a fixture or hook named
# here too would be registered twice).
from fixtures.broker import wait_for_broker  # noqa: E402,F401
from fixtures.data import data_dir, data_file  # noqa: E402,F401
from fixtures.waiting import (agreeing_predictions, free_port, http, pause,  # noqa: E402,F401
                              served_port, served_url, stop_processes, wait_for, wait_healthy)

__all__ = ["agreeing_predictions", "data_dir", "data_file", "free_port", "http", "pause", "served_port",
           "served_url", "stop_processes", "wait_for", "wait_for_broker", "wait_healthy"]

pytest_plugins = ["fixtures.data", "fixtures.broker", "fixtures.kernels", "fixtures.ordering"]

# Property tests draw their examples from a fixed seed (and keep no example database): a run is
# the same run on every machine and every time, so a failure is never a draw of the day. A test's
# own @settings inherit this profile and change only what they name.
settings.register_profile("pinned", derandomize=True, database=None)
settings.load_profile("pinned")


@pytest.fixture(scope="session", autouse=True)
def ledger_state(tmp_path_factory):
    """The operator's ledger state (key and records, ``privacy.ledger``) in a temporary directory,
    never the home directory; subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SKETCHREC_STATE", str(tmp_path_factory.mktemp("ledger-state")))
        yield
