"""The `replay` and `sketchrec` commands, run as a user runs them."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sketchrec.cli import replay_main, sketchrec_main

SMALL_SYNTH = ["--synthetic-ratings", "20000", "--synthetic-users", "500", "--synthetic-items", "200"]


def last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_replay_synthetic_default_reports_everything(capsys):
    assert replay_main([*SMALL_SYNTH, "--quiet", "--json"]) == 0
    result = last_json(capsys)
    for key in ("ratings", "skipped", "rmse", "mae", "seconds", "throughput_per_s", "model_bytes",
                "protocol", "model", "params"):
        assert key in result
    assert result["ratings"] == 20_000 and result["protocol"] == "prequential"
    # the default learner: the combination; its weights are reported
    assert result["model"] == "mix" and result["source"] == "synthetic"
    assert 0.3 < result["rmse"] < 1.5 and result["mae"] < result["rmse"]
    assert result["params"]["members"] == "bias + sketch adagrad-id lr=0.2 reg=0.02 d=64"
    assert abs(sum(result["params"]["weights"]) - 1) < 1e-3


def test_replay_reports_malformed_lines_and_learns_the_rest(tmp_path, capsys):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,1,4,10\n1,2,x,11\n2,1,3,12\n2\n3,3,5,13\n")
    assert replay_main([str(path), "--quiet", "--json"]) == 0
    out, captured = capsys.readouterr()   # --json: the JSON on stdout, the summary on stderr
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ratings"] == 3
    assert result["skipped"] == {"non-numeric rating": 1, "missing fields": 1}
    assert [e["line"] for e in result["skipped_examples"]] == [3, 5]
    assert "lines set aside" in captured and "line 3: non-numeric rating" in captured


@pytest.mark.parametrize("model", ["sketch", "dense", "river", "bias"])
def test_replay_other_models(model, capsys):
    assert replay_main([*SMALL_SYNTH, "--synthetic-ratings", "3000", "--model", model, "--quiet",
                        "--json", "--dim", "4"]) == 0
    result = last_json(capsys)
    assert result["model"] == model and result["ratings"] == 3000 and result["rmse"] < 2
    if model == "sketch":  # the thesis learner's sizing, eq. 4.9 (700 ids, d = 4, k = 4)
        assert result["params"]["width"] == 700 and result["params"]["optimizer"] == "sgd"


def test_replay_missing_file_is_a_clear_error(capsys):
    assert replay_main(["/nonexistent/ratings.csv"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_speed_paces_the_stream_by_timestamps(tmp_path, capsys):
    path = tmp_path / "r.csv"
    path.write_text("u,i,r,t\n" + "".join(f"{n},{n},3,{1000 + 100 * (n // 100)}\n" for n in range(300)))
    # 200 s of stream time at 1000x real time -> at least 0.2 s of wall time
    assert replay_main([str(path), "--quiet", "--json", "--speed", "1000"]) == 0
    assert last_json(capsys)["seconds"] >= 0.19


def _holdout(capsys, ml100k, *extra, epochs: int = 20) -> dict:
    """The holdout of ML-100k at seed 1 (20% held out) over ``epochs`` with ``extra`` options."""
    assert replay_main([str(ml100k), "--holdout", "0.2", "--epochs", str(epochs), "--seed", "1",
                        *extra, "--quiet", "--json"]) == 0
    result = last_json(capsys)
    assert result["protocol"] == "holdout" and result["test"] == 20_000
    return result


def test_holdout_on_ml100k_meets_the_accuracy_bar(capsys, ml100k):
    """The sketch learner's accuracy bar: 20 epochs, 20% holdout, seed 1 -> RMSE <= 0.920.

    Two comparisons on the same split after 5 epochs, where each shows as at 20 (a comparison of
    two learners on one seeded split, not of a converged figure): the gap to the dense model at
    gamma=1 is bounded (the gamma=1 vector sketch itself costs some of it: with exact biases the
    gap stays; docs/results.md has the measured gaps), and the implicit term (`--implicit 64`)
    moves the same sketch learner well below it (by about three times the margin asserted).
    """
    assert _holdout(capsys, ml100k, "--model", "sketch")["rmse"] <= 0.920
    rmse = {model: _holdout(capsys, ml100k, "--model", model, epochs=5)["rmse"]
            for model in ("sketch", "dense")}
    assert 0 <= rmse["sketch"] - rmse["dense"] <= 0.008
    implicit = _holdout(capsys, ml100k, "--model", "sketch", "--implicit", "64", epochs=5)
    assert implicit["params"]["implicit"] == 64
    assert implicit["rmse"] < rmse["sketch"] - 0.003


def test_the_default_holdout_on_ml100k_meets_the_accuracy_bar_through_implicit_feedback(capsys, ml100k):
    """The default learner's bar: holdout 0.2, 20 epochs -> RMSE <= 0.905; the combination gets
    there by switching on its factor member's implicit term for epochs. (That its figure stays
    bit-identical is checked by the release checklist on one machine, not here: compiled code on
    another CPU may move the last digits.)"""
    result = _holdout(capsys, ml100k)
    assert result["rmse"] <= 0.905
    assert result["params"]["members"] == "bias + sketch adagrad-id lr=0.07 reg=0.12 d=64 implicit=64"


@pytest.mark.parametrize("flags, says", [
    (["--model", "mix", "--implicit", "8"], "sets one learner"),
    (["--implicit", "8", "--clip-loss", "1"], "clip-loss mode cannot account for the implicit term"),
    (["--implicit", "8", "--sgld", "0.1"], "sgld mode cannot account for the implicit term"),
])
def test_implicit_feedback_refuses_the_combination_and_the_privacy_modes_in_one_line(flags, says):
    with pytest.raises(SystemExit) as stop:
        replay_main([*SMALL_SYNTH, "--quiet", "--json", *flags])
    assert says in str(stop.value) and "\n" not in str(stop.value) and stop.value.code == 2


def _help(command: str) -> str:
    from sketchrec.cli import sketchrec_main
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        sketchrec_main([command, "--help"])
    return " ".join(out.getvalue().split())   # argparse wraps lines: compare the words


def test_every_command_names_the_same_default_learner_and_the_true_defaults():
    """consume, replay and serve state one default learner (the table's), and --lr/--reg state
    what the default learner runs with, read from the registry (not written by hand)."""
    from sketchrec.models.capabilities import DEFAULT_KIND
    from sketchrec.models.registry import DEFAULTS, MIX_FACTOR_MEMBER
    helps = {command: _help(command) for command in ("replay", "consume", "serve")}
    assert DEFAULT_KIND == "mix"
    for command in ("replay", "consume"):
        assert f"the learner (default {DEFAULT_KIND}, in a fleet too;" in helps[command], command
        assert f"default {DEFAULTS['lr']};" in helps[command]
        assert f"lr {MIX_FACTOR_MEMBER['lr']} (one pass)" in helps[command]
        assert f"reg {MIX_FACTOR_MEMBER['reg']} (one pass)" in helps[command]
    assert f"default learner of replay and consume is {DEFAULT_KIND}" in helps["serve"]


def test_consume_without_model_learns_the_default_learner():
    from sketchrec.cli.consume import ConsumeConfig, build_parser
    ap = build_parser()
    base = ["--bootstrap", "x:1", "--topic", "t"]
    plain = ConsumeConfig.from_args(ap.parse_args([*base, "--checkpoint", "d"]), ap)
    assert plain.model.kind == "mix" and type(plain.model.build(100)).__name__ == "Experts"
    # a fleet learns the default learner too; the privacy modes use one sketch model, as --help says
    private = ConsumeConfig.from_args(ap.parse_args([*base, "--checkpoint", "d", "--dp-noise", "1"]), ap)
    fleet = ConsumeConfig.from_args(ap.parse_args([*base, "--fleet", "--group", "g"]), ap)
    assert private.model.kind == "sketch" and fleet.model.kind == "mix"


def test_workers_on_a_model_readers_cannot_share_is_never_silent(capsys, monkeypatch):
    """Asked for (--workers 2): refused with the table's line. Left to its default (one per
    core, two here): served from one process, and the log says why in the table's words."""
    from sketchrec.cli import serving as serve
    from sketchrec.cli.config import ServingSettings
    from sketchrec.cli.options import Refused
    from sketchrec.models import DenseMF
    from sketchrec.models.capabilities import cell
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    from sketchrec.stream.serving.workers import pool

    class Thread:   # the one-process server, not started: this test is about the choice
        url = "http://127.0.0.1:0"

        def __init__(self, app, host, port):
            self.app = app

        def start(self):
            return self

    monkeypatch.setattr(serve, "ServerThread", Thread)
    monkeypatch.setattr(pool, "default_workers", lambda: 2)
    service = LearningService(Recommender(DenseMF(dim=4), pair_capacity=1000))
    monkeypatch.setattr(service, "warm_up", lambda: None)
    line = cell("dense", "serving", "workers").line()
    with pytest.raises(Refused) as refused:
        serve.start_server(service, ServingSettings(("127.0.0.1", 0), workers=2))
    assert refused.value.code == 2 and line in str(refused.value)
    capsys.readouterr()
    assert isinstance(serve.start_server(service, ServingSettings(("127.0.0.1", 0))), Thread)
    assert f"serving from one process: {line}" in capsys.readouterr().err


