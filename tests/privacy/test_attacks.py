"""BLIP / JLT releases and the decoders that attack them (thesis ch. 3)."""

import math

import numpy as np
import pytest

from sketchrec.privacy.attacks import (BlipRelease, JltRelease, average_precision_at, estimate_profile_size,
                             flip_probability, joint_decoder, rank_and_estimate,
                             reconstruction_cosine, single_decoder_scores)

N_ITEMS = 400


def _profile(rng, size=30):
    return np.sort(rng.choice(N_ITEMS, size, replace=False))


def test_flip_probability_and_the_eps_dp_ratio_of_one_item():
    assert flip_probability(0, 20) == 0.5 and flip_probability(math.inf, 20) == 0.0
    eps, k = 3.0, 5
    p = flip_probability(eps, k)
    assert k * math.log((1 - p) / p) == pytest.approx(eps)
    # empirical: the K bits of an item j (not covered by the rest) read all-ones with probability
    # (1-p)^K when j is in the profile and p^K when it is not: ratio e^eps, never more
    blip = BlipRelease(N_ITEMS, n_bits=2000, n_hashes=k, seed=3)
    rng = np.random.default_rng(4)
    base = np.array([1, 2, 3])
    j = next(x for x in range(10, N_ITEMS) if not set(blip.positions[x]) & set(blip.positions[base].ravel())
             and len(set(blip.positions[x])) == k)
    trials = 40_000
    ones_in = sum(blip.release(np.r_[base, j], eps, rng)[blip.positions[j]].all() for _ in range(trials))
    ones_out = sum(blip.release(base, eps, rng)[blip.positions[j]].all() for _ in range(trials))
    expected_ratio = ((1 - p) / p) ** k
    assert ones_in / trials == pytest.approx((1 - p) ** k, rel=0.05)
    assert ones_in / ones_out == pytest.approx(expected_ratio, rel=0.25)
    assert expected_ratio == pytest.approx(math.exp(eps))


def test_size_estimate_and_single_decoder_without_noise():
    rng = np.random.default_rng(5)
    blip = BlipRelease(N_ITEMS, n_bits=3000, n_hashes=10, seed=6)
    truth = _profile(rng)
    released = blip.release(truth, math.inf, rng)
    size = estimate_profile_size(released, 10, 0.0, fallback=1.0)
    assert size == pytest.approx(len(truth), rel=0.1)
    scores = single_decoder_scores(released, blip.positions, 0.0, size)
    ranking, estimate = rank_and_estimate(scores, len(truth))
    assert reconstruction_cosine(truth, estimate) > 0.95


def test_joint_decoder_recovers_more_than_single_under_noise_and_nothing_at_eps_0():
    # dense filters (60 items x 10 hashes in 1500 bits, as dense as the thesis's MovieLens setup):
    # where items share bits, explaining them jointly beats scoring each item alone
    rng = np.random.default_rng(7)
    blip = BlipRelease(N_ITEMS, n_bits=1500, n_hashes=10, seed=8)
    single_cos, joint_cos, zero_cos = [], [], []
    for _ in range(6):
        truth = _profile(rng, 60)
        eps = 10.0
        p = flip_probability(eps, 10)
        released = blip.release(truth, eps, rng)
        size = estimate_profile_size(released, 10, p, fallback=60.0)
        single = single_decoder_scores(released, blip.positions, p, size)
        single_cos.append(reconstruction_cosine(truth, rank_and_estimate(single, size)[1]))
        marginal = joint_decoder(released, blip.positions, p, size, single, burn_in=200, samples=800)
        joint_cos.append(reconstruction_cosine(truth, rank_and_estimate(marginal, size, single)[1]))
        noise = blip.release(truth, 0.0, rng)
        s0 = single_decoder_scores(noise, blip.positions, 0.5, 30.0)
        m0 = joint_decoder(noise, blip.positions, 0.5, 30.0, s0, burn_in=50, samples=100)
        zero_cos.append(reconstruction_cosine(truth, rank_and_estimate(m0, 30.0, rng.random(N_ITEMS))[1]))
    assert np.mean(joint_cos) > np.mean(single_cos) + 0.03
    assert np.mean(zero_cos) < 0.25  # chance level is 30/400 = 0.075


def test_metrics_on_small_examples():
    assert reconstruction_cosine([1, 2, 3, 4], [3, 4]) == pytest.approx(2 / math.sqrt(8))
    assert reconstruction_cosine([], [1]) == 0.0
    # hits at ranks 1 and 3 of 2 relevant items: (1/1 + 2/3) / 2
    assert average_precision_at([5, 9, 7], [5, 7], r=10) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision_at([9, 8], [5], r=2) == 0.0


def test_jlt_single_decoder_finds_the_profile_at_low_noise():
    rng = np.random.default_rng(9)
    jlt = JltRelease(N_ITEMS, dim=1000, seed=10)
    truth = _profile(rng, 20)
    scores = jlt.single_decoder_scores(jlt.release(truth, 0.01, rng))
    assert reconstruction_cosine(truth, rank_and_estimate(scores, 20)[1]) > 0.9
    noisy = jlt.single_decoder_scores(jlt.release(truth, 30.0, rng))
    assert reconstruction_cosine(truth, rank_and_estimate(noisy, 20)[1]) < 0.5


def test_jlt_joint_decoder_beats_the_single_decoder_at_moderate_noise():
    rng = np.random.default_rng(11)
    jlt = JltRelease(N_ITEMS, dim=200, seed=12)
    single, joint = [], []
    for _ in range(5):
        truth = _profile(rng, 20)
        released = jlt.release(truth, 0.2, rng)
        s = jlt.single_decoder_scores(released)
        single.append(reconstruction_cosine(truth, rank_and_estimate(s, 20)[1]))
        m = jlt.joint_decoder(released, 0.2, 20, burn_in=100, samples=300)
        joint.append(reconstruction_cosine(truth, rank_and_estimate(m, 20, s)[1]))
    assert np.mean(joint) > np.mean(single) + 0.05
