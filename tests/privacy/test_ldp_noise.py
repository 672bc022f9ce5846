"""The simulated devices' noise of `replay --holdout --ldp-epsilon` comes from fresh secret entropy:
two runs differ, and the public seed does not regenerate it (which would give back every raw rating)."""

import json

import numpy as np
import pytest

from sketchrec.cli import replay_main
from sketchrec.privacy.ldp import DeviceRandomiser, LDPSettings

ARGS = ["--holdout", "0.2", "--epochs", "1", "--synthetic-ratings", "4000", "--synthetic-users", "100",
        "--synthetic-items", "60", "--quiet", "--json", "--ldp-range", "1,5", "--ldp-epsilon", "2",
        "--seed", "1"]


def _run(capsys) -> dict:
    assert replay_main(ARGS) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _recorded_perturbations(monkeypatch) -> list:
    """Every (raw, released) pair the simulated devices produce, in order."""
    seen = []
    perturb = DeviceRandomiser.perturb

    def recording(self, ratings):
        out = perturb(self, ratings)
        seen.append((np.asarray(ratings, dtype=np.float64).copy(), out.copy()))
        return out
    monkeypatch.setattr(DeviceRandomiser, "perturb", recording)
    return seen


def recover(released: np.ndarray, candidates: np.ndarray, seed: int, eps=2.0, lo=1.0, hi=5.0) -> np.ndarray:
    """The attack: regenerate the device noise from ``seed`` and keep, for each released value, the
    candidate raw rating that the regenerated noise maps to it exactly (NaN where none does)."""
    guess = np.full(len(released), np.nan)
    for value in candidates:
        again = DeviceRandomiser(eps, lo, hi, seed=seed).perturb(np.full(len(released), value))
        guess[again == released] = value
    return guess


def test_two_ldp_holdout_runs_with_one_seed_differ(capsys):
    first, second = _run(capsys), _run(capsys)
    assert first["rmse"] != second["rmse"]
    assert first["privacy"]["proven_bound"] is True and first["privacy"]["mode"] == "ldp"


def test_the_public_seed_does_not_reproduce_the_device_noise(capsys, monkeypatch):
    seen = _recorded_perturbations(monkeypatch)
    _run(capsys)
    raw = np.concatenate([r for r, _ in seen])
    released = np.concatenate([o for _, o in seen])
    assert len(raw) > 3000
    candidates = np.unique(raw)
    for seed in [1, 4] + list(range(0, 40, 3)):   # the run's seed, seed + 3, and others
        assert np.isnan(recover(released, candidates, seed)).all()


def test_the_attack_recovers_every_rating_from_reproducible_noise():
    # the deliberately broken variant: device noise from a known seed (as the simulation once did)
    raw = np.round(np.random.default_rng(0).uniform(1, 5, 3000) * 2) / 2
    broken = LDPSettings(2.0, 1.0, 5.0, debug_seed=4)
    released = broken.randomiser().perturb(raw)
    assert np.array_equal(recover(released, np.unique(raw), seed=4), raw)
    figures = broken.figures()
    assert figures["proven_bound"] is False and figures["epsilon"] == float("inf")
    assert "no privacy guarantee" in figures["guarantee"]


def test_fresh_randomisers_draw_independent_noise():
    raw = np.full(2000, 3.0)
    a, b = (LDPSettings(2.0, 1.0, 5.0).randomiser().perturb(raw) for _ in range(2))
    assert not np.array_equal(a, b)
    assert LDPSettings(2.0, 1.0, 5.0).randomiser().proven
    assert not DeviceRandomiser(2.0, 1.0, 5.0, seed=3).proven


def _produced(monkeypatch, tmp_path, *extra) -> list:
    """What `sketchrec produce --ldp-epsilon` would send (the broker replaced by a recorder)."""
    from sketchrec.cli.produce import produce_main
    from sketchrec.stream.kafka import producer
    path = tmp_path / "u.data"
    rng = np.random.default_rng(0)
    path.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for t, (u, i, r) in enumerate(
        zip(rng.integers(1, 50, 2000), rng.integers(1, 80, 2000), rng.integers(1, 6, 2000)))))
    sent = []

    def recording(data, bootstrap, topic, batch, rate, partitions, randomiser, **kw):
        sent.append((data.ratings.copy(), randomiser.perturb(data.ratings), randomiser.proven))
        return {"ratings": len(data), "messages": len(data), "seconds": 1.0, "ratings_per_s": 1.0}
    monkeypatch.setattr(producer, "produce", recording)
    assert produce_main([str(path), "--bootstrap", "x:1", "--topic", "t", "--ldp-epsilon", "2",
                         "--rating-range", "1,5", *extra]) == 0
    return sent[0]


def test_produce_draws_fresh_device_noise_and_refuses_a_seed(monkeypatch, tmp_path, capsys):
    (raw, first, proven), (_, second, _) = (_produced(monkeypatch, tmp_path) for _ in range(2))
    assert proven and not np.array_equal(first, second)
    for seed in (0, 1, 3):   # no seed regenerates what the devices sent
        assert np.isnan(recover(first, np.unique(raw), seed)).all()
    with pytest.raises(SystemExit) as stop:
        _produced(monkeypatch, tmp_path, "--seed", "1")
    assert stop.value.code == 2 and "never seeded" in capsys.readouterr().err
