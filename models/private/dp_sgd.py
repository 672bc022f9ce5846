"""DP-SGD on the count sketch: per-rating updates clipped in the space of released cells, Gaussian
noise on every cell once per noisy step.

A noisy step over a batch S of ratings, all gradients taken at the step's starting state:

    cells <- cells - lr * ( sum_{n in S} clip_C(G_n) + N(0, sigma^2 C^2 I) )

where G_n is rating n's gradient mapped into cell space — its user and item vectors and biases
written to their k cells with their signs — together with the global offset mu (learned as a
parameter, so no data-dependent mean is released), and clip_C scales it to L2 norm at most C.
The offset is parametrised as mu = theta / sqrt(B): every rating of a batch pushes it, so in
theta's units its summed step would be B times a vector's and oscillate; the fixed public
reparametrisation makes its step lr * mean error instead, and changes no privacy argument.

Why clip in cell space, not parameter space: on a sketch a component of the update reaches k
cells, and a rating's own components can share a cell (collisions inside one rating), so a bound
on the parameter gradient does not bound what the released cells move. The kernel adds the
rating's update into a scratch copy of the sketch, reads back each touched cell once (so a cell
hit twice counts once, with its summed value), and clips that exact vector: the sensitivity of
one step's sum to adding or removing one rating is then exactly C in the released space, and
the noise goes on every cell (touched or not), so which cells moved is not revealed either.

Sensitivity per privacy unit, which sets the accounted noise multiplier (``privacy.accounting``):
- rating, epoch training with Poisson sampling (each rating in each step with probability q):
  add/remove one rating, sensitivity C, multiplier sigma;
- user, epoch training sampling users (each user, with all of its ratings, capped at m, with
  probability q): sensitivity m C, multiplier sigma / m;
- rating, one pass over a stream in fixed chunks: the chunk boundaries are positions, so
  neighbouring streams replace one rating by another (length public); sensitivity 2C, and each
  rating is in exactly one step, so a pass costs one Gaussian mechanism of multiplier sigma / 2;
- user, one pass over a stream with each user's ratings capped at m: the user's steps have
  sensitivities 2 n_b C with sum n_b <= m, which compose to one Gaussian of multiplier sigma / (2m).

The private fallback (``models.private_fallback``: a DP baseline and a DP choice between it and
the factor model) takes the public share ``fallback_share`` of every pass's budget (of 1/z^2): a
pass then costs one Gaussian of multiplier sigma / (2m) * sqrt(1 - fallback_share), which
``stream_multiplier`` returns, so every ledger that charges a pass charges the fallback too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

from sketchrec.models._sgd import (BIAS_REG, INIT_STD, LR, REG, TOTAL, clip_to_range, dot,
                                   read_bias, read_factor, unpack)
from sketchrec.privacy.entropy import noise_generator
from sketchrec.privacy.joint_dp import FALLBACK_SHARE
from sketchrec.sketches.count_sketch import scatter_add

UNITS = ("rating", "user")


@dataclass(frozen=True)
class DPConfig:
    """What a DP-SGD learner needs: ``clip`` C (L2 bound of one rating's update in cell space),
    ``noise_multiplier`` sigma (noise std sigma*C per cell per step), ``batch_size`` (ratings per
    step in a stream; the expected batch in epoch training), ``unit`` ('rating' or 'user'),
    ``user_cap`` m (ratings kept per user; required for the user unit), the public
    ``rating_range`` (predictions are clipped to it; the offset starts at its midpoint), and
    ``mode``, the name reported: "dp-sgd", or "sgld-dp" when sigma comes from an SGLD temperature
    (the same noisy step: Langevin noise on every cell is a Gaussian mechanism)."""

    noise_multiplier: float
    clip: float = 1.0
    batch_size: int = 1000
    unit: str = "rating"
    user_cap: int | None = None
    rating_range: tuple[float, float] = (1.0, 5.0)
    mode: str = "dp-sgd"
    debug_noise_seed: int | None = None  # debug only: reproducible noise, no guarantee (privacy.entropy)
    fallback_share: float = FALLBACK_SHARE  # of each pass's budget, for the private fallback

    def __post_init__(self):
        if not self.noise_multiplier >= 0 or not self.clip > 0 or self.batch_size < 1:
            raise ValueError("need noise_multiplier >= 0, clip > 0 and batch_size >= 1")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}")
        if not 0 <= self.fallback_share < 1:
            raise ValueError("fallback_share must lie in [0, 1)")
        if self.unit == "user" and not (self.user_cap and self.user_cap >= 1):
            raise ValueError("the user unit needs user_cap >= 1")
        lo, hi = self.rating_range
        if not lo < hi:
            raise ValueError("rating_range must be (lower, upper) with lower < upper")
        object.__setattr__(self, "rating_range", (float(lo), float(hi)))

    @property
    def sensitivity_factor(self) -> int:
        """Ratings of one privacy unit that can reach one step's sum (1, or the cap m)."""
        return 1 if self.unit == "rating" else int(self.user_cap)

    def epoch_multiplier(self) -> float:
        """Accounted noise multiplier of one Poisson-sampled step (add/remove neighbouring)."""
        return self.noise_multiplier / self.sensitivity_factor

    def stream_multiplier(self) -> float:
        """Accounted noise multiplier of one pass over a stream in fixed chunks (replace-one),
        the private fallback's releases included (``fallback_share`` of 1/z^2)."""
        return self.noise_multiplier / (2 * self.sensitivity_factor) * math.sqrt(1 - self.fallback_share)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, value) -> "DPConfig | None":
        if value is None or isinstance(value, cls):
            return value
        return cls(**{**value, "rating_range": tuple(value.get("rating_range", (1.0, 5.0)))})