def test_console_scripts_have_help():
    bindir = Path(sys.executable).parent
    for script in ("replay", "sketchrec"):
        exe = shutil.which(script, path=str(bindir)) or shutil.which(script)
        assert exe, f"console script {script} not installed"
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
        assert "usage:" in out


def test_sketchrec_dispatches_subcommands(capsys):
    assert sketchrec_main([]) == 0
    assert "replay" in capsys.readouterr().out
    assert sketchrec_main(["replay", *SMALL_SYNTH, "--synthetic-ratings", "2000", "--quiet", "--json"]) == 0
    assert last_json(capsys)["ratings"] == 2000
    assert sketchrec_main(["experiment", "--list"]) == 0


def test_replay_reports_kld_privacy_mode_and_canary_audit(capsys):
    assert replay_main([*SMALL_SYNTH, "--quiet", "--json", "--audit-canaries", "200", "--clip-loss", "4"]) == 0
    result = last_json(capsys)
    assert result["ratings"] == 20_000  # canaries are learned but not counted in the accuracy
    privacy = result["privacy"]
    assert privacy["mode"] == "clip-loss" and privacy["epsilon"] == 4 and privacy["proven_bound"] is False
    assert result["kld"] == privacy["kld"] and result["kld"] >= 0
    audit = privacy["audit"]
    assert audit["canaries"] == 200 and audit["guesses"] == 80 and 0 <= audit["correct"] <= 80
    assert privacy["audit_epsilon_lower_bound"] == audit["epsilon_lower_bound"] >= 0
    assert replay_main([*SMALL_SYNTH, "--quiet", "--json", "--no-monitor"]) == 0
    assert last_json(capsys)["kld"] is None


