"""Load test of the live endpoint: a read replica, and a service that learns while it answers
(a script and the serving section of `sketchrec bench`, not a unit test).

    python -m sketchrec.benchmarks.loadtest [PATH] [--seconds 10] [--concurrency 16] [--workers N]
                                              [--only replica|learning] [--client auto|wrk|httpx]
                                              [--worker-nice N]

Read replica: a checkpoint of PATH (written by `replay PATH --checkpoint DIR`) served by
`sketchrec serve --checkpoint DIR`. Learning: `replay PATH --holdout 0.2 --epochs 1000 --serve`
(learning at full speed) in a child process, its learning rate read from /stats alone, under the
load and alone again (windows of the same length, in the same process). The load is a 50/50 mix of
/predict and /recommend?k=10 over random ids of PATH from ``concurrency`` connections: `wrk`
(Debian package `wrk`; a C client, so the client is not the bottleneck) when installed, else an
httpx asyncio client. Reports requests/s, p50, p99, p99.9 and max latency, the error count, and
the server's CPU time per request (its process tree's; a figure a busy machine disturbs least).
``workers`` is passed on as `--workers N` when given (the commands' default otherwise). Traffic
goes to 127.0.0.1 only; every child is ended after.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from sketchrec.benchmarks import PATH_HELP, data_file

WRK_SCRIPT = """
math.randomseed(1)
counter = 0
request = function()
  counter = counter + 1
  local u = math.random(1, %(users)d)
  if counter %% 2 == 0 then
    return wrk.format("GET", "/predict?user=" .. u .. "&item=" .. math.random(1, %(items)d))
  end
  return wrk.format("GET", "/recommend?k=10&user=" .. u)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %%d, "seconds": %%f, "errors": %%d, "p50_ms": %%f, ' ..
    '"p99_ms": %%f, "p999_ms": %%f, "max_ms": %%f}\\n',
    summary.requests, summary.duration / 1e6, e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000,
    latency.max / 1000))
end
"""


def _child(argv: list[str], workers: int | None, nice: int | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "sketchrec", *argv] + (["--workers", str(workers)] if workers else [])
    argv += ["--worker-nice", str(nice)] if nice is not None else []
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def start_learning(path: Path, port: int, workers: int | None = None,
                   nice: int | None = None) -> subprocess.Popen:
    """`replay PATH --serve`, learning at full speed for as long as it runs."""
    return _child(["replay", str(path), "--holdout", "0.2", "--epochs", "1000", "--quiet",
                   "--serve", f"127.0.0.1:{port}"], workers, nice)


def start_replica(checkpoints: Path, port: int, workers: int | None = None) -> subprocess.Popen:
    """`sketchrec serve --checkpoint DIR`: the newest checkpoint, read only."""
    return _child(["serve", "--checkpoint", str(checkpoints), "--listen", f"127.0.0.1:{port}"], workers)


def write_checkpoint(path: Path, directory: Path, limit: int | None = None) -> Path:
    """A checkpoint of PATH (its first ``limit`` lines, if given) in ``directory``."""
    if limit:
        head = directory / "head.data"
        with open(path) as src:
            head.write_text("".join(line for _, line in zip(range(limit), src)))
        path = head
    subprocess.run([sys.executable, "-m", "sketchrec", "replay", str(path), "--quiet",
                    "--checkpoint", str(directory / "ckpt")], check=True, capture_output=True)
    return directory / "ckpt"


def _wait_up(base: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    # one client for every poll: httpx.get builds a client, and its SSL context, per call (tens of
    # ms of CPU each, many per second while a loaded machine starts the service)
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the service exited early: {proc.stderr.read()}")
            try:
                stats = client.get(f"{base}/stats", timeout=1).json()
                if stats["ratings_learned"] > 0 and stats.get("ready", True):
                    client.get(f"{base}/recommend", params={"user": "1", "k": 10})  # warm up
                    return
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(0.05)
    raise RuntimeError("the service did not come up")


def _learned(client: httpx.Client, base: str) -> tuple[float, int]:
    return time.perf_counter(), client.get(f"{base}/stats").json()["ratings_learned"]


def _wrk(base: str, seconds: float, concurrency: int, n_users: int, n_items: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(WRK_SCRIPT % {"users": n_users, "items": n_items})
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
                              "--timeout", "5s", "-s", fh.name, base],
                             capture_output=True, text=True, check=True).stdout
    finally:
        Path(fh.name).unlink()
    return {**json.loads(out.strip().splitlines()[-1]), "client": "wrk"}


async def _httpx_load(base: str, seconds: float, concurrency: int, n_users: int, n_items: int) -> dict:
    latencies, errors = [], 0
    rng = np.random.default_rng(0)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:
        # the window starts once the client is built (on a loaded machine that alone can take a
        # short window), and every connection sends at least one request: no run without figures
        deadline = time.perf_counter() + seconds

        async def worker(w: int):
            nonlocal errors
            n = 0
            while n == 0 or time.perf_counter() < deadline:
                user = str(rng.integers(1, n_users + 1))
                if (n + w) % 2:
                    req = client.get("/predict", params={"user": user, "item": str(rng.integers(1, n_items + 1))})
                else:
                    req = client.get("/recommend", params={"user": user, "k": 10})
                t0 = time.perf_counter()
                try:
                    errors += (await req).status_code != 200
                except httpx.HTTPError:
                    errors += 1
                latencies.append(time.perf_counter() - t0)
                n += 1
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    lat = np.array(latencies) * 1000
    return {"requests": len(lat), "seconds": seconds, "errors": errors, "client": "httpx",
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "p999_ms": float(np.percentile(lat, 99.9)), "max_ms": float(lat.max())}


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of a process and its descendants so far (None off Linux): the
    server's cost per request, a figure that holds on a busy machine where latencies do not.

    >>> import os; cpu_seconds(os.getpid()) > 0
    True
    """
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


