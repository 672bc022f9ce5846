"""A file streamed in file order reaches the learner as writable columns: to numba a read-only
array (arrow's zero-copy kind) is another type, and every kernel would compile again inside the
timed loop (minutes, and the compiler's memory, on a large file)."""

from __future__ import annotations

import numpy as np
import pytest

from test_first_run import _signatures

from sketchrec.cli.config import ReplayConfig
from sketchrec.cli.replay import build_parser, execute, prepare


def _ratings_file(path):
    rng = np.random.default_rng(0)
    lines = ["userId,movieId,rating,timestamp"]
    lines += [f"{u},{i},{r},{t}" for t, (u, i, r) in enumerate(zip(
        rng.integers(1, 120, 4000), rng.integers(1, 60, 4000), rng.choice([1.0, 2.5, 4.0, 5.0], 4000)))]
    path.write_text("\n".join(lines) + "\n")
    return path


def _grown_while_timed(monkeypatch, options) -> dict:
    import sketchrec.replay.protocols as protocols
    seen = {}
    timed = protocols.prequential

    def watched(*args, **kwargs):
        seen["before"] = _signatures()
        out = timed(*args, **kwargs)
        seen["after"] = _signatures()
        return out
    monkeypatch.setattr(protocols, "prequential", watched)
    args = build_parser("replay").parse_args(["--quiet", *options])
    execute(prepare(ReplayConfig.from_args(args, "replay")))
    before, after = seen["before"], seen["after"]
    return {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}


@pytest.mark.parametrize("model", ["mix", "sketch"])
def test_no_kernel_is_compiled_while_a_file_streams(monkeypatch, tmp_path, model):
    path = _ratings_file(tmp_path / "ratings.csv")
    grown = _grown_while_timed(monkeypatch, [str(path), "--order", "file", "--model", model])
    assert grown == {}, f"compiled while timed: {grown}"


def test_read_only_columns_would_compile_again(monkeypatch, tmp_path):
    # the broken variant: the reader's columns left read-only, as arrow hands them over. Shown by
    # the type numba dispatches on (compiling every kernel again to show it takes minutes): a
    # read-only array is another type, so no signature compiled for writable columns matches it.
    from numba import typeof

    import sketchrec.reader as reader
    path = _ratings_file(tmp_path / "ratings.csv")
    kept = next(reader.RatingFile(path).chunks())
    monkeypatch.setattr(reader, "writable", _read_only)
    broken = next(reader.RatingFile(path).chunks())
    for column in ("users", "items", "ratings", "timestamps"):
        ours, theirs = typeof(getattr(kept, column)), typeof(getattr(broken, column))
        assert ours.mutable and not theirs.mutable and ours != theirs, column


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view
