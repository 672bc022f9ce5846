"""White-box one-run audit of DP-SGD (the audit document's defect D1).

The attacker knows the code, the public hash seed and every served model (the state before and
after each noisy step). It "de-noises" each step with every value it can read — it regenerates
the noise from the public seed and the step index, as `default_rng([seed, step])` once drew it —
and scores each canary by the median, over the cells the canary writes, of the de-noised step
divided by the canary's own clipped write (computed exactly, by the kernel, at the step's
starting state). The Steinke-Nasr-Jagielski bound (``privacy.audit.epsilon_lower_bound``) then
certifies an epsilon lower bound from its guesses.

- With the real noise (fresh secret entropy per step) the bound must stay <= the proven epsilon.
- With the noise made reproducible on purpose (``DPConfig.debug_noise_seed`` = the public seed:
  the old generator), the same attack must certify epsilon >= 4 — so this test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from sketchrec.data import Ratings
from sketchrec.models import SketchMF
from sketchrec.models._sgd import LR
from sketchrec.models.private.dp_sgd import DPConfig, clipped_gradient_sum
from sketchrec.models.storage import ITEM, USER
from sketchrec.privacy.accounting import PrivacyLedger, calibrate_noise
from sketchrec.privacy.audit import Canaries, epsilon_lower_bound
from sketchrec.privacy.entropy import noise_generator
from sketchrec.privacy.report import privacy_figures
from sketchrec.replay.protocols import train_private_epochs
from sketchrec.sketches.count_sketch import cell_indices

SEED = 11          # the public hash seed
M, GUESS = 400, 150  # canaries; guesses at each end (300 guesses all right: epsilon >= 4.60)
SHAPE = dict(dim=8, depth=2, width=16384, lr=0.05, seed=SEED)


def background(n: int, seed: int) -> Ratings:
    rng = np.random.default_rng(seed)
    users = np.array([f"u{x}" for x in rng.integers(0, 60, n)], dtype=object)
    items = np.array([f"i{x}" for x in rng.integers(0, 80, n)], dtype=object)
    return Ratings(users, items, rng.integers(1, 6, n).astype(np.float64), np.arange(n))


class Observer:
    """Every served state: (cells, bias cells, stats, step index, hyper-parameters) before each
    noisy step, and the cells after it."""

    def __init__(self, model):
        self.model, self.steps = model, []

    def step(self, call, epoch: int, *args):
        m = self.model
        before = (m.vectors.cells.copy(), m.biases.cells.copy(), m.stats.copy(), int(m.dp_steps[0]),
                  m.hyper(epoch))
        out = call(*args)
        self.steps.append((*before, m.vectors.cells.copy(), m.biases.cells.copy()))
        return out


def denoised(model, step) -> tuple[np.ndarray, np.ndarray]:
    """The attacker's estimate of one step's clipped-gradient sum: the served difference over
    lr, minus the noise regenerated from the public seed and the step index."""
    vec0, bias0, _, index, hp, vec1, bias1 = step
    lr, c = hp[LR], model.dp
    rng = noise_generator(SEED, index)
    std = c.noise_multiplier * c.clip
    dv = (vec0.astype(np.float64) - vec1) / lr - std * rng.standard_normal(vec0.shape)
    db = (bias0.astype(np.float64) - bias1) / lr - std * rng.standard_normal(bias0.shape)
    return dv, db


def canary_cells(model, ukeys: np.ndarray, ikeys: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each canary's flat vector and bias cell indices, sorted and unique: every cell its user's
    and item's keys address, so the only cells its clipped write can touch."""
    s, n = model.store, len(ukeys)

    def both(salts, cells):
        return np.concatenate([cell_indices(salts[USER], ukeys, cells.shape[1]).reshape(n, -1),
                               cell_indices(salts[ITEM], ikeys, cells.shape[1]).reshape(n, -1)], axis=1)

    vec, bias = both(s.salts, s.cells), both(s.bias_salts, s.bias_cells)
    return [(np.unique(vec[i]), np.unique(bias[i])) for i in range(n)]