def cpu_split(pid: int) -> tuple[float, float] | None:
    """(CPU seconds of the process itself, of its descendants): a learning service's learner
    and its serving processes (the readers), whose cost per request is then not charged with
    the learning (None off Linux).

    >>> import os; own, children = cpu_split(os.getpid()); own > 0 and children >= 0
    True
    """
    stats = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rpartition(")")[2].split()
        except OSError:
            continue   # ended meanwhile
        stats[int(entry.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    if pid not in stats:
        return None
    tree = {pid}
    while more := {child for child, (parent, _) in stats.items() if parent in tree} - tree:
        tree |= more
    tick = os.sysconf("SC_CLK_TCK")
    return stats[pid][1] / tick, sum(stats[p][1] for p in tree - {pid}) / tick


def _served(proc: subprocess.Popen, port: int, measure):
    """``measure(base, pid)`` once the child ``proc`` serves on ``port``; the child is ended after."""
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base, proc)
        return measure(base, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rate(client: httpx.Client, base: str, work) -> tuple[float, object]:
    """(ratings learned per second while ``work()`` ran, its result)."""
    t0, n0 = _learned(client, base)
    result = work()
    t1, n1 = _learned(client, base)
    return (n1 - n0) / (t1 - t0), result


def _learning_rates(load, seconds: float):
    """``measure`` for ``_served``: the learning rate alone over ``seconds``, under ``load``, and
    alone again, in the same process (the alone rate is the mean of both windows: a shared
    machine's drift between them cancels to first order)."""
    def measure(base, pid):
        with httpx.Client(timeout=10) as client:
            before, _ = _rate(client, base, lambda: time.sleep(seconds))
            loaded, result = _rate(client, base, lambda: load(base, pid))
            after, _ = _rate(client, base, lambda: time.sleep(seconds))
        return (before + after) / 2, loaded, result
    return measure


def _summary(result: dict) -> dict:
    def per_request(cpu):
        return cpu / result["requests"] * 1e6 if cpu and result["requests"] else None
    return {**result, "requests_per_s": result["requests"] / result["seconds"],
            "server_cpu_us_per_request": per_request(result["server_cpu_s"]),
            # the serving processes alone (None: served by the learner's process, --workers 1)
            "reader_cpu_us_per_request": per_request(result.get("reader_cpu_s"))}


def run_load_test(path: Path, seconds: float = 10, concurrency: int = 16, port: int = 8765,
                  client: str = "auto", workers: int | None = None, only: str | None = None,
                  checkpoint_limit: int | None = None, worker_nice: int | None = None) -> dict:
    """{"replica": figures, "learning": figures and learning rate alone / under load}: the targets
    ``only`` names ("replica" or "learning"), both by default. The replica serves a checkpoint of
    PATH's first ``checkpoint_limit`` ratings (all by default); ``worker_nice`` is the learning
    service's `--worker-nice`."""
    from sketchrec.data import read_ratings
    data, _ = read_ratings(path)
    n_users, n_items = int(data.users.max()), int(data.items.max())  # MovieLens ids are 1..n
    use_wrk = client == "wrk" or (client == "auto" and shutil.which("wrk"))

    def load(base, pid):
        cpu0 = cpu_split(pid)
        if use_wrk:
            result = _wrk(base, seconds, concurrency, n_users, n_items)
        else:
            result = asyncio.run(_httpx_load(base, seconds, concurrency, n_users, n_items))
        cpu1 = cpu_split(pid)
        if cpu0 is None or cpu1 is None:
            return {**result, "server_cpu_s": None, "reader_cpu_s": None}
        own, readers = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        return {**result, "server_cpu_s": own + readers, "reader_cpu_s": readers}

    report: dict = {"concurrency": concurrency, "workers": workers, "worker_nice": worker_nice}
    if only in (None, "replica"):
        with tempfile.TemporaryDirectory(prefix="sketchrec-loadtest-") as tmp:
            ckpt = write_checkpoint(path, Path(tmp), checkpoint_limit)
            report["replica"] = _summary(_served(start_replica(ckpt, port, workers), port, load))
    if only in (None, "learning"):
        alone, loaded, result = _served(start_learning(path, port, workers, worker_nice), port,
                                        _learning_rates(load, seconds))
        report["learning"] = {**_summary(result), "learning_per_s_alone": alone,
                              "learning_per_s_under_load": loaded,
                              "learning_kept": loaded / alone if alone else None}
    return report


def describe(report: dict) -> list[str]:
    """The report in a few lines of text."""
    lines = []
    nice = "" if report.get("worker_nice") is None else f" at nice {report['worker_nice']}"
    for target, name in (("replica", "read replica"), ("learning", "while learning")):
        if (r := report.get(target)) is not None:
            lines.append(f"{name}: {r['requests_per_s']:,.0f} req/s ({r['client']}, {report['concurrency']} "
                         f"connections, workers {report['workers'] or 'default'}{nice}), "
                         f"p50 {r['p50_ms']:.2f} ms, "
                         f"p99 {r['p99_ms']:.2f} ms, p99.9 {r['p999_ms']:.2f} ms, errors {r['errors']}, server CPU "
                         f"{r['server_cpu_us_per_request'] or float('nan'):.0f} us/request")
    if (r := report.get("learning")) is not None:
        lines.append(f"learning {r['learning_per_s_alone']:,.0f} ratings/s alone, "
                     f"{r['learning_per_s_under_load']:,.0f} under load ({r['learning_kept']:.0%} kept)")
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--client", choices=("auto", "wrk", "httpx"), default="auto")
    ap.add_argument("--workers", type=int, help="serving processes (default: the commands' own)")
    ap.add_argument("--worker-nice", type=int, metavar="N",
                    help="the learning service's --worker-nice (default: the command's own)")
    ap.add_argument("--only", choices=("replica", "learning"))
    args = ap.parse_args(argv)
    report = run_load_test(data_file(args.path), args.seconds, args.concurrency, args.port, args.client,
                           args.workers, args.only, worker_nice=args.worker_nice)
    print("\n".join(describe(report)))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
