"""Load test of the live endpoint while the model learns (a script, not a unit test).

    python -m sketchrec.replay.bench.loadtest [PATH] [--seconds 15] [--concurrency 16] [--port 8765]

Runs `replay PATH --holdout 0.2 --epochs 1000 --serve` (learning at full speed) twice in a child
process: once alone, once under a concurrent client sending a 50/50 mix of /predict and
/recommend (k=10) to random users and items. The client is `wrk` when installed (Debian package
`wrk`; a C client, so the client is not the bottleneck), otherwise an httpx asyncio client. Learning
throughput is read from /stats over the same window in both runs. Reports the request rate,
p50/p99 latency and error count. Traffic goes to 127.0.0.1 only; both children are ended after.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from sketchrec.replay.bench import PATH_HELP, data_file


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
  io.write(string.format('{"requests": %%d, "seconds": %%f, "errors": %%d, "p50_ms": %%f, "p99_ms": %%f}\\n',
    summary.requests, summary.duration / 1e6, e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def _start(path: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sketchrec", "replay", str(path), "--holdout", "0.2",
                             "--epochs", "1000", "--quiet", "--serve", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_up(base: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"replay exited early: {proc.stderr.read()}")
        try:
            if httpx.get(f"{base}/stats", timeout=1).json()["ratings_learned"] > 0:
                httpx.get(f"{base}/recommend", params={"user": "1", "k": 10}, timeout=10)  # warm up
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not come up")


def _learned(base: str) -> tuple[float, int]:
    return time.perf_counter(), httpx.get(f"{base}/stats", timeout=10).json()["ratings_learned"]


def _wrk(base: str, seconds: float, concurrency: int, n_users: int, n_items: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(WRK_SCRIPT % {"users": n_users, "items": n_items})
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{int(seconds)}s", "--timeout", "5s",
                          "-s", fh.name, base], capture_output=True, text=True, check=True).stdout
    Path(fh.name).unlink()
    result = json.loads(out.strip().splitlines()[-1])
    result["client"] = "wrk"
    return result


async def _httpx_load(base: str, seconds: float, concurrency: int, n_users: int, n_items: int) -> dict:
    latencies, errors = [], 0
    rng = np.random.default_rng(0)
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:
        async def worker(w: int):
            nonlocal errors
            n = 0
            while time.perf_counter() < deadline:
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
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def _run(path: Path, port: int, seconds: float, load=None) -> tuple[float, dict | None]:
    """Learning rate (ratings/s over the window) and the load's result, for one child."""
    base = f"http://127.0.0.1:{port}"
    proc = _start(path, port)
    try:
        _wait_up(base, proc)
        t0, n0 = _learned(base)
        result = load(base) if load else time.sleep(seconds)
        t1, n1 = _learned(base)
        return (n1 - n0) / (t1 - t0), result
    finally:
        proc.kill()
        proc.wait()


def run_load_test(path: Path, seconds: float = 15, concurrency: int = 16, port: int = 8765,
                  client: str = "auto") -> dict:
    """Learning rate alone and under load, and the load's request figures."""
    from sketchrec.data import read_ratings
    data, _ = read_ratings(path)
    n_users, n_items = int(data.users.max()), int(data.items.max())  # MovieLens ids are 1..n
    use_wrk = client == "wrk" or (client == "auto" and shutil.which("wrk"))

    def load(base):
        if use_wrk:
            return _wrk(base, seconds, concurrency, n_users, n_items)
        return asyncio.run(_httpx_load(base, seconds, concurrency, n_users, n_items))

    alone, _ = _run(path, port, seconds)
    loaded, result = _run(path, port, seconds, load)
    return {**result, "requests_per_s": result["requests"] / result["seconds"],
            "concurrency": concurrency, "learning_per_s_alone": alone,
            "learning_per_s_under_load": loaded}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--client", choices=("auto", "wrk", "httpx"), default="auto")
    args = ap.parse_args(argv)
    report = run_load_test(data_file(args.path), args.seconds, args.concurrency, args.port, args.client)
    print(f"{report['requests']:,} requests in {report['seconds']:.1f} s = {report['requests_per_s']:,.0f} req/s "
          f"({report['client']}, 50/50 /predict and /recommend, {args.concurrency} connections), "
          f"errors {report['errors']}")
    print(f"latency p50 {report['p50_ms']:.2f} ms, p99 {report['p99_ms']:.2f} ms")
    print(f"learning {report['learning_per_s_alone']:,.0f} ratings/s alone, "
          f"{report['learning_per_s_under_load']:,.0f} ratings/s under load")
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
