"""Rating sources: each file format, malformed lines set aside with reasons, the synthetic stream."""

from pathlib import Path

import numpy as np
import pytest

from sketchrec.data import SyntheticStream, detect_format, order_ratings, read_ratings


GOOD = [(1, 10, 4.0, 100), (2, 10, 3.5, 50), (1, 11, 5.0, 200)]
BAD_LINES = {  # reason -> line body, with {s} standing for the separator
    "missing fields": "3{s}12",
    "non-numeric rating": "3{s}12{s}four{s}5",
    "non-finite rating": "3{s}12{s}nan{s}5",
    "bad timestamp": "3{s}12{s}4{s}yesterday",
    "empty id": "{s}12{s}4{s}5",
    "oversized id": "u" * 300 + "{s}12{s}4{s}5",
    "too many fields": "3{s}12{s}4{s}5{s}9",
}


def write_format(path: Path, sep: str, header: str | None) -> Path:
    lines = [header] if header else []
    lines += [sep.join(str(v) for v in row) for row in GOOD[:2]]
    lines += [body.format(s=sep) for body in BAD_LINES.values()]
    lines += ["", sep.join(str(v) for v in GOOD[2])]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data.replace(b"\n\n", b"\n\xff\xfe bad bytes\n"))  # a non-UTF-8 line
    return path


@pytest.mark.parametrize("sep,header,fmt", [(",", "userId,movieId,rating,timestamp", "movielens-csv"),
                                            ("\t", None, "ml-100k"), ("::", None, "ml-1m")])
def test_each_format_parses_and_sets_malformed_lines_aside(tmp_path, sep, header, fmt):
    path = write_format(tmp_path / "ratings.txt", sep, header)
    assert detect_format(path.read_text(errors="replace").splitlines()[0]) == fmt
    ratings, report = read_ratings(path)
    assert list(zip(ratings.users.tolist(), ratings.items.tolist(), ratings.ratings.tolist(),
                    ratings.timestamps.tolist())) == GOOD
    expected = {reason: 1 for reason in BAD_LINES} | {"not UTF-8": 1}
    assert dict(report.skipped) == expected
    assert report.accepted == 3 and report.n_skipped == len(expected)
    first_bad_line = 2 + (1 if header else 0) + 1  # after two good rows (and the header)
    assert report.examples[0][:2] == (first_bad_line, "missing fields")
    assert len(report.examples) == report.max_examples


def test_string_ids_are_kept_opaque(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating,timestamp\nalice,m-1,4,1\n__import__('os'),m-2,3,2\n")
    ratings, report = read_ratings(path)
    assert ratings.users.tolist() == ["alice", "__import__('os')"] and report.n_skipped == 0


def test_empty_file_gives_no_ratings(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    ratings, report = read_ratings(path)
    assert len(ratings) == 0 and report.lines == 0


def test_order_by_time_file_and_shuffle(tmp_path):
    ratings, _ = read_ratings(write_format(tmp_path / "r.tsv", "\t", None))
    by_time = order_ratings(ratings, "time")
    assert by_time.timestamps.tolist() == [50, 100, 200]
    assert order_ratings(ratings, "file").timestamps.tolist() == [100, 50, 200]
    assert sorted(order_ratings(ratings, "shuffle", seed=1).timestamps.tolist()) == [50, 100, 200]
    with pytest.raises(ValueError):
        order_ratings(ratings, "random")


def test_real_ml100k_parses_completely(ml100k):
    ratings, report = read_ratings(ml100k)
    assert len(ratings) == 100_000 and report.n_skipped == 0
    assert len(np.unique(ratings.users)) == 943 and len(np.unique(ratings.items)) == 1682
    assert np.bincount(ratings.ratings.astype(int))[1:].tolist() == [6110, 11370, 27145, 34174, 21201]


def test_real_ml_latest_small_parses_completely(ml_latest_small):
    ratings, report = read_ratings(ml_latest_small)
    assert len(ratings) == 100_836 and report.n_skipped == 0
    assert len(np.unique(ratings.users)) == 610 and set(np.unique(ratings.ratings * 2)) == set(range(1, 11))


def test_synthetic_stream_is_seeded_skewed_and_in_range():
    a = SyntheticStream(n_ratings=30_000, n_users=1000, n_items=300, seed=4).all()
    b = SyntheticStream(n_ratings=30_000, n_users=1000, n_items=300, seed=4).all()
    c = SyntheticStream(n_ratings=30_000, n_users=1000, n_items=300, seed=5).all()
    assert np.array_equal(a.ratings, b.ratings) and np.array_equal(a.users, b.users)
    assert not np.array_equal(a.ratings, c.ratings)
    assert a.ratings.min() >= 1 and a.ratings.max() <= 5 and set(np.unique(a.ratings * 2)) <= set(range(2, 11))
    counts = np.bincount(a.users)
    assert counts[1] > 5 * np.median(counts[counts > 0])  # Zipf: the head user is far above the median
    assert (np.diff(a.timestamps) >= 0).all()
    assert a.users.max() <= 1000 and a.items.max() <= 300


def test_file_order_streams_to_the_same_result_as_the_whole_file(tmp_path, monkeypatch, capsys):
    """--order file learns block by block after a counting pass; on a file already in time order
    it learns exactly what the whole-file (time-ordered) path learns."""
    import json

    from sketchrec import chunks
    from sketchrec.cli import replay_main
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 4096)
    path = tmp_path / "r.txt"
    path.write_text("id;film;stars;when\n" + "".join(
        f"{u};{i};{1 + (u * i) % 5};{1000 + k}\n" for k, (u, i) in
        enumerate((u, i) for u in range(1, 70) for i in range(1, 30))) + "1;2;x;9999\n")
    results = []
    for order in ("file", "time"):
        assert replay_main([str(path), "--order", order, "--sep", ";", "--columns",
                            "user=id,item=film,rating=stars,timestamp=when", "--quiet", "--json",
                            "--model", "sketch"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    streamed, whole = results
    assert streamed["rmse"] == whole["rmse"] and streamed["ratings"] == whole["ratings"] == 69 * 29
    assert streamed["params"]["capacity"] == whole["params"]["capacity"] == 69 + 29
    assert streamed["skipped"] == whole["skipped"] == {"non-numeric rating": 1}
