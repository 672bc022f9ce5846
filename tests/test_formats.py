"""Your data, at any size: header names in any order, --columns and --sep, a first line that must
be asked about, files without timestamps, other scales (declared, refused or learned), every
compression and Parquet, string ids, and a file read a block at a time."""

import bz2
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sketchrec import chunks
from sketchrec.data import RangeCheck, ScaleError, read_ratings
from sketchrec.formats import LayoutError, parse_columns, sniff
from sketchrec.reader import RatingFile

ROWS = [(u, 100 + (u * 7 + k) % 40, 1 + (u + k) % 5, 1_000 + 10 * u + k) for u in range(1, 61) for k in range(5)]


def write(path, header, order=("user", "item", "rating", "timestamp"), sep=",", rows=ROWS):
    """``rows`` written with their fields in ``order`` (and ``header`` as the first line)."""
    pos = {"user": 0, "item": 1, "rating": 2, "timestamp": 3}
    lines = [header] if header else []
    lines += [sep.join(str(row[pos[name]]) for name in order) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def as_rows(ratings):
    return list(zip(ratings.users.tolist(), ratings.items.tolist(), ratings.ratings.tolist(),
                    ratings.timestamps.tolist()))


@pytest.mark.parametrize("header,order", [
    ("user,item,ts,rating", ("user", "item", "timestamp", "rating")),
    ("item,user,rating,ts", ("item", "user", "rating", "timestamp")),
    ("Rating;Timestamp;movie_id;User ID", ("rating", "timestamp", "item", "user")),
])
def test_header_names_are_honoured_in_any_order(tmp_path, header, order):
    ratings, report = read_ratings(write(tmp_path / "r.csv", header, order, ";" if ";" in header else ","))
    assert as_rows(ratings) == [tuple(float(v) if k == 2 else v for k, v in enumerate(r)) for r in ROWS]
    assert report.n_skipped == 0


def test_the_broken_variant_reads_columns_by_position(tmp_path):
    """What the tests above guard against: by position, 'user,item,ts,rating' makes the
    timestamps ratings (the old reader's failure), which the names prevent."""
    path = write(tmp_path / "r.csv", "user,item,ts,rating", ("user", "item", "timestamp", "rating"))
    by_position, _ = read_ratings(path, columns=parse_columns("user=1,item=2,rating=3,timestamp=4"),
                                  rating_range="none")
    named, _ = read_ratings(path)
    assert by_position.ratings.min() >= 1_000 and named.ratings.max() <= 5


def test_columns_and_sep_options(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("".join(f"x|{u}|{i}|{r}\n" for u, i, r, _ in ROWS))
    ratings, _ = read_ratings(path, columns=parse_columns("user=2,item=3,rating=4"), sep="|")
    assert ratings.users.tolist() == [r[0] for r in ROWS] and ratings.ratings.tolist() == [r[2] for r in ROWS]
    assert not ratings.timestamps.any()   # no timestamp column: every timestamp 0
    named = tmp_path / "n.csv"
    named.write_text("who,what,stars\n" + "".join(f"{u},{i},{r}\n" for u, i, r, _ in ROWS))
    ratings, _ = read_ratings(named, columns=parse_columns("user=who,item=what,rating=stars"))
    assert ratings.items.tolist() == [r[1] for r in ROWS]
    with pytest.raises(LayoutError, match="--columns names rating=score"):
        read_ratings(named, columns=parse_columns("user=who,item=what,rating=score"))
    for bad in ("user=a,item=b", "user=1,item=b,rating=3", "colour=1,user=2,item=3,rating=4"):
        with pytest.raises(ValueError, match="--columns"):
            parse_columns(bad)


def test_a_headerless_file_with_text_ids_is_asked_about_not_guessed(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("alice,m-1,4,1\nbob,m-2,3,2\n")
    with pytest.raises(LayoutError) as err:
        read_ratings(path)
    message = str(err.value)
    assert "--columns" in message and "\n" not in message and "alice" in message
    ratings, report = read_ratings(path, columns=parse_columns("user=1,item=2,rating=3,timestamp=4"))
    assert ratings.users.tolist() == ["alice", "bob"] and report.accepted == 2   # nothing dropped


def test_an_unknown_header_is_asked_about_too():
    with pytest.raises(LayoutError, match="--columns"):
        sniff("a,b,c,d")
    with pytest.raises(LayoutError, match="--columns"):
        sniff("1,2,3,4,5")   # five numbers: which is the rating?
    assert sniff("1,2,3.5").index == {"user": 0, "item": 1, "rating": 2}


def test_string_ids_and_every_compression_and_parquet_read_the_same(tmp_path):
    rows = [(f"user-{u}", f"{u % 7:03d}x", r, t) for u, _, r, t in ROWS]
    text = "user,item,rating,timestamp\n" + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows)
    plain = tmp_path / "r.csv"
    plain.write_text(text)
    (tmp_path / "r.csv.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "r.csv.bz2").write_bytes(bz2.compress(text.encode()))
    with pa.output_stream(str(tmp_path / "r.csv.zst"), compression="zstd") as out:
        out.write(text.encode())
    pq.write_table(pa.table({"rating": [float(r[2]) for r in rows], "userId": [r[0] for r in rows],
                             "item_id": [r[1] for r in rows], "timestamp": [r[3] for r in rows]}),
                   tmp_path / "r.parquet")
    expected = [(u, i, float(r), t) for u, i, r, t in rows]
    for name in ("r.csv", "r.csv.gz", "r.csv.bz2", "r.csv.zst", "r.parquet"):
        ratings, report = read_ratings(tmp_path / name)
        assert as_rows(ratings) == expected, name
        assert report.n_skipped == 0 and ratings.users.dtype == object


def test_decimal_ids_are_ints_and_keep_their_keys(tmp_path):
    from sketchrec.sketches.hashing import keys_of
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n12,7,4\n 13 ,8,3\n")
    ratings, _ = read_ratings(path)
    assert ratings.users.dtype == np.int64 and ratings.users.tolist() == [12, 13]
    assert keys_of(ratings.users).tolist() == keys_of(np.array(["12", "13"], dtype=object)).tolist()


def test_text_ids_after_many_numbers_are_text_and_each_distinct_id_is_one_object(tmp_path):
    # a block's first rows decide nothing: a text id on row 200 makes the column text
    rows = [(str(u % 50), 7, 4, u) for u in range(1, 200)] + [("user-x", 7, 4, 999), ("user-x", 8, 3, 1000)]
    path = write(tmp_path / "r.csv", "user,item,rating,timestamp", rows=rows)
    ratings, report = read_ratings(path)
    assert report.n_skipped == 0 and ratings.users.dtype == object
    assert ratings.users.tolist() == [str(u % 50) for u in range(1, 200)] + ["user-x", "user-x"]
    # memory: the rows of one id point to one str, not one copy per row
    text_rows = ratings.users[-2:]
    assert text_rows[0] is text_rows[1]
    assert len({id(x) for x in ratings.users.tolist()}) == len(set(ratings.users.tolist()))


def test_a_file_without_timestamps_replays_in_file_order(tmp_path, capsys):
    from sketchrec.cli import replay_main
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r, _ in ROWS))
    ratings, report = read_ratings(path)
    assert not report.timestamps
    ratings.sort_by_time()
    assert ratings.users.tolist() == [r[0] for r in ROWS]   # time order is file order
    assert replay_main([str(path), "--quiet", "--json", "--model", "bias"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ratings"] == len(ROWS) and result["skipped_total"] == 0


def ten_point_rows(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    return [(int(u), int(i), int(r), k) for k, (u, i, r) in
            enumerate(zip(rng.integers(1, 200, n), rng.integers(1, 80, n), rng.integers(-10, 11, n)))]


def test_a_declared_scale_violated_by_many_ratings_is_refused_in_one_line(tmp_path, capsys):
    from sketchrec.cli import replay_main
    path = write(tmp_path / "r.csv", "userId,movieId,rating,timestamp", rows=ten_point_rows())
    with pytest.raises(ScaleError) as err:
        read_ratings(path)   # MovieLens's header declares 0.5..5
    message = str(err.value)
    assert "\n" not in message and "%" in message and "--rating-range -10,10" in message
    share = float(message.split("%")[0])
    assert 50 < share < 90
    with pytest.raises(SystemExit) as stop:
        replay_main([str(path), "--quiet"])
    assert stop.value.code not in (0, None)
    assert "--rating-range" in str(stop.value.code) and "\n" not in str(stop.value.code)


def test_a_few_out_of_scale_ratings_are_set_aside_not_refused(tmp_path):
    rows = [(u, i, 1 + (u * i) % 5, t) for u, i, _, t in ten_point_rows()]
    rows[100] = (1, 2, 99, 5)   # one typo in 3,000: 0.03 %
    ratings, report = read_ratings(write(tmp_path / "r.csv", "userId,movieId,rating,timestamp", rows=rows))
    assert len(ratings) == len(rows) - 1 and dict(report.skipped) == {"rating out of range": 1}


def test_rating_range_with_a_negative_lower_bound_parses_and_learns(tmp_path, capsys):
    from sketchrec.cli import replay_main
    path = write(tmp_path / "r.csv", "userId,movieId,rating,timestamp", rows=ten_point_rows())
    assert replay_main([str(path), "--rating-range", "-10,10", "--quiet", "--json", "--model", "bias"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rating_range"] == [-10, 10] and result["skipped_total"] == 0
    assert result["learned"] == 3000


def test_an_undeclared_scale_is_learned_from_quantiles(tmp_path):
    rows = ten_point_rows()
    rows[5] = (1, 2, 10_000, 5)   # a typo among the first ratings does not stretch the range
    ratings, report = read_ratings(write(tmp_path / "r.csv", "user,item,rating,time", rows=rows))
    assert report.rating_range == (-10.0, 10.0) and report.range_source.startswith("learned")
    assert dict(report.skipped) == {"rating out of range": 1} and len(ratings) == 2999
    # the old rule (1st..99th percentile widened by its span) would have kept [-30, 30]
    check = RangeCheck()
    check.learn(np.r_[np.linspace(0, 1, 999), 50.0])
    lo, hi = check.bounds
    assert -0.05 < lo <= 0 and 1 <= hi < 1.05 and not check.keeps(50.0)


def test_a_file_is_read_a_block_at_a_time(tmp_path, monkeypatch):
    """Learning can start before the whole file is parsed: the first block arrives with only
    part of the file read, and no block holds more than a block of lines."""
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 4096)
    rows = [(u, i, r, t) for u, i, r, t in ten_point_rows(20_000) if r >= 1 and r <= 5]
    path = write(tmp_path / "r.tsv", None, sep="\t", rows=rows)
    source = RatingFile(path)
    stream = source.chunks()
    first = next(stream)
    assert 0 < len(first) < 1000 and source.report.lines < len(rows) // 10
    rest = list(stream)
    assert len(first) + sum(len(c) for c in rest) == len(rows) and source.report.lines == len(rows)
    whole, _ = read_ratings(path)
    assert np.array_equal(np.concatenate([first.users] + [c.users for c in rest]), whole.users)


def test_malformed_lines_keep_exact_line_numbers_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 2048)
    lines = [f"{u}\t{i}\t{1 + (u + i) % 5}\t{u * 100 + i}" for u in range(1, 80) for i in range(1, 20)]
    bad_at = [17, 500, 1203]   # 1-based line numbers
    for line_no in bad_at:
        lines[line_no - 1] = "7\t8\tfour\t9"
    path = tmp_path / "r.tsv"
    path.write_text("\n".join(lines) + "\n")
    ratings, report = read_ratings(path)
    assert [e[0] for e in report.examples] == bad_at and report.skipped == {"non-numeric rating": 3}
    assert len(ratings) == len(lines) - 3


def test_learners_are_scale_free_with_default_settings(tmp_path, monkeypatch, capsys):
    """The same stream on 1..5, -10..10 and 1..10: the default learner's RMSE relative to the
    scale's span is the same on each. Without the mapping (the broken variant) -10..10 is not."""
    import sketchrec.scale as scale
    from sketchrec.cli import replay_main
    from sketchrec.data import SyntheticStream
    data = SyntheticStream(20_000, 400, 200, seed=3).all()
    maps = {"1,5": lambda r: r, "-10,10": lambda r: (r - 3) * 5, "1,10": lambda r: (r - 1) * 9 / 4 + 1}

    def relative_rmse(given: str) -> float:
        path = tmp_path / f"r{given}.csv"
        path.write_text("user,item,rating,timestamp\n" + "".join(
            f"{u},{i},{maps[given](r):g},{t}\n"
            for u, i, r, t in zip(data.users, data.items, data.ratings, data.timestamps)))
        assert replay_main([str(path), "--rating-range", given, "--quiet", "--json"]) == 0
        lo, hi = map(float, given.split(","))
        return json.loads(capsys.readouterr().out)["rmse"] / (hi - lo)

    stars = relative_rmse("1,5")
    for given in ("-10,10", "1,10"):
        assert abs(relative_rmse(given) / stars - 1) < 0.005, given
    monkeypatch.setattr(scale.ScaleMap, "for_range", classmethod(lambda cls, bounds: None))
    assert abs(relative_rmse("-10,10") / stars - 1) > 0.01   # the learner alone is not scale-free
