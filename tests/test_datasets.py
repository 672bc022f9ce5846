"""`sketchrec fetch` end to end against a local HTTP server serving a small archive: success,
cache hit, wrong checksum, truncation, server error and no server at all; a data set already
under $SKETCHREC_DATA is used where it is."""

import hashlib
import http.server
import io
import threading
import zipfile
from collections import Counter

import pytest

from sketchrec import datasets
from sketchrec.data import read_ratings
from sketchrec.datasets import DataSet, FetchError, fetch, fetch_main, resolve

RATINGS = "".join(f"{u}\t{i}\t{(u + i) % 5 + 1}\t{880000000 + u * 100 + i}\n"
                  for u in range(1, 21) for i in range(1, 11))


def small_archive() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ml-100k/u.data", RATINGS)
        zf.writestr("ml-100k/README", "test copy\n")
    return buf.getvalue()


ARCHIVE = small_archive()


class Handler(http.server.BaseHTTPRequestHandler):
    """/ok/ serves the archive, /bad/ other bytes, /short/ half of it under the full length,
    /fail/ an HTTP 500. Every request is counted by path."""

    hits: Counter = Counter()

    def do_GET(self):
        Handler.hits[self.path] += 1
        mode = self.path.split("/")[1]
        if mode == "fail":
            self.send_error(500, "boom")
            return
        body = ARCHIVE[::-1] if mode == "bad" else ARCHIVE
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:len(body) // 2] if mode == "short" else body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def pinned(monkeypatch, tmp_path):
    """ml-100k pinned to the test archive; the cache in a fresh folder through $SKETCHREC_CACHE,
    and no local copy ($SKETCHREC_DATA an empty folder)."""
    spec = DataSet("ml-100k.zip", hashlib.sha256(ARCHIVE).hexdigest(), len(ARCHIVE), "ml-100k/u.data")
    monkeypatch.setitem(datasets.DATASETS, "ml-100k", spec)
    monkeypatch.setenv("SKETCHREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SKETCHREC_DATA", str(tmp_path / "no-local-data"))
    Handler.hits.clear()
    return spec, tmp_path / "cache"


def use(monkeypatch, server, mode):
    monkeypatch.setenv("SKETCHREC_DATA_URL", f"{server}/{mode}/")


def assert_nothing_kept(cache):
    """A failed fetch leaves no partial archive, no staging folder and no data set behind."""
    assert not cache.exists() or list(cache.iterdir()) == []


def test_fetch_downloads_checks_unpacks_and_then_hits_the_cache(monkeypatch, server, pinned):
    spec, cache = pinned
    use(monkeypatch, server, "ok")
    lines = []
    path = fetch("ml-100k", log=lines.append)
    assert path == cache / "ml-100k" / "ml-100k" / "u.data"
    assert path.read_text() == RATINGS
    ratings, report = read_ratings(path)
    assert len(ratings) == 200 and report.accepted == 200
    assert any("research use only" in line for line in lines)          # the licence line
    assert sorted(p.name for p in cache.iterdir()) == ["ml-100k"]      # no .part file left
    assert fetch("ml-100k", log=lines.append) == path                  # cache hit ...
    assert resolve("ml-100k") == path
    assert Handler.hits == Counter({"/ok/ml-100k.zip": 1})             # ... no second download


