"""Property test over `replay`'s argument space: every combination ends in a one-line error with a
non-zero exit, or in a valid finite result (strict JSON, finite RMSE). Small synthetic streams keep
each example fast; the example count is bounded so the whole test stays well under a minute."""

import json
import warnings

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sketchrec.cli import replay_main

NUMBERS = st.one_of(st.integers(-3, 100).map(str), st.sampled_from(
    ["0", "0.5", "1", "-1", "1e308", "-1e-9", "nan", "inf", "-inf", "abc", "", "0.2", "1.5", "2,1", "1,5"]))
OPTIONS = st.sampled_from([
    "--holdout", "--epochs", "--seed", "--dim", "--depth", "--width", "--space-gain", "--heavy-fraction",
    "--light-dim", "--lr", "--reg", "--bias-reg", "--init-std", "--sgld", "--clip-loss", "--batch-size",
    "--capacity", "--kld-window", "--kld-alert", "--audit-canaries", "--speed", "--dp-noise",
    "--dp-epsilon", "--dp-delta", "--dp-clip", "--dp-batch", "--dp-range", "--rating-range",
    "--synthetic-users", "--synthetic-items", "--budget-epsilon",
])
SMALL = ["--synthetic-ratings", "600", "--synthetic-users", "40", "--synthetic-items", "30", "--quiet",
         "--json"]


def refuse(name):
    raise AssertionError(f"bare {name} in the JSON")


@settings(max_examples=120, deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],   # no shrinking: keep a failure fast
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(OPTIONS, NUMBERS), min_size=1, max_size=3, unique_by=lambda t: t[0]),
       st.sampled_from(["sketch", "dense", "river"]))
def test_replay_ends_in_a_one_line_error_or_a_finite_result(capsys, options, model):
    argv = [*SMALL, "--model", model] + [f"{name}={value}" for name, value in options]
    if "--speed" in dict(options):   # paced runs are tested elsewhere; keep each example fast
        argv.append("--speed=max")
    if "--holdout" in dict(options) and "--epochs" not in dict(options):   # a holdout option only
        argv.append("--epochs=2")
    capsys.readouterr()
    shown = " ".join(argv)   # named in every failure
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            code = replay_main(argv)
        except SystemExit as stop:
            message = stop.code if isinstance(stop.code, str) else capsys.readouterr().err
            assert stop.code not in (0, None), shown
            assert message.strip().startswith("replay") and len(message.strip().splitlines()) == 1, \
                (shown, message)
            return
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert len(out) == 1, shown   # stdout: the JSON line only, whatever the outcome
    result = json.loads(out[0], parse_constant=refuse)
    if code != 0:   # a run that diverged says so in one line
        assert code == 1 and result["rmse"] is None, shown
        assert captured.err.strip().splitlines()[-1].startswith("replay: the model diverged"), shown
        return
    assert isinstance(result["rmse"], float), shown
    assert result["learned"] >= 0 and result["ratings"] > 0
