"""Releases of a user's profile (the set of items it rated) and the attacks that decode them
(thesis ch. 3): BLIP (a Bloom filter with every bit flipped with probability
p = 1 / (1 + e^{eps/K}), eps-DP for the items of the profile, eq. 3.3/3.4), the JLT release
(Y = sum_{j in P} X_j + N, eq. 3.10), the single decoder (a per-item likelihood ratio, eq. 3.27)
and the joint decoder (a Gibbs sampler over whole profiles, §3.4.2), with the reconstruction
cosine (3.36) and mAP@R (3.37).

The decoders are written here, not taken from a library: they need the release's codewords and
flip probability, which only the release knows. The Gibbs sampler keeps, per bit, how many
profile items cover it, so one item's flip costs O(K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from sketchrec.sketches.bloom import codewords

_P_FLOOR = 1e-12  # eps = infinity flips nothing; keep the log-likelihoods finite


def flip_probability(epsilon: float, n_hashes: int) -> float:
    """BLIP's bit-flip probability 1 / (1 + e^{eps/K}): 1/2 at eps = 0, 0 at eps = infinity."""
    if epsilon < 0:
        raise ValueError("epsilon must be non-negative")
    if math.isinf(epsilon):
        return 0.0
    return 1.0 / (1.0 + math.exp(epsilon / n_hashes))


