"""The KLD measure, the streaming monitor, and the one-run canary audit."""

import itertools
import logging
import math

import numpy as np
import pytest
from scipy import integrate, stats

from sketchrec.models import DenseMF, SketchMF
from sketchrec.privacy.audit import Canaries, audit_p_value, epsilon_lower_bound, is_canary
from sketchrec.privacy.leakage import gaussian_kld, kld_from_errors
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.replay.protocols import holdout
from sketchrec.stream.recommender import Recommender
from sketchrec.data import Ratings, SyntheticStream


@pytest.mark.parametrize("m1,v1,m2,v2", [(0, 1, 0, 1), (0.3, 0.5, -0.1, 1.2), (1, 2, 0, 0.7)])
def test_eq_4_15_is_the_kl_divergence_of_the_two_gaussians(m1, v1, m2, v2):
    p, q = stats.norm(m1, math.sqrt(v1)), stats.norm(m2, math.sqrt(v2))
    numeric, _ = integrate.quad(lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)), -30, 30)
    assert gaussian_kld(m1, v1, m2, v2) == pytest.approx(numeric, abs=1e-7)


def test_kld_from_error_samples():
    rng = np.random.default_rng(0)
    same = kld_from_errors(rng.normal(0, 1, 50_000), rng.normal(0, 1, 50_000))
    shifted = kld_from_errors(rng.normal(0, 0.5, 50_000), rng.normal(0.2, 1, 50_000))
    assert same < 1e-3
    assert shifted == pytest.approx(gaussian_kld(0, 0.25, 0.2, 1), rel=0.05)
    assert math.isnan(kld_from_errors(np.array([1.0]), np.array([1.0, 2.0])))


class _FixedModel:
    """Predicts rating + a fixed offset per call: lets the probe be checked exactly."""

    def __init__(self, offset):
        self.offset = offset

    def predict_many(self, users, items):
        return np.full(len(users), self.offset)


def test_monitor_window_and_cumulative_moments_are_exact():
    rng = np.random.default_rng(1)
    mon = PrivacyMonitor(window=1000, reservoir=50, probe_every=10**9)
    errors = []
    for size in rng.integers(1, 1500, 40):
        e = rng.normal(0.1, 0.7, size)
        keys = rng.integers(0, 2**63, size).astype(np.uint64)
        mon.observe(None, keys, keys, np.zeros(size), e)
        errors.append(e)
        allerr = np.concatenate(errors)
        last = allerr[-1000:]
        assert mon.unseen_window.n == len(last)
        assert mon.unseen_window.mean == pytest.approx(last.mean(), abs=1e-9)
        assert mon.unseen_window.var == pytest.approx(last.var(), rel=1e-7)
        assert mon.unseen_all.mean == pytest.approx(allerr.mean(), abs=1e-9)


def test_reservoir_is_a_uniform_sample_of_everything_offered():
    hits = np.zeros(10_000)
    for seed in range(150):
        mon = PrivacyMonitor(window=10, reservoir=500, probe_every=10**9, seed=seed)
        rng = np.random.default_rng(seed)
        start = 0
        while start < 10_000:
            size = int(min(rng.integers(1, 900), 10_000 - start))
            ids = np.arange(start, start + size, dtype=np.uint64)
            mon.observe(None, ids, ids, ids.astype(float), np.zeros(size))
            start += size
        hits[mon._res_ratings.astype(int)] += 1
    deciles = hits.reshape(10, -1).sum(axis=1) / (150 * 500)
    assert np.allclose(deciles, 0.1, atol=0.01), deciles


def test_batched_reservoir_equals_algorithm_r_applied_one_rating_at_a_time():
    # the same random slots, replayed sequentially: a later rating overwrites an earlier one
    mon = PrivacyMonitor(window=10, reservoir=20, probe_every=10**9, seed=3)
    rng = np.random.default_rng(3)
    reference = np.zeros(20)
    offered = 0
    for size in (15, 40, 200, 7, 500):
        ids = np.arange(offered, offered + size, dtype=np.uint64)
        mon.observe(None, ids, ids, ids.astype(float), np.zeros(size))
        fill = min(max(20 - offered, 0), size)
        reference[offered:offered + fill] = ids[:fill]
        slots = (rng.random(size - fill) * (offered + np.arange(fill, size) + 1)).astype(np.int64)
        for t, slot in enumerate(slots):
            if slot < 20:
                reference[slot] = ids[fill + t]
        offered += size
    assert np.array_equal(mon._res_ratings, reference)
    assert np.array_equal(mon._res_users.astype(float), reference)


def test_probe_measures_seen_errors_and_alerts_once(caplog):
    mon = PrivacyMonitor(window=100, reservoir=100, probe_every=200, alert_kld=0.5)
    rng = np.random.default_rng(2)
    with caplog.at_level(logging.WARNING, logger="sketchrec.privacy.monitor"):
        for _ in range(5):
            keys = rng.integers(0, 2**63, 100).astype(np.uint64)
            ratings = rng.normal(3, 1, 100)
            # unseen errors ~ N(0, 1); the "model" is far better on what it learned (memorised)
            mon.observe(_FixedModel(0.0), keys, keys, ratings, ratings + rng.normal(0, 1, 100))
        mon.probe(_FixedModel(0.0))  # the reservoir moved on since the last scheduled probe
    figures = mon.figures()
    assert figures["seen_sample"] == 100
    assert figures["seen_error_mean"] == pytest.approx(-mon._res_ratings[:100].mean())
    assert figures["kld"] > 0.5 and figures["kld_alert"] is True
    assert sum("crossed the alert threshold" in r.message for r in caplog.records) == 1