def median(x: np.ndarray) -> float:
    """``np.median`` of a short finite array, bit for bit (the same middle value, or the same
    (a + b) / 2 of the two middle values), without its general-purpose overhead."""
    x, h = np.sort(x), len(x) // 2
    return float(x[h] if len(x) % 2 else (x[h - 1] + x[h]) / 2)


def canary_scores(model, obs: Observer, canaries: Canaries, steps_of, scan: bool = False) -> np.ndarray:
    """Each canary's summed median ratio (de-noised step / its own clipped write) over the
    steps ``steps_of(i)`` it may have joined, over the cells the write made non-zero.

    Those cells are looked for among the canary's own hashed cells; ``scan=True`` looks at every
    cell and takes ``np.median`` (the straightforward reference: same cells, same order, slower)."""
    c = model.dp
    # stronger than the code-only attacker: it also holds the operator's secret id key
    ukeys, ikeys = model.id_keys.as_keys(canaries.users), model.id_keys.as_keys(canaries.items)
    own = canary_cells(model, ukeys, ikeys)
    acc, bacc = np.zeros(model.vectors.cells.shape), np.zeros(model.biases.cells.shape)
    flat, bflat = acc.reshape(-1), bacc.reshape(-1)  # views: the kernel's writes show in them
    scratch, bscratch = np.zeros_like(acc), np.zeros_like(bacc)
    offset, pred = np.zeros(1), np.zeros(1)
    scores = np.zeros(len(canaries.ratings))
    for t, step in enumerate(obs.steps):
        dv, db = (x.reshape(-1) for x in denoised(model, step))
        vec0, bias0, stats, _, hp = step[:5]
        before = model.store._replace(cells=vec0, bias_cells=bias0)  # the state the step began at
        for i in steps_of(t):
            clipped_gradient_sum(before, ukeys[i:i + 1], ikeys[i:i + 1], canaries.ratings[i:i + 1], hp,
                                 stats, c.clip, 1.0 / np.sqrt(c.batch_size), acc, bacc, offset,
                                 scratch, bscratch, pred)
            cells, bcells = own[i]
            nz = np.flatnonzero(flat) if scan else cells[flat[cells] != 0]
            bnz = np.flatnonzero(bflat) if scan else bcells[bflat[bcells] != 0]
            write = np.concatenate([flat[nz], bflat[bnz]])
            seen = np.concatenate([dv[nz], db[bnz]])
            scores[i] += float(np.median(seen / write)) if scan else median(seen / write)
            flat[nz], bflat[bnz], offset[0] = 0.0, 0.0, 0.0
    return scores


def certified(canaries: Canaries, scores: np.ndarray) -> float:
    order = np.argsort(-scores, kind="stable")
    right = int(canaries.included[order[:GUESS]].sum() + (~canaries.included[order[-GUESS:]]).sum())
    return epsilon_lower_bound(M, 2 * GUESS, right)


def stream_audit(debug_seed: int | None) -> tuple[float, float, dict]:
    """One pass over a stream in 10 fixed steps; canary i may join step i % 10 (public)."""
    steps = 10
    sigma = 2 * calibrate_noise(1.0, 1e-5)  # replace-one pass: multiplier sigma / 2
    model = SketchMF(**SHAPE, dp=DPConfig(noise_multiplier=sigma, batch_size=1000,  # DP-SGD alone:
                                          debug_noise_seed=debug_seed, fallback_share=0.0))  # no fallback
    ledger = PrivacyLedger("rating", 1e-5)
    assert ledger.begin_pass(model.dp.stream_multiplier())
    canaries = Canaries.make(M, seed=5)
    data, obs = background(140 * steps, seed=6), Observer(model)
    for t in range(steps):
        mine = [i for i in range(t, M, steps) if canaries.included[i]]
        part = data.take(slice(140 * t, 140 * (t + 1)))
        users = np.concatenate([part.users, canaries.users[mine]])
        items = np.concatenate([part.items, canaries.items[mine]])
        ratings = np.concatenate([part.ratings, canaries.ratings[mine]])
        obs.step(model.learn_many, 0, users, items, ratings)
    scores = canary_scores(model, obs, canaries, lambda t: range(t, M, steps))
    return certified(canaries, scores), ledger.epsilon(), privacy_figures(model, ledger=ledger)


