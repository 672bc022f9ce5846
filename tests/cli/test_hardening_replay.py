"""`replay` against bad input, bad options and interruptions: a one-line
error and a non-zero exit, or a correct result; never a traceback, never nonsense that exits 0."""

import gzip
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sketchrec.data import FORMAT_RANGES, RangeCheck, read_ratings
from sketchrec.cli import replay_main
from sketchrec.cli.display import to_json

from conftest import http, served_url, stop_processes, wait_for

REPO = Path(__file__).resolve().parents[2]
REPLAY = str(Path(sys.executable).with_name("replay"))
SMALL = ["--synthetic-ratings", "2000", "--synthetic-users", "60", "--synthetic-items", "40", "--quiet"]
CLEAN_ML100K_RMSE = 0.9634679277658653  # the thesis learner: replay u.data --model sketch


def strict_json(text: str) -> dict:
    """Parse as strict JSON: a bare NaN or Infinity fails."""
    def refuse(name):
        raise AssertionError(f"not valid JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def run_json(argv, capsys) -> tuple[dict, str]:
    """replay_main with --json: (the JSON object, stderr); stdout must hold that line only."""
    assert replay_main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1, "with --json, stdout carries the JSON line only"
    return strict_json(lines[0]), captured.err


def one_line_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        replay_main(argv)
    code = stop.value.code
    assert code not in (0, None)
    message = code if isinstance(code, str) else capsys.readouterr().err.strip()
    assert message.startswith("replay: ") and len(message.strip().splitlines()) == 1, message
    return message


# --- item 11: the rating range -------------------------------------------------------------------

def test_one_out_of_range_line_leaves_ml100k_rmse_unchanged(ml100k, tmp_path, capsys):
    path = tmp_path / "u.data"
    path.write_bytes(Path(ml100k).read_bytes() + b"1\t2\t99999\t881250949\n")
    result, err = run_json([str(path), "--model", "sketch"], capsys)
    assert abs(result["rmse"] - CLEAN_ML100K_RMSE) < 0.001
    assert result["skipped"] == {"rating out of range": 1}
    assert result["ratings"] == result["learned"] == 100_000
    assert result["rating_range"] == [1, 5] and "ml-100k" in result["rating_range_source"]
    assert "ratings learned   100,000" in err and "rating out of range: 1" in err


def test_absurd_and_non_finite_ratings_are_set_aside_by_reason(tmp_path, capsys):
    path = tmp_path / "r.data"
    good = "".join(f"{u}\t{i}\t{1 + (u * i) % 5}\t{100 + u * 40 + i}\n" for u in range(30) for i in range(20))
    path.write_text(good + "1\t2\t1e308\t5\n1\t3\tnan\t6\n1\t4\tinf\t7\n1\t5\t99999\t8\n")
    result, err = run_json([str(path)], capsys)
    assert result["skipped"] == {"rating out of range": 2, "non-finite rating": 2}
    assert result["learned"] == 600 and 0 < result["rmse"] < 3
    # 'none' keeps 1e308: no OverflowError; prequentially its error is infinite, so the run ends
    # in valid JSON and a one-line message with exit 1; holdout sets it aside as diverged
    assert replay_main([str(path), "--rating-range", "none", "--json"]) == 1
    captured = capsys.readouterr()
    result = strict_json(captured.out)
    assert result["skipped"] == {"non-finite rating": 2} and result["rating_range"] is None
    assert result["rmse"] is None and result["learned"] < result["ratings"]
    assert captured.err.strip().splitlines()[-1].startswith("replay: the model diverged")
    result, _ = run_json([str(path), "--rating-range", "none", "--holdout", "0.3", "--epochs", "2"], capsys)
    assert result["params"]["skipped_diverged"] > 0 and result["kld"] is None


def test_given_and_learned_ranges():
    assert RangeCheck((1.0, 5.0)).keeps(5.0) and not RangeCheck((1.0, 5.0)).keeps(5.5)
    assert RangeCheck(None, "movielens-csv").bounds == FORMAT_RANGES["movielens-csv"] == (0.5, 5.0)
    assert RangeCheck("none").keeps(1e300)
    learned = RangeCheck(None, None)
    learned.learn(list(np.linspace(1, 10, 1000)))
    assert all(learned.keeps(r) for r in (1, 10)) and not learned.keeps(99999)
    assert not learned.keeps(15)   # learned from quantiles: the scale's ends, not 3 spans wide


def test_a_csv_without_movielens_header_learns_its_range(tmp_path):
    path = tmp_path / "tenpoint.csv"  # a 1..10 scale: nothing is cut at MovieLens's 5
    rows = "".join(f"{n % 70},{n % 30},{1 + n % 10},{n}\n" for n in range(2000))
    path.write_text("user,item,rating,time\n" + rows + "3,4,1e6,2001\n")
    ratings, report = read_ratings(path)
    assert len(ratings) == 2000 and dict(report.skipped) == {"rating out of range": 1}
    assert report.range_source.startswith("learned")


def test_ldp_uses_the_same_table_of_declared_scales():
    from sketchrec.privacy import ldp
    assert ldp.FORMAT_RANGES is FORMAT_RANGES


# --- item 12: options out of their domain --------------------------------------------------------

BAD_OPTIONS = [["--holdout", v] for v in ("1.5", "1", "0", "-0.2", "nan")] + [
    ["--depth", "0"], ["--batch-size", "0"], ["--batch-size", "-1"], ["--seed", "-1", "--holdout", "0.2"],
    ["--speed", "abc"], ["--speed", "0"], ["--speed", "inf"], ["--dp-epsilon", "0"], ["--dp-epsilon", "nan"],
    ["--kld-window", "0"], ["--kld-window", "1"], ["--audit-canaries", "-1"], ["--synthetic-ratings", "0"],
    ["--epochs", "0"], ["--epochs", "-1"], ["--width", "0"], ["--width", "-1"], ["--lr", "nan"],
    ["--lr", "0"], ["--lr", "inf"], ["--reg", "-1"], ["--dim", "0"], ["--space-gain", "0"],
    ["--heavy-fraction", "1"], ["--light-dim", "0"], ["--init-std", "nan"], ["--clip-loss", "0"],
    ["--dp-noise", "-1"], ["--dp-delta", "1"], ["--dp-clip", "0"], ["--dp-batch", "0"],
    ["--dp-range", "5,1"], ["--capacity", "0"], ["--kld-alert", "nan"], ["--ldp-epsilon", "0"],
    ["--rating-range", "5,1"], ["--rating-range", "x"], ["--synthetic-users", "-3"],
    ["--budget-epsilon", "0"], ["--sgld", "-1"],
]


@pytest.mark.parametrize("bad", BAD_OPTIONS, ids=" ".join)
def test_an_option_out_of_its_domain_is_a_one_line_error(bad, capsys):
    message = one_line_error([*SMALL, *bad], capsys)
    assert bad[0] in message or bad[-1] in message


def test_a_checkpoint_that_is_a_file_is_refused(tmp_path, capsys):
    file = tmp_path / "ckpt"
    file.write_text("x")
    assert "not a directory" in one_line_error([*SMALL, "--checkpoint", str(file)], capsys)


def test_the_json_line_is_strict_json():
    assert strict_json(to_json({"rmse": float("nan"), "x": [np.float64("inf")], "n": np.int64(2)})) == \
        {"rmse": None, "x": [None], "n": 2}


# --- item 14: files -----------------------------------------------------------------------------

def test_gzip_is_read_transparently(tmp_path, capsys):
    text = "".join(f"{u}\t{i}\t{1 + (u + i) % 5}\t{u * 40 + i}\n" for u in range(20) for i in range(10))
    path = tmp_path / "u.data.gz"
    path.write_bytes(gzip.compress(text.encode()))
    result, _ = run_json([str(path)], capsys)
    assert result["ratings"] == 200 and result["skipped_total"] == 0


def test_bad_files_are_one_line_errors(tmp_path, capsys):
    assert replay_main([str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    spaced = tmp_path / "spaced.txt"
    spaced.write_text("1 2 3 4\n5 6 4 7\n")
    assert "unrecognised ratings format" in one_line_error([str(spaced)], capsys)
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b"1\t2\t3\t4\n" * 1000)[:40])
    assert "cannot read" in one_line_error([str(broken)], capsys)


def test_when_every_line_is_rejected_the_reasons_are_shown(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,2,x,3\n1,2,99,3\n2\n")
    with pytest.raises(SystemExit) as stop:
        replay_main([str(path), "--quiet"])
    message = str(stop.value.code)
    assert "no valid ratings" in message and "non-numeric rating: 1" in message
    assert "rating out of range: 1" in message and "missing fields: 1" in message
    assert "line 2: non-numeric rating" in message and "--rating-range" in message


# --- item 13: output, interruption, first run, bench --------------------------------------------

def test_json_goes_alone_to_stdout_for_jq():
    done = subprocess.run([REPLAY, *SMALL, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert strict_json(done.stdout)["ratings"] == 2000  # the whole stdout is the JSON object
    assert "ratings learned" in done.stderr


def test_ctrl_c_prints_the_partial_summary_and_exits_130(tmp_path):
    n = 6000
    path = tmp_path / "slow.csv"  # ratings one second apart, replayed at 100x: a minute
    path.write_text("userId,movieId,rating,timestamp\n"
                    + "".join(f"{k % 50},{k % 40},{1 + k % 5},{1000 + k}\n" for k in range(n)))
    # served (from this process, on a port it picks): /stats says when it has learned, where a
    # non-TTY replay prints no progress; Ctrl-C then lands while it learns, far from the minute's end
    log = tmp_path / "replay.err"
    with log.open("w") as err:
        proc = subprocess.Popen([REPLAY, str(path), "--speed", "100", "--json", "--serve", "127.0.0.1:0",
                                 "--workers", "1"], stdout=subprocess.PIPE, stderr=err, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = served_url(log, proc)
        learned = wait_for(lambda: http.get(f"{url}/stats", timeout=10).json().get("ratings_learned"),
                           "a first learned batch", proc, log)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        stop_processes([proc])
    err = log.read_text()
    assert proc.returncode == 130 and "Traceback" not in err
    result = strict_json(out)
    # what the served model had learned is counted in the summary (a batch is counted whole)
    assert result["interrupted"] and learned <= result["learned"] < n
    assert "INTERRUPTED" in err and "ratings learned" in err


INTERRUPTED_SERVED_REPLAY = """
import json, sys, threading
from sketchrec.cli import replay_main
from sketchrec.replay import protocols
prequential = protocols.prequential

def interrupted_after_two_batches(model, batches, *args, **kwargs):
    def stream():
        for n, batch in enumerate(batches):
            if n == 2:
                raise KeyboardInterrupt
            yield batch
    return prequential(model, stream(), *args, **kwargs)

protocols.prequential = interrupted_after_two_batches
before = set(threading.enumerate())
code = replay_main(json.loads(sys.argv[1]))
left = [t.name for t in set(threading.enumerate()) - before if t.name == "http"]
print(json.dumps({"code": code, "http_threads_left": left}))
"""


def test_an_interrupted_served_replay_stops_its_server_before_it_exits():
    """A server thread left running into the interpreter's exit crashed the process (uvloop's timer
    called into a finalized interpreter: SIGSEGV instead of exit code 130, now and then). In a
    fresh interpreter: run in the test process after the capability table's in-process serving
    cells, the served replay met closed standard streams ("I/O operation on closed file")."""
    argv = [*SMALL, "--batch-size", "500", "--serve", "127.0.0.1:0", "--workers", "1"]
    out = subprocess.run([sys.executable, "-c", INTERRUPTED_SERVED_REPLAY, json.dumps(argv)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "INTERRUPTED" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 130, "http_threads_left": []}


def test_interrupted_protocols_report_what_was_learned():
    from sketchrec.data import SyntheticStream
    from sketchrec.models import SketchMF
    from sketchrec.replay.protocols import holdout, prequential

    def stream():
        for n, batch in enumerate(SyntheticStream(3000, 50, 40).batches(500)):
            if n == 2:
                raise KeyboardInterrupt
            yield batch

    result = prequential(SketchMF(dim=8, capacity=90), stream())
    assert result["interrupted"] and result["ratings"] == 1000 and np.isfinite(result["rmse"])

    def stop_after_three_epochs(learned, rmse, rate):
        if learned == 3 * 1600:   # 1,600 training ratings an epoch
            raise KeyboardInterrupt
    result = holdout(SketchMF(dim=8, capacity=90), SyntheticStream(2000, 50, 40).all(), 0.2, 10, 1,
                     progress=stop_after_three_epochs)
    assert result["interrupted"] and result["ratings"] == 3 * 1600 and np.isfinite(result["rmse"])


def test_kernels_are_warmed_before_the_real_model_and_a_slow_warm_up_says_so(monkeypatch, capsys):
    from sketchrec.cli import config
    built, said = [], []
    original = config.ModelSettings.build

    def build(self, capacity, dp=None, prog="replay"):
        built.append(capacity)
        if len(built) == 1:
            import time
            time.sleep(1.3)   # as slow as a first-run compile, for the notice
        return original(self, capacity, dp, prog)

    monkeypatch.setattr(config.ModelSettings, "build", build)
    monkeypatch.setattr(config.ModelSettings, "warm", _recording_warm(config.ModelSettings.warm, said))
    assert replay_main([*SMALL[:-1], "--synthetic-ratings", "300"]) == 0   # not --quiet
    assert built[0] == 64 and built[1] == 100   # the throwaway model first, then the real one
    # the step running when the second passed, then each later one as it starts
    steps = ["the learner, 1 of 3…", "predictions, 2 of 3…", "the privacy monitor, 3 of 3…"]
    assert said == [f"compiling kernels (first run only): {step}" for step in steps]
    assert said[-1] in capsys.readouterr().err


def _recording_warm(warm, said):
    def recording(self, dp=None, say=None, prog="replay", **options):
        return warm(self, dp, (lambda line: (said.append(line), say(line))) if say else None, prog,
                    **options)
    return recording


def test_bench_writes_under_the_temp_directory_unless_given_out(tmp_path):
    from sketchrec.benchmarks.suite import output_dir
    default = output_dir(None)
    assert default.is_dir() and default.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert output_dir(tmp_path / "mine") == tmp_path / "mine" and (tmp_path / "mine").is_dir()
    default.rmdir()


def test_readme_setup_activates_the_venv_so_its_commands_run_as_typed():
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set up and run"):readme.index("## Using it")]
    blocks = [b.split("```", 1)[0].strip() for b in setup.split("```bash")[1:]]
    assert len(blocks) == 2
    assert ". .venv/bin/activate" in blocks[0] and blocks[0].endswith("&& replay")
    # the second: in the venv the first made, the test extra, then exactly the test command CI runs
    steps = [step.strip() for step in blocks[1].split("&&")]
    assert steps[0] == ". .venv/bin/activate" and steps[1] == "pip install -e '.[test]'"
    assert steps[-1] == "python -m pytest -q" and steps[-1] in (REPO / ".ci" / "run").read_text()