@dataclass
class BlipRelease:
    """BLIP over a catalogue of ``n_items`` items (indices 0..n_items-1): Bloom filters of
    ``n_bits`` bits with ``n_hashes`` hashes, each bit flipped with ``flip_probability``."""

    n_items: int
    n_bits: int = 5000
    n_hashes: int = 20
    seed: int = 0

    def __post_init__(self):
        self.positions = codewords(np.arange(self.n_items, dtype=np.int64), self.n_hashes,
                                   self.n_bits, self.seed)

    def encode(self, profile) -> np.ndarray:
        bits = np.zeros(self.n_bits, dtype=np.uint8)
        bits[self.positions[np.asarray(profile, dtype=np.int64)].ravel()] = 1
        return bits

    def release(self, profile, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """The eps-DP release: adding or removing one item changes at most K bits, each flipped
        with probability p, so the likelihood ratio is at most ((1-p)/p)^K = e^eps."""
        p = flip_probability(epsilon, self.n_hashes)
        flips = (rng.random(self.n_bits) < p).astype(np.uint8)
        return self.encode(profile) ^ flips


def estimate_profile_size(released: np.ndarray, n_hashes: int, p: float,
                          fallback: float) -> float:
    """Profile size from the fraction of ones (eq. 3.9): E[ones / L] = rho (1 - p) + (1 - rho) p
    with rho = 1 - (1 - 1/L)^{K c}. At p = 1/2 the release says nothing: ``fallback``."""
    n_bits = released.shape[0]
    if abs(1 - 2 * p) < 1e-9:
        return fallback
    rho = (released.mean() - p) / (1 - 2 * p)
    rho = min(max(rho, 0.0), 1 - 1e-9)
    return max(1.0, math.log(1 - rho) / (n_hashes * math.log(1 - 1 / n_bits)))


def single_decoder_scores(released: np.ndarray, positions: np.ndarray, p: float,
                          size: float) -> np.ndarray:
    """Each item's log-likelihood ratio of 'in the profile' against 'not' from its own K bits
    (eq. 3.27): in, a bit reads 1 w.p. 1 - p; out, w.p. q1 = rho (1-p) + (1-rho) p where rho is
    the chance that the profile's other items set it."""
    p = min(max(p, _P_FLOOR), 0.5)
    n_bits, k = released.shape[0], positions.shape[1]
    rho = 1 - (1 - 1 / n_bits) ** (k * max(size - 1, 0.0))
    q1 = rho * (1 - p) + (1 - rho) * p
    one, zero = math.log((1 - p) / q1), math.log(p / (1 - q1))
    observed = released[positions]
    return np.where(observed == 1, one, zero).sum(axis=1)


@njit(cache=True)
def _gibbs(released, positions, candidates, prior_logit, p, burn_in, samples, seed, init):
    np.random.seed(seed)
    n_bits = released.shape[0]
    cover = np.zeros(n_bits, dtype=np.int64)
    # log-likelihood gained when a bit becomes covered: reads 1 -> (1-p)/p, reads 0 -> p/(1-p)
    gain = np.empty(n_bits)
    lr = math.log((1 - p) / p)
    for b in range(n_bits):
        gain[b] = lr if released[b] == 1 else -lr
    state = init.copy()
    for c in range(candidates.shape[0]):
        if state[c]:
            for b in positions[candidates[c]]:
                cover[b] += 1
    marginal = np.zeros(candidates.shape[0])
    for sweep in range(burn_in + samples):
        for c in range(candidates.shape[0]):
            pos = positions[candidates[c]]
            if state[c]:
                for b in pos:
                    cover[b] -= 1
            delta = 0.0
            for b in pos:  # covering the bits this item would add (first cover only)
                if cover[b] == 0:
                    delta += gain[b]
                cover[b] += 1
            logit = prior_logit[c] + delta
            include = np.random.random() < 1.0 / (1.0 + math.exp(-min(max(logit, -50.0), 50.0)))
            if not include:
                for b in pos:
                    cover[b] -= 1
            state[c] = include
        if sweep >= burn_in:
            for c in range(candidates.shape[0]):
                marginal[c] += state[c]
    return marginal / max(samples, 1)


def joint_decoder(released: np.ndarray, positions: np.ndarray, p: float, size: float,
                  single_scores: np.ndarray, prior: np.ndarray | None = None,
                  prefilter: float = 4.0, burn_in: int = 1000, samples: int = 19000,
                  seed: int = 0) -> np.ndarray:
    """Posterior inclusion probabilities of every item (0 outside the prefiltered candidates)
    from a Gibbs sampler over profiles (§3.4.2): the candidates are the ``prefilter`` x size
    items the single decoder scores highest; each sweep resamples every candidate given the
    others under the exact BLIP likelihood and an independent prior per item — ``prior`` (e.g.
    item popularity, the share of known users who rated it) or size / n_items for all."""
    p = min(max(p, _P_FLOOR), 0.5 - 1e-9)
    n = positions.shape[0]
    n_cand = int(min(n, max(1, round(prefilter * size))))
    candidates = np.argsort(-single_scores, kind="stable")[:n_cand]
    pi = np.full(n, min(max(size / n, 1e-6), 1 - 1e-6)) if prior is None else np.clip(prior, 1e-6, 1 - 1e-6)
    prior_logit = np.log(pi[candidates] / (1 - pi[candidates]))
    init = np.zeros(n_cand, dtype=np.bool_)
    init[:int(min(n_cand, round(size)))] = True  # start from the single decoder's guess
    marginal = _gibbs(released.astype(np.int64), positions, candidates.astype(np.int64), prior_logit,
                      p, burn_in, samples, seed, init)
    out = np.zeros(n)
    out[candidates] = marginal
    return out


def reconstruction_cosine(profile, estimate) -> float:
    """Cosine between the true and estimated profiles as 0/1 vectors (eq. 3.36)."""
    a, b = set(np.asarray(profile).tolist()), set(np.asarray(estimate).tolist())
    return len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0


def average_precision_at(ranking, profile, r: int = 10) -> float:
    """AP@R of a ranking of items against the true profile (the mean over users is eq. 3.37)."""
    truth = set(np.asarray(profile).tolist())
    hits, total = 0, 0.0
    for rank, item in enumerate(np.asarray(ranking)[:r].tolist(), start=1):
        if item in truth:
            hits += 1
            total += hits / rank
    return total / min(r, len(truth)) if truth else 0.0


def rank_and_estimate(scores: np.ndarray, size: float, tie_break: np.ndarray | None = None):
    """Items by decreasing score (ties by ``tie_break``), and the top round(size) as the estimate."""
    order = np.lexsort((-(tie_break if tie_break is not None else np.zeros_like(scores)), -scores))
    return order, order[:max(1, int(round(size)))]


@dataclass
class JltRelease:
    """JLT release of a profile: Y = sum_{j in P} X_j + N, with a public codebook X_j ~ N(0, I/L)
    and N ~ N(0, sigma^2 I) (eq. 3.10); its single decoder scores each item by <X_j, Y>."""

    n_items: int
    dim: int = 1000
    seed: int = 0

    def __post_init__(self):
        self.codebook = np.random.default_rng(self.seed).standard_normal((self.n_items, self.dim)) / math.sqrt(self.dim)

    def release(self, profile, sigma: float, rng: np.random.Generator) -> np.ndarray:
        return self.codebook[np.asarray(profile, dtype=np.int64)].sum(axis=0) + sigma * rng.standard_normal(self.dim)

    def single_decoder_scores(self, released: np.ndarray) -> np.ndarray:
        return self.codebook @ released

    def joint_decoder(self, released: np.ndarray, sigma: float, size: float,
                      prior: np.ndarray | None = None, prefilter: float = 4.0, burn_in: int = 200,
                      samples: int = 800, seed: int = 0) -> np.ndarray:
        """Posterior inclusion probabilities from a Gibbs sampler over profiles under the exact
        Gaussian likelihood of the release, ||Y - sum_{j in X} X_j||^2 / (2 sigma^2), restricted to
        the ``prefilter`` x size candidates the single decoder scores highest."""
        n = self.n_items
        scores = self.single_decoder_scores(released)
        n_cand = int(min(n, max(1, round(prefilter * size))))
        candidates = np.argsort(-scores, kind="stable")[:n_cand]
        pi = np.full(n, min(max(size / n, 1e-6), 1 - 1e-6)) if prior is None else np.clip(prior, 1e-6, 1 - 1e-6)
        init = np.zeros(n_cand, dtype=np.bool_)
        init[:int(min(n_cand, round(size)))] = True
        marginal = _gibbs_gaussian(np.asarray(released, dtype=np.float64), self.codebook[candidates],
                                   np.log(pi[candidates] / (1 - pi[candidates])), max(sigma, 1e-3) ** 2,
                                   burn_in, samples, seed, init)
        out = np.zeros(n)
        out[candidates] = marginal
        return out


@njit(cache=True)
def _gibbs_gaussian(released, codes, prior_logit, var, burn_in, samples, seed, init):
    """Gibbs sweeps for the JLT release: the residual r = Y - sum of included codewords is kept,
    so including codeword x changes the log-likelihood by (2 r.x - ||x||^2) / (2 var)."""
    np.random.seed(seed)
    n, dim = codes.shape
    residual = released.copy()
    state = init.copy()
    for c in range(n):
        if state[c]:
            residual -= codes[c]
    norms = np.empty(n)
    for c in range(n):
        norms[c] = np.dot(codes[c], codes[c])
    marginal = np.zeros(n)
    for sweep in range(burn_in + samples):
        for c in range(n):
            if state[c]:
                residual += codes[c]
            delta = (2.0 * np.dot(residual, codes[c]) - norms[c]) / (2.0 * var)
            logit = min(max(prior_logit[c] + delta, -50.0), 50.0)
            include = np.random.random() < 1.0 / (1.0 + math.exp(-logit))
            if include:
                residual -= codes[c]
            state[c] = include
        if sweep >= burn_in:
            for c in range(n):
                marginal[c] += state[c]
    return marginal / max(samples, 1)