def test_mode_dependent_defaults_are_resolved_in_the_config_not_the_namespace():
    from sketchrec.models.registry import DEFAULTS, DP_DEFAULTS
    from sketchrec.cli.config import ReplayConfig
    from sketchrec.cli.replay import build_parser
    args = build_parser().parse_args(["--dp-noise", "1.0"])
    private = ReplayConfig.from_args(args)
    assert (private.model.dim, private.model.lr, private.model.reg) == \
        (DP_DEFAULTS["dim"], DP_DEFAULTS["lr"], DP_DEFAULTS["reg"])
    assert args.dim is None and args.lr is None  # the parsed options are left as given
    plain = ReplayConfig.from_args(build_parser().parse_args(["--lr", "0.02"]))
    assert (plain.model.dim, plain.model.lr, plain.dp.enabled) == (DEFAULTS["dim"], 0.02, False)


def test_registry_defaults_are_the_models_own():
    import inspect

    from sketchrec.models import SketchMF
    from sketchrec.models.registry import DEFAULTS, MODELS
    signature = inspect.signature(SketchMF.__init__).parameters
    assert DEFAULTS and all(signature[name].default == value for name, value in DEFAULTS.items())
    assert MODELS["SketchMF"] is SketchMF and {"SketchMF", "DenseMF"} <= set(MODELS)


def test_dp_calibration_matches_the_accountant():
    from sketchrec.privacy.accounting import calibrate_noise
    from sketchrec.privacy.budget import sgld_noise_multiplier, stream_noise_multiplier
    assert sgld_noise_multiplier(4, 0.0004, 0.01, 2.0) == pytest.approx(0.2)
    assert stream_noise_multiplier(1.0, 1e-5, 3, fallback_share=0.0) == 6 * calibrate_noise(1.0, 1e-5)


def test_missing_data_is_a_one_line_error_naming_the_path_and_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SKETCHREC_DATA", str(tmp_path))
    assert sketchrec_main(["experiment", "b1-table", "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(tmp_path / "ml-100k" / "u.data") in err and "SKETCHREC_DATA" in err
    with pytest.raises(SystemExit) as stop:
        sketchrec_main(["bench", "--quick", "--data", str(tmp_path / "none.data")])
    assert "none.data" in str(stop.value.code) and "SKETCHREC_DATA" in str(stop.value.code)


def test_doctests_of_the_cli_and_its_library_helpers_run():
    import doctest
    import importlib
    for name in ("sketchrec.paths", "sketchrec.ratings", "sketchrec.models.registry",
                 "sketchrec.privacy.budget", "sketchrec.cli.options"):
        failed, tried = doctest.testmod(importlib.import_module(name))
        assert failed == 0 and tried > 0, name


def test_consume_resumes_from_the_checkpoint_with_its_monitor_and_ledger(tmp_path):
    from sketchrec.models import SketchMF
    from sketchrec.models.private.dp_sgd import DPConfig
    from sketchrec.privacy.monitor import PrivacyMonitor
    from sketchrec.stream.kafka.consumer import resume_or_create
    model = SketchMF(dim=4, width=512, seed=3, dp=DPConfig(noise_multiplier=2.0, batch_size=10))
    fresh = resume_or_create(tmp_path, lambda: model, pair_capacity=1000)
    assert fresh.recommender.model is model and fresh.ledger is None
    assert fresh.begin_private_pass("rating", 1e-5, budget=None)
    fresh.recommender.learn_many(["a", "b"], ["x", "y"], [3.0, 4.0])
    fresh.record_skipped({"bad line": 2})
    fresh.checkpoint()
    monitor = PrivacyMonitor(window=100)
    resumed = resume_or_create(tmp_path, lambda: pytest.fail("a checkpoint exists"), pair_capacity=1000,
                               monitor=monitor)
    assert not resumed.read_only and resumed.recommender.monitor is monitor
    assert resumed.ratings_learned == fresh.ratings_learned and resumed.skipped == {"bad line": 2}
    assert resumed.privacy()["epsilon"] == pytest.approx(fresh.privacy()["epsilon"])