@njit(inline="always", cache=True)
def _take(scratch, addr, vals):
    """Read each touched cell once (then zero it) and return the squared norm of what was read;
    a cell touched twice gives its summed value at its first address and 0 at the second."""
    k, d = addr.shape
    sq = 0.0
    for l in range(d):
        for j in range(k):
            v = scratch[j, addr[j, l]]
            scratch[j, addr[j, l]] = 0.0
            vals[j, l] = v
            sq += v * v
    return sq


@njit(inline="always", cache=True)
def _add(acc, addr, vals, factor):
    k, d = addr.shape
    for l in range(d):
        for j in range(k):
            acc[j, addr[j, l]] += factor * vals[j, l]


@njit(nogil=True, cache=True)
def clipped_gradient_sum(store, ukeys, ikeys, ratings, hp, stats, clip, offset_scale, acc, bacc,
                         offset_acc, scratch, bscratch, out_pred):
    """Add every rating's cell-space gradient, clipped to L2 norm ``clip``, into acc / bacc /
    offset_acc[0], all at the current state of the ``FactorStore`` (its cells are not written;
    DP models keep every component in the sketch and no heavy slots). out_pred[n] gets the
    prediction made for rating n. Returns how many gradients the clipping scaled down."""
    cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i = unpack(store)[:8]
    k, d = salts_u.shape
    au, su = np.empty((k, d), dtype=np.int64), np.empty((k, d))
    ai, si = np.empty((k, d), dtype=np.int64), np.empty((k, d))
    abu, sbu = np.empty((k, 1), dtype=np.int64), np.empty((k, 1))
    abi, sbi = np.empty((k, 1), dtype=np.int64), np.empty((k, 1))
    vu, vi, vbu, vbi = np.empty((k, d)), np.empty((k, d)), np.empty((k, 1)), np.empty((k, 1))
    p, q, p0, q0 = np.empty(d), np.empty(d), np.empty(d), np.empty(d)
    gp, gq, g1, b = np.empty(d), np.empty(d), np.empty(1), np.empty(1)
    mu = stats[TOTAL]
    clipped = 0
    for n in range(ukeys.shape[0]):
        read_factor(cells, salts_u, init_u, ukeys[n], hp[INIT_STD], au, su, p, p0)
        read_factor(cells, salts_i, init_i, ikeys[n], hp[INIT_STD], ai, si, q, q0)
        bu = read_bias(bias_cells, bsalts_u, ukeys[n], abu, sbu, b)
        bi = read_bias(bias_cells, bsalts_i, ikeys[n], abi, sbi, b)
        pred = mu + bu + bi + dot(p, q)
        out_pred[n] = clip_to_range(pred, stats)
        e = pred - ratings[n]
        for l in range(d):
            gp[l] = e * q[l] + hp[REG] * p[l]
            gq[l] = e * p[l] + hp[REG] * q[l]
        scatter_add(scratch, au, su, gp)
        scatter_add(scratch, ai, si, gq)
        g1[0] = e + hp[BIAS_REG] * bu
        scatter_add(bscratch, abu, sbu, g1)
        g1[0] = e + hp[BIAS_REG] * bi
        scatter_add(bscratch, abi, sbi, g1)
        ge = e * offset_scale  # gradient in theta = mu / offset_scale
        sq = (_take(scratch, au, vu) + _take(scratch, ai, vi) + _take(bscratch, abu, vbu)
              + _take(bscratch, abi, vbi) + ge * ge)
        norm = np.sqrt(sq)
        factor = 1.0
        if norm > clip:
            factor = clip / norm
            clipped += 1
        _add(acc, au, vu, factor)
        _add(acc, ai, vi, factor)
        _add(bacc, abu, vbu, factor)
        _add(bacc, abi, vbi, factor)
        offset_acc[0] += factor * ge
    return clipped


class NoisyStepper:
    """Applies DP-SGD steps to a ``SketchMF``: owns the accumulators and the noise generator.

    It works through the model's public surface: ``store`` (the cells it reads and writes),
    ``stats`` (read), ``dp_steps`` and ``record_noisy_step``.

    Each step's noise comes from a generator keyed by fresh OS entropy (``privacy.entropy``), never
    from the model's seed or step counter, so nothing released or checkpointed predicts it."""

    def __init__(self, model, config: DPConfig):
        self.model, self.config = model, config
        vec, bias = model.store.cells, model.store.bias_cells
        self.acc, self.bacc = np.zeros(vec.shape), np.zeros(bias.shape)
        self.scratch, self.bscratch = np.zeros(vec.shape), np.zeros(bias.shape)
        self.offset_acc = np.zeros(1)
        self.offset_scale = 1.0 / np.sqrt(config.batch_size)

    def step(self, ukeys, ikeys, ratings, hp, out_pred) -> int:
        """One noisy step over the batch; returns how many of its gradients were clipped."""
        m, c = self.model, self.config
        clipped = clipped_gradient_sum(m.store, ukeys, ikeys, ratings, hp, m.stats,
                                       c.clip, self.offset_scale, self.acc, self.bacc,
                                       self.offset_acc,
                                       self.scratch, self.bscratch, out_pred)
        rng = noise_generator(c.debug_noise_seed, int(m.dp_steps[0]))
        std = c.noise_multiplier * c.clip
        lr = hp[LR]
        for cells, acc in ((m.vectors.cells, self.acc), (m.biases.cells, self.bacc)):
            if std > 0:
                acc += std * rng.standard_normal(acc.shape)
            cells -= (lr * acc).astype(cells.dtype)
            acc[:] = 0.0
        noise = std * rng.standard_normal() if std > 0 else 0.0
        m.record_noisy_step(ukeys.shape[0], self.offset_scale * lr * (self.offset_acc[0] + noise))
        self.offset_acc[0] = 0.0
        return clipped