def test_monitor_sees_memorisation_in_one_pass():
    """One pass, as the monitor is meant for: a learner that jumps onto each rating it learns
    (large step, no regularisation) leaks far more than a cautious, loss-clipped one."""
    data = SyntheticStream(n_ratings=60_000, n_users=2000, n_items=1000, noise=1.0, seed=3).all()
    klds = {}
    for name, model in (("memoriser", DenseMF(dim=64, lr=0.15, reg=0.0, bias_reg=0.0)),
                        ("cautious", SketchMF(capacity=3000, dim=8, lr=0.003, clip_loss=0.5))):
        mon = PrivacyMonitor(window=20_000, reservoir=3000, probe_every=20_000)
        rec = Recommender(model, pair_capacity=100_000, monitor=mon)
        for batch in data.batches(5000):
            rec.learn_many(batch.users, batch.items, batch.ratings)
        mon.probe(model)
        klds[name] = mon.kld_window
    assert klds["memoriser"] > 4 * klds["cautious"], klds


# --- the one-run audit ------------------------------------------------------------------------------

def _brute_tail(r: int, v: int, q: float) -> float:
    """P[#correct >= v] by enumerating all 2^r right/wrong patterns."""
    return sum(q ** sum(bits) * (1 - q) ** (r - sum(bits))
               for bits in itertools.product((0, 1), repeat=r) if sum(bits) >= v)


@pytest.mark.parametrize("r", [1, 4, 9])
def test_audit_p_value_matches_brute_force(r):
    for v in range(0, r + 1):
        for eps in (0.0, 0.7, 2.5):
            q = math.exp(eps) / (1 + math.exp(eps))
            assert audit_p_value(eps, 0.0, 50, r, v) == pytest.approx(_brute_tail(r, v, q), abs=1e-12)
            # with delta: alpha = max_i P[v - i <= X < v] / i, also by enumeration
            delta, m = 1e-3, 20
            alpha = max(((_brute_tail(r, v - i, q) - _brute_tail(r, v, q)) / i for i in range(1, v + 1)),
                        default=0.0)
            expected = _brute_tail(r, v, q) + alpha * delta * 2 * m
            assert audit_p_value(eps, delta, m, r, v) == pytest.approx(expected, abs=1e-12)


def test_epsilon_lower_bound_properties():
    eps = epsilon_lower_bound(1000, 200, 160)
    assert audit_p_value(eps, 0, 1000, 200, 160) == pytest.approx(0.05, abs=1e-4)
    assert 0 < eps < math.log(0.8 / 0.2)  # below the no-confidence plug-in value
    assert epsilon_lower_bound(1000, 200, 170) > eps                # more right guesses, larger bound
    assert epsilon_lower_bound(1000, 200, 100) == 0.0               # chance accuracy: no evidence
    assert epsilon_lower_bound(1000, 200, 160, delta=1e-5) <= eps   # delta only weakens it
    big = epsilon_lower_bound(10**6, 100_000, 80_000)
    assert big == pytest.approx(math.log(4), abs=0.05)              # large r: log(a / (1 - a))


def test_canary_audit_detects_memorisation_and_not_chance():
    data = SyntheticStream(n_ratings=20_000, n_users=300, n_items=200, seed=4).all()
    canaries = Canaries.make(400, seed=1)
    users, items, ratings = canaries.training_part()
    extra = Ratings(users, items, ratings, np.zeros(len(ratings), dtype=np.int64))
    model = DenseMF(dim=16, lr=0.05, reg=0.0, bias_reg=0.0)
    holdout(model, data, 0.2, 10, seed=1, extra_train=extra)
    audit = canaries.audit(model)
    assert audit["epsilon_lower_bound"] > 1 and audit["accuracy"] > 0.9
    untouched = DenseMF(dim=16)
    holdout(untouched, data, 0.2, 2, seed=1)          # never saw any canary
    assert canaries.audit(untouched)["epsilon_lower_bound"] < 0.5


def test_canaries_never_reach_recommendations_or_popularity():
    data = SyntheticStream(n_ratings=5000, n_users=100, n_items=60, seed=5).all()
    canaries = Canaries.make(300, seed=2)
    users, items, ratings = canaries.training_part()
    mixed = Ratings.concat([data, Ratings(users, items, ratings, np.zeros(len(ratings), dtype=np.int64))])
    rec = Recommender(SketchMF(capacity=600, dim=8), pair_capacity=10_000)
    rec.learn_many(mixed.users, mixed.items, mixed.ratings)
    assert rec.model.n_learned == len(mixed)
    catalogue, _ = rec.catalogue.snapshot()
    assert not is_canary(np.array(catalogue, dtype=object)).any()
    assert not any(str(i).startswith("__canary__") for i, _ in rec.popularity.most_common())
    for user in (int(data.users[0]), users[0], "stranger"):
        shown = [i for i, _ in rec.recommend(user, 50)[0]]
        assert not is_canary(np.array(shown, dtype=object)).any()