def test_cache_option_beats_the_environment(monkeypatch, server, pinned, tmp_path):
    use(monkeypatch, server, "ok")
    path = fetch("ml-100k", cache=tmp_path / "elsewhere", log=lambda _: None)
    assert path.is_relative_to(tmp_path / "elsewhere")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("mode, says", [
    ("bad", "checksum mismatch for {url}: got sha256 {got}, expected {sha}; the download was discarded"),
    ("short", "truncated download from {url}: {half} of {whole} bytes (expected sha256 {sha})"),
    ("fail", "HTTP 500 boom from {url} (expected sha256 {sha})"),
])
def test_a_failed_download_says_why_in_one_line_and_keeps_nothing(monkeypatch, server, pinned, mode, says):
    spec, cache = pinned
    use(monkeypatch, server, mode)
    with pytest.raises(FetchError) as err:
        fetch("ml-100k", log=lambda _: None)
    assert str(err.value) == says.format(url=f"{server}/{mode}/ml-100k.zip", sha=spec.sha256,
                                         got=hashlib.sha256(ARCHIVE[::-1]).hexdigest(),
                                         half=len(ARCHIVE) // 2, whole=len(ARCHIVE))
    assert_nothing_kept(cache)


def test_no_network_says_what_to_do(monkeypatch, pinned):
    spec, cache = pinned
    monkeypatch.setenv("SKETCHREC_DATA_URL", "http://127.0.0.1:9/")  # discard port: refused
    with pytest.raises(FetchError, match=rf"cannot download http://127.0.0.1:9/ml-100k.zip: .*"
                       rf"expected sha256 {spec.sha256}.*pass the ratings file's path"):
        fetch("ml-100k", log=lambda _: None)
    assert_nothing_kept(cache)


def test_a_failure_then_a_success_fetches_cleanly(monkeypatch, server, pinned):
    spec, cache = pinned
    use(monkeypatch, server, "short")
    with pytest.raises(FetchError):
        fetch("ml-100k", log=lambda _: None)
    use(monkeypatch, server, "ok")
    assert fetch("ml-100k", log=lambda _: None).read_text() == RATINGS


def test_fetch_command_prints_the_path_and_licence(monkeypatch, server, pinned, capsys):
    spec, cache = pinned
    use(monkeypatch, server, "ok")
    assert fetch_main(["ml-100k"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(cache / "ml-100k" / "ml-100k" / "u.data")
    assert "GroupLens" in err and f"{server}/ok/ml-100k.zip" in err
    assert fetch_main(["ml-100k"]) == 0                                 # cached: licence again
    assert "GroupLens" in capsys.readouterr().err
    use(monkeypatch, server, "fail")
    monkeypatch.setenv("SKETCHREC_CACHE", str(cache / "other"))
    assert fetch_main(["ml-100k"]) == 1
    assert "sketchrec fetch: HTTP 500" in capsys.readouterr().err


def test_resolve_keeps_paths_and_rejects_unknown_names(tmp_path):
    existing = tmp_path / "ml-1m"        # a folder that happens to carry a data set's name
    existing.mkdir()
    assert resolve(existing) == existing
    assert resolve(str(tmp_path / "nope.csv")) == tmp_path / "nope.csv"  # the reader reports it
    with pytest.raises(KeyError, match="known: ml-100k"):
        fetch("ml-7b")


def test_registry_pins_every_movielens_set():
    for name in ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-latest-small"):
        spec = datasets.DATASETS[name]
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.ratings.endswith(("u.data", "ratings.dat", "ratings.csv"))
        assert spec.archive == name + ".zip"
    assert datasets.BASE_URL == "https://files.grouplens.org/datasets/movielens/"


def test_replay_and_experiment_take_a_data_set_name(monkeypatch, server, pinned, capsys, tmp_path):
    import json

    from sketchrec.cli import sketchrec_main
    use(monkeypatch, server, "ok")
    assert sketchrec_main(["replay", "ml-100k", "--quiet", "--json"]) == 0   # fetched on first use
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ratings"] == 200 and out["source"].endswith("u.data")
    use(monkeypatch, server, "bad")   # a wrong checksum: one line, non-zero, nothing learned
    monkeypatch.setenv("SKETCHREC_CACHE", str(tmp_path / "fresh"))
    assert sketchrec_main(["replay", "ml-100k", "--quiet", "--json"]) == 2
    assert "sha256" in capsys.readouterr().err


def test_a_data_set_on_the_machine_is_used_without_a_download(monkeypatch, server, pinned, tmp_path, capsys):
    import json

    from sketchrec.cli import sketchrec_main
    spec, cache = pinned
    local = tmp_path / "data" / "ml-100k" / "u.data"
    local.parent.mkdir(parents=True)
    local.write_text(RATINGS)
    monkeypatch.setenv("SKETCHREC_DATA", str(tmp_path / "data"))
    use(monkeypatch, server, "fail")   # a download would fail: none may be tried
    assert fetch("ml-100k", log=lambda _: None) == local
    assert sketchrec_main(["replay", "ml-100k", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["source"] == str(local)
    assert fetch_main(["--list"]) == 0 and "local" in capsys.readouterr().out
    assert Handler.hits == Counter() and not cache.exists()