def epoch_audit(debug_seed: int | None) -> tuple[float, float, dict]:
    """Poisson-sampled epochs (q = 0.2 of the released size: about 30 steps) calibrated to
    epsilon = 1; the attacker sums each canary's score over every step."""
    canaries = Canaries.make(M, seed=7)
    train = Ratings.concat([background(640, seed=8),
                            Ratings(*canaries.training_part(), np.zeros(int(canaries.included.sum())))])
    batch = int(round(0.2 * len(train)))
    model = SketchMF(**SHAPE, dp=DPConfig(noise_multiplier=0.0, batch_size=batch,
                                          debug_noise_seed=debug_seed))
    obs, call = Observer(model), model.noisy_step
    model.noisy_step = lambda u, i, r, epoch=0: obs.step(call, epoch, u, i, r, epoch)
    ledger = PrivacyLedger("rating", 1e-5)
    run = train_private_epochs(model, train, epochs=6, seed=SEED, ledger=ledger, target_epsilon=1.0)
    # round(1/q) steps an epoch, q from the size the plan releases with fresh noise (not pinned)
    assert len(obs.steps) == run["steps"] == 6 * round(1 / run["sampling_rate"])
    scores = canary_scores(model, obs, canaries, lambda t: range(M))
    return certified(canaries, scores), ledger.epsilon(), privacy_figures(model, ledger=ledger)


@pytest.mark.parametrize("audit", [stream_audit, epoch_audit], ids=["stream", "epoch"])
def test_whitebox_audit_stays_below_the_proven_epsilon_with_fresh_noise(audit):
    eps_hat, proven, figures = audit(None)
    assert figures["proven_bound"] is True and figures["epsilon"] == pytest.approx(proven)
    assert 0.95 <= proven <= 1.0 + 1e-6
    assert eps_hat <= proven


@pytest.mark.parametrize("audit", [stream_audit, epoch_audit], ids=["stream", "epoch"])
def test_whitebox_audit_catches_reproducible_noise(audit):
    eps_hat, proven, figures = audit(SEED)  # the old generator: default_rng([public seed, step])
    assert eps_hat >= 4.0 > proven
    assert figures["proven_bound"] is False and figures["epsilon"] == float("inf")


def test_scores_from_the_canaries_own_cells_equal_a_scan_of_every_cell():
    """A narrow sketch (the canaries' user and item cells collide) over three noisy steps: the
    scores read from each canary's hashed cells equal, bit for bit, those of the full scan."""
    model = SketchMF(dim=8, depth=2, width=64, lr=0.05, seed=SEED,
                     dp=DPConfig(noise_multiplier=1.0, batch_size=100, fallback_share=0.0))
    canaries, obs = Canaries.make(40, seed=3), Observer(model)
    data = background(60, seed=4)
    for t in range(3):
        part = data.take(slice(20 * t, 20 * (t + 1)))
        mine = [i for i in range(t, 40, 3) if canaries.included[i]]
        obs.step(model.learn_many, 0, np.concatenate([part.users, canaries.users[mine]]),
                 np.concatenate([part.items, canaries.items[mine]]),
                 np.concatenate([part.ratings, canaries.ratings[mine]]))
    keys = model.id_keys.as_keys(canaries.users), model.id_keys.as_keys(canaries.items)
    assert any(len(cells) < 2 * 2 * 8 for cells, _ in canary_cells(model, *keys))  # collisions
    fast = canary_scores(model, obs, canaries, lambda t: range(40))
    assert np.array_equal(fast, canary_scores(model, obs, canaries, lambda t: range(40), scan=True))
    assert np.all(fast != 0)
