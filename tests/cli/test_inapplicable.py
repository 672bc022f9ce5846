"""replay's options that do not apply to the run are refused in one line, never ignored; --plot
makes its directory or is refused before anything is learned, and a plot that fails at the end
leaves the result reported."""

import json

import pytest

from sketchrec.cli.replay import replay_main

SMALL = ["--synthetic-ratings", "3000", "--synthetic-users", "100", "--synthetic-items", "80", "--quiet"]
FILE = "ratings.data"   # a file that need not exist: the refusal comes before it is read

REFUSED = [
    (["--holdout", "0.2", "--speed", "10"], "--speed", "holdout"),
    (["--epochs", "3"], "--epochs", "--holdout"),
    (["--holdout", "0.2", "--order", "file"], "--order", "holdout"),
    (["--holdout", "0.2", "--kld-window", "500"], "--kld-window", "prequential"),
    (["--holdout", "0.2", "--kld-alert", "0.1"], "--kld-alert", "prequential"),
    (["--sep", ","], "--sep", "PATH"),
    (["--columns", "user=a,item=b,rating=c"], "--columns", "PATH"),
    (["--holdout", "0.2", "--ldp-debias"], "--ldp-debias", "--ldp-epsilon"),
    (["--holdout", "0.2", "--ldp-range", "1,5"], "--ldp-range", "--ldp-epsilon"),
]


def one_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        replay_main(argv)
    assert stop.value.code == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1, out.err   # nothing learned, nothing reported
    return lines[0]


@pytest.mark.parametrize("extra, option, names", REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_an_option_that_does_not_apply_is_refused(extra, option, names, capsys):
    line = one_line([*SMALL, *extra], capsys)
    assert line.startswith(f"replay: {option} ") and names in line


def test_a_synthetic_stream_option_with_a_file_is_refused(tmp_path, capsys):
    path = tmp_path / FILE
    path.write_text("1\t1\t5\t1\n2\t1\t4\t2\n")
    line = one_line([str(path), "--synthetic-users", "40", "--quiet"], capsys)
    assert line.startswith("replay: --synthetic-users ") and "PATH" in line


def test_the_same_options_where_they_apply_run(capsys):
    assert replay_main([*SMALL, "--speed", "max", "--order", "file", "--kld-window", "500", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ratings"] == 3000


def test_plot_makes_its_directory(tmp_path, capsys):
    target = tmp_path / "out" / "deeper" / "curve.png"
    assert replay_main([*SMALL, "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("where", ["a file in the way", "a directory"])
def test_an_unwritable_plot_is_refused_before_learning(where, tmp_path, capsys):
    blocker = tmp_path / "blocker"
    if where == "a directory":
        blocker.mkdir()
        target = blocker
    else:
        blocker.write_text("not a directory")
        target = blocker / "curve.png"
    line = one_line([*SMALL, "--plot", str(target)], capsys)
    assert line.startswith(f"replay: --plot {target}")


def test_a_plot_failing_at_the_end_keeps_the_result(tmp_path, capsys, monkeypatch):
    import sketchrec.replay.curve as curve

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(curve, "plot_curves", full_disk)
    assert replay_main([*SMALL, "--json", "--plot", str(tmp_path / "curve.png")]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ratings"] == 3000          # the result is reported
    assert [line for line in out.err.splitlines() if "--plot" in line] == [
        f"replay: --plot {tmp_path / 'curve.png'}: not written (No space left on device)"]


def test_help_names_the_default_that_runs(capsys):
    """Every option with a default names it in --help; the default learner's factor member runs
    at the lr and reg --help gives for it."""
    from sketchrec.cli.options import DefaultsShown
    from sketchrec.cli.replay import build_parser
    from sketchrec.models.registry import MIX_FACTOR_MEMBER
    parser = build_parser()
    formatter = DefaultsShown("replay")
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, "==SUPPRESS==") and action.help:
            assert "default" in formatter._get_help_string(action), action.option_strings
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    lr, reg = MIX_FACTOR_MEMBER["lr"], MIX_FACTOR_MEMBER["reg"]
    assert f"lr {lr:g} (one pass)" in helps["--lr"] and f"reg {reg:g} (one pass)" in helps["--reg"]
    assert replay_main([*SMALL, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "mix" and f"lr={lr:g} reg={reg:g}" in result["params"]["members"]


def test_a_long_experiment_shows_its_progress(ml100k, tmp_path, capsys):
    """`experiment b1-table` says which fit of how many it has done, on stderr (stdout: the
    closing line only)."""
    from sketchrec.cli import sketchrec_main
    assert sketchrec_main(["experiment", "b1-table", "--quick", "--data", str(ml100k),
                           "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    fits = [line for line in out.err.splitlines() if line.startswith("b1-table: fit ")]
    assert [line.split(" (")[0] for line in fits] == [f"b1-table: fit {n}/3" for n in (1, 2, 3)]
    assert out.out.startswith("b1-table: wrote ")


def test_an_unmakeable_checkpoint_directory_is_refused_before_learning(tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    line = one_line([*SMALL, "--checkpoint", str(blocker / "ck")], capsys)
    assert line.startswith(f"replay: --checkpoint {blocker / 'ck'}: cannot make it")
    assert replay_main([*SMALL, "--json", "--checkpoint", str(tmp_path / "new" / "ck")]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"]["name"]   # made, and written at the end
