"""Local DP on the device: Bounded Laplace perturbation and the learner's debiasing."""

import json

import numpy as np
import pytest

from sketchrec.privacy.ldp import HEADER, Debias, DeviceRandomiser, parse_header
from sketchrec.privacy.bounded_laplace import BoundedLaplace
from sketchrec.cli import replay_main


def test_device_perturbation_stays_in_range_and_has_the_mechanisms_mean():
    device = DeviceRandomiser(1.0, 1.0, 5.0, seed=1)
    raw = np.repeat([0.0, 1.0, 3.0, 5.0, 7.0], 40_000)  # out-of-range ratings are clamped first
    out = device.perturb(raw)
    assert out.min() >= 1.0 and out.max() <= 5.0
    mech = BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0)
    for value, clamped in ((1.0, 1.0), (3.0, 3.0), (7.0, 5.0)):
        sample = out[raw == value]
        assert sample.mean() == pytest.approx(mech.mean(clamped), abs=4 * sample.std() / np.sqrt(len(sample)))
    assert abs(float(mech.mean(1.0)) - 1.0) > 1.0  # the centre bias the learner must undo


def test_debias_inverts_the_mean_function():
    mech = BoundedLaplace(epsilon=2.0, lower=1.0, upper=5.0)
    debias = Debias(2.0, 1.0, 5.0)
    values = np.linspace(1.0, 5.0, 17)
    assert debias(mech.mean(values)) == pytest.approx(values, abs=1e-3)
    assert debias([0.0, 9.0]).tolist() == [1.0, 5.0]  # beyond m's range: the range's ends


def test_header_round_trip_and_malformed_headers():
    device = DeviceRandomiser(3.0, 0.5, 5.0)
    assert parse_header(device.header()) == {"mechanism": "BoundedLaplace", "epsilon": 3.0, "range": [0.5, 5.0]}
    assert parse_header(b"garbage") is None and parse_header(b"\xff") is None
    assert HEADER == "sketchrec-ldp"


def test_replay_holdout_with_device_perturbation_and_debiasing(capsys):
    common = ["--holdout", "0.2", "--epochs", "3", "--synthetic-ratings", "20000", "--synthetic-users",
              "300", "--synthetic-items", "200", "--quiet", "--json"]
    results, ldp = {}, ["--ldp-range", "1,5", "--ldp-epsilon", "3"]   # a range alone is refused
    for extra in ([], ldp, ldp + ["--ldp-debias"]):
        assert replay_main(common + extra) == 0
        results[" ".join(extra)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rmse"]
    raw, noisy, debiased = results.values()
    assert np.isfinite([raw, noisy, debiased]).all()
    assert noisy > raw and debiased != noisy
    with pytest.raises(SystemExit):
        replay_main(["--ldp-epsilon", "3", "--quiet"])  # one pass: use the producer instead
