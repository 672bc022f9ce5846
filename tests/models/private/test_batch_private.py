"""Batch private factorization learners (seeds 001/002) on small synthetic data."""

import numpy as np
import pytest

from sketchrec.models.private.seed_methods import BlpMogMF, HuberIRLS, NoisyALS
from sketchrec.privacy.ldp import DeviceRandomiser
from sketchrec.privacy.mechanisms import Gaussian, Huber, Laplace


def _low_rank(m=150, n=120, r=4, obs=0.2, seed=0):
    rng = np.random.default_rng(seed)
    M = rng.uniform(0, 1, (m, r)) @ rng.uniform(0, 1, (n, r)).T
    M = 1 + 4 * (M - M.min()) / (M.max() - M.min())
    uu, ii = np.nonzero(rng.random((m, n)) < obs)
    return M, uu, ii, M[uu, ii]


def _rmse(model, M):
    return float(np.sqrt(np.mean((model.full_matrix() - M) ** 2)))


@pytest.mark.parametrize("cls", [NoisyALS, HuberIRLS])
def test_recovers_a_low_rank_matrix_without_noise_and_degrades_with_noise(cls):
    M, uu, ii, x = _low_rank()
    kw = {"irls_iters": 3} if cls is HuberIRLS else {}
    clean = _rmse(cls(rank=4, lam=0.05, iters=30, seed=1, **kw).fit(uu, ii, x), M)
    assert clean < 0.1  # the whole matrix, unseen entries included
    errors = []
    for b in (0.5, 2.0, 8.0):  # Laplace scale = 5 / epsilon
        noisy = cls(rank=4, lam=0.05, iters=30, seed=1, noise=Laplace(epsilon=5 / b, sensitivity=5.0), **kw)
        errors.append(_rmse(noisy.fit(uu, ii, x), M))
    assert clean < errors[0] < errors[1] < errors[2]


def test_noise_mechanisms_plug_in_and_predict_handles_unknown_ids():
    M, uu, ii, x = _low_rank(seed=2)
    for noise in (Gaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0), Huber(epsilon=3.0, sensitivity=5.0)):
        model = HuberIRLS(rank=4, iters=5, irls_iters=2, noise=noise, seed=3).fit(uu, ii, x)
        assert np.isfinite(model.full_matrix()).all()
    pred = NoisyALS(rank=4, iters=5, center=True).fit(uu, ii, x).predict(np.array([uu[0], 10_000]),
                                                                          np.array([ii[0], 0]))
    assert np.isfinite(pred).all() and pred[1] == pytest.approx(x.mean())  # unknown user: the mean


def test_huber_weights_give_outliers_less_pull_than_least_squares():
    M, uu, ii, x = _low_rank(seed=4)
    rng = np.random.default_rng(5)
    corrupted = x.copy()
    bad = rng.random(len(x)) < 0.05
    corrupted[bad] += rng.choice([-20.0, 20.0], bad.sum())
    als = _rmse(NoisyALS(rank=4, lam=0.05, iters=20, seed=1).fit(uu, ii, corrupted), M)
    irls = _rmse(HuberIRLS(rank=4, lam=0.05, iters=20, irls_iters=5, weight_alpha=1.0, seed=1)
                 .fit(uu, ii, corrupted), M)
    assert irls < 0.7 * als


def test_blp_mog_fits_perturbed_ratings_and_beats_plain_mf_on_them():
    M, uu, ii, x = _low_rank(m=200, n=150, obs=0.3, seed=6)
    perturbed = DeviceRandomiser(3.0, 1.0, 5.0, seed=7).perturb(x)
    mog = BlpMogMF(rank=4, components=3, lam=1.0, iters=20, seed=1).fit(uu, ii, perturbed)
    assert len(mog.pi) == 3 and np.isclose(mog.pi.sum(), 1) and (mog.sigma2 > 0).all()
    plain = NoisyALS(rank=4, lam=1.0, iters=20, center=True, seed=1).fit(uu, ii, perturbed)
    test_u, test_i = np.nonzero(np.ones_like(M, dtype=bool))
    err = {name: np.sqrt(np.mean((m.predict(test_u, test_i) - M[test_u, test_i]) ** 2))
           for name, m in (("mog", mog), ("plain", plain))}
    assert np.isfinite(list(err.values())).all()
    assert err["mog"] <= err["plain"] * 1.05


def test_private_nmf_fits_keeps_the_sensitivity_bounds_and_its_accounting_agrees():
    from sketchrec.models.private.seed_methods import PrivateNMF
    from sketchrec.privacy.accounting import GaussianSteps, epsilon_of
    rng = np.random.default_rng(8)
    V = rng.uniform(0, 1, (60, 4)) @ rng.uniform(0, 1, (4, 200))  # D x N, non-negative rank 4
    clean = PrivateNMF(rank=4, iters=40, epsilon_t=None, lam=0.01, seed=1).fit(V)
    rel = np.linalg.norm(clean.reconstruction() - V) / np.linalg.norm(V)
    assert rel < 0.15
    private = PrivateNMF(rank=4, iters=40, epsilon_t=0.3, lam=0.01, seed=1).fit(V)
    assert np.linalg.norm(private.reconstruction() - V) / np.linalg.norm(V) > rel
    for M in (private.H, private.R):  # Delta_A = 2/N and Delta_B = 4/N need unit columns
        assert np.linalg.norm(M, axis=0).max() <= 1 + 1e-9
    assert (private.W >= 0).all() and np.linalg.norm(private.W, axis=0).max() <= 1 + 1e-9
    steps = [GaussianSteps(z, 1.0, n) for z, n in private.steps()]
    rdp, closed = epsilon_of(steps, 1e-5, "rdp"), private.closed_form_epsilon()
    # the digest's table: eps_t = 0.3 and 0.7 at T = 50 give 3.16 and 7.98
    assert PrivateNMF(iters=50, epsilon_t=0.3).closed_form_epsilon() == pytest.approx(3.16, abs=0.01)
    assert PrivateNMF(iters=50, epsilon_t=0.7).closed_form_epsilon() == pytest.approx(7.98, abs=0.01)
    assert 0 < rdp <= closed  # the closed form's conversion is the looser one
    with pytest.raises(ValueError):
        PrivateNMF(epsilon_t=1.5)
