"""Compiled SGD / SGLD loops for biased matrix factorization, on sketch storage and on dense arrays.

Model (thesis eq. 2.7 with biases): r^ = mu + b_u + b_i + p_u . q_i. One rating's step, with
e = r^ - r (the derivative of L = e^2 / 2):
    p_u += -lr * (e * q_i + reg * p_u)            q_i += -lr * (e * p_u + reg * q_i)
    b_u += -lr * (e + bias_reg * b_u)             b_i += -lr * (e + bias_reg * b_i)
On a count sketch these deltas are written to each of the k cells with their signs (eq. 4.3/4.4).
SGLD adds sqrt(lr) * N(0, tau) to each touched parameter (eq. 2.13/2.14); on a sketch each touched
cell gets sqrt(k * lr * tau) * N(0, 1), so the mean of the k cells moves by exactly N(0, lr * tau).

Latent vectors start from a deterministic hash-derived uniform draw (std ``init_std``) instead of
stored random cells: the sketch holds only what was learned, a new id gets its own starting
vector, and the dense and sketch learners start from identical points.

The sketch learner's kernels take its parameters as one ``models.storage.FactorStore``; its learning
loop is ``models._learn``'s, which inlines the helpers here.

The loops run sequentially (true SGD order) with the GIL released, so a concurrent reader can
query the model while it learns; a reader may see a vector mid-update but never a NaN.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.sketches.count_sketch import gather_mean, locate
from sketchrec.sketches.hashing import mix64, unit_interval
from sketchrec.models._adaptive import sum_squares
from sketchrec.models.heavy_filter import find
from sketchrec.models.implicit import implicit_sum, row_of
from sketchrec.models.storage import ITEM, USER

# positions in the hyper-parameter vector handed to the kernels
LR, REG, BIAS_REG, INIT_STD, CLIP_LOSS, SGLD_TAU, OPTIMIZER, ACC0, IMPLICIT_LR, IMPLICIT_REG = range(10)
# positions in the running-statistics vector: count, sum, min, max of learned ratings
COUNT, TOTAL, RMIN, RMAX = range(4)
# positions in the counters vector
LEARNED, SKIPPED_CLIP, SKIPPED_DIVERGED = range(3)
DIVERGED = 1e6  # error or update norm beyond which a step counts as divergence (float32 cells)

_ONE = np.uint64(1)


@njit(inline="always", cache=True)
def init_vector(key, init_salts, init_std, out):
    """Deterministic uniform(-a, a) start vector of a key, std init_std.

    One full mix of the key, then a multiply by each component's odd salt; the product's top 53
    bits give the uniform draw (cheap, and independent enough across components for a start point).
    """
    half_range = init_std * 1.7320508075688772  # sqrt(3): uniform std -> half range
    mixed = mix64(key ^ init_salts[0])
    for l in range(init_salts.shape[0]):
        out[l] = (2.0 * unit_interval(mixed * (init_salts[l] | _ONE)) - 1.0) * half_range


@njit(cache=True)
def init_rows(keys, init_salts, init_std):
    out = np.empty((keys.shape[0], init_salts.shape[0]), dtype=np.float64)
    for n in range(keys.shape[0]):
        init_vector(keys[n], init_salts, init_std, out[n])
    return out


@njit(inline="always", cache=True)
def mean_of(stats):
    return stats[TOTAL] / stats[COUNT] if stats[COUNT] > 0 else 0.0


@njit(inline="always", cache=True)
def clip_to_range(pred, stats):
    if stats[COUNT] > 0:
        return min(max(pred, stats[RMIN]), stats[RMAX])
    return pred


@njit(inline="always", cache=True)
def record_rating(stats, r):
    if stats[COUNT] == 0:
        stats[RMIN] = r
        stats[RMAX] = r
    else:
        stats[RMIN] = min(stats[RMIN], r)
        stats[RMAX] = max(stats[RMAX], r)
    stats[COUNT] += 1
    stats[TOTAL] += r


@njit(inline="always", cache=True)
def sgd_deltas(e, p, q, bu, bi, hp, dp, dq):
    """Fill dp, dq with the latent steps; return the two bias steps and whether the step is sane.

    A diverging learner (learning rate too high) must not write inf or NaN into float32 cells:
    a step whose error or update norm exceeds DIVERGED is skipped and counted instead."""
    lr, reg = hp[LR], hp[REG]
    for l in range(p.shape[0]):
        dp[l] = -lr * (e * q[l] + reg * p[l])
        dq[l] = -lr * (e * p[l] + reg * q[l])
    dbu, dbi = -lr * (e + hp[BIAS_REG] * bu), -lr * (e + hp[BIAS_REG] * bi)
    energy = sum_squares(dp) + sum_squares(dq) + dbu * dbu + dbi * dbi + e * e
    return dbu, dbi, energy < DIVERGED * DIVERGED  # False for inf and NaN too


@njit(inline="always", cache=True)
def step_or_skip(e, p, q, bu, bi, hp, counters, dp, dq):
    """One rating's step decision, shared by both learners: skip (and count) it when its loss
    exceeds the clipping epsilon (thesis §4.2.1) or when it would diverge; else fill the deltas."""
    if e * e > hp[CLIP_LOSS]:
        counters[SKIPPED_CLIP] += 1
        return False, 0.0, 0.0
    dbu, dbi, sane = sgd_deltas(e, p, q, bu, bi, hp, dp, dq)
    if not sane:
        counters[SKIPPED_DIVERGED] += 1
    return sane, dbu, dbi


@njit(cache=True)
def seed_numba(seed):
    np.random.seed(seed)


@njit(inline="always", cache=True)
def dot(a, b):
    """Plain loop: numba's np.dot needs SciPy's BLAS, which is not a runtime dependency."""
    acc = 0.0
    for l in range(a.shape[0]):
        acc += a[l] * b[l]
    return acc


@njit(inline="always", cache=True)
def read_factor(cells, salts, init_salts, key, init_std, addr, sign, out, start):
    """Locate a key's cells (kept in addr/sign for the write-back) and read its full latent
    vector: the sketch estimate plus the key's start vector."""
    locate(salts, key, cells.shape[1], addr, sign)
    gather_mean(cells, addr, sign, out)  # the first salts.shape[1] components (the sketched ones)
    for l in range(salts.shape[1], out.shape[0]):
        out[l] = 0.0
    add_start(key, init_salts, init_std, out, start)


@njit(inline="always", cache=True)
def add_start(key, init_salts, init_std, out, start):
    """out += the key's start vector (both learners store only what was learned on top of it)."""
    init_vector(key, init_salts, init_std, start)
    for l in range(out.shape[0]):
        out[l] += start[l]


@njit(inline="always", cache=True)
def read_vector(cells, salts, init_salts, fvectors, slot, key, init_std, addr, sign, out, start):
    """read_factor for an id that may hold a heavy-filter slot (slot >= 0: exact, no sketch)."""
    if slot < 0:
        read_factor(cells, salts, init_salts, key, init_std, addr, sign, out, start)
        return
    row = fvectors[slot]
    for l in range(out.shape[0]):
        out[l] = row[l]
    add_start(key, init_salts, init_std, out, start)


@njit(inline="always", cache=True)
def read_id(cells, salts, init_salts, fkeys, ffamilies, fcounts, fvectors, key, family, init_std,
            addr, sign, out, start):
    """An id's full latent vector, from its filter slot if it holds one, else from the sketch;
    returns the slot (-1: none)."""
    slot = find(fkeys, ffamilies, fcounts, key, family)
    read_vector(cells, salts, init_salts, fvectors, slot, key, init_std, addr, sign, out, start)
    return slot


@njit(inline="always", cache=True)
def read_bias(bias_cells, salts, key, addr, sign, scratch):
    locate(salts, key, bias_cells.shape[1], addr, sign)
    gather_mean(bias_cells, addr, sign, scratch)
    return scratch[0]


@njit(inline="always", cache=True)
def read_bias_of(bias_cells, salts, fvectors, slot, key, addr, sign, scratch):
    """read_bias for an id that may hold a heavy-filter slot (its bias is the slot's last column)."""
    if slot < 0:
        return read_bias(bias_cells, salts, key, addr, sign, scratch)
    return np.float64(fvectors[slot, fvectors.shape[1] - 1])


@njit(cache=True)   # rare (a slot taken by the other id): a call, not IR-inlined
def locate_in_sketch(cells, bias_cells, salts, bsalts, key, addr, sign, baddr, bsign):
    """Addresses of an id that has just lost its filter slot; returns -1 (its slot now)."""
    locate(salts, key, cells.shape[1], addr, sign)
    locate(bsalts, key, bias_cells.shape[1], baddr, bsign)
    return -1


@njit(inline="always", cache=True)
def unpack(store):
    """The store's arrays as plain locals, each family's salts apart: a kernel takes them once
    before its loop (tuple fields or views read per rating made predictions much slower)."""
    salts, bias_salts, init_salts = store.salts, store.bias_salts, store.init_salts
    keys, families, counts, vectors = store.heavy
    return (store.cells, store.bias_cells, salts[USER], salts[ITEM], bias_salts[USER],
            bias_salts[ITEM], init_salts[USER], init_salts[ITEM], keys, families, counts, vectors)


@njit(inline="always", cache=True)
def add_implicit(imp, ukey, p, z):
    """p += the user's implicit term (``models.implicit``; z is scratch)."""
    row = row_of(imp, ukey, False)
    if row >= 0 and implicit_sum(imp, row, z):
        for l in range(p.shape[0]):
            p[l] += z[l]


@njit(inline="always", cache=True)
def read_scratch(salts, init_salts):
    """Buffers for reading one rating's factors: addresses and signs (vectors, biases), p, q,
    a start vector and a bias. salts (k x sketched components) and init_salts (d) size them."""
    k, sketched, d = salts.shape[0], salts.shape[1], init_salts.shape[0]
    return (np.empty((k, sketched), dtype=np.int64), np.empty((k, sketched)),
            np.empty((k, 1), dtype=np.int64),
            np.empty((k, 1)), np.empty(d), np.empty(d), np.empty(d), np.empty(1))


def sketch_predict(store, ukeys, ikeys, hp, stats, clip, out):
    """Predictions of many (user, item) pairs, clipped to the rating range when ``clip`` (the
    implicit term added when its history has rows: one kernel either way, as in ``sketch_learn``)."""
    _predict(store, ukeys, ikeys, hp, stats, clip, out)


@njit(nogil=True, cache=True)
def _predict(store, ukeys, ikeys, hp, stats, clip, out):
    (cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i,
     fkeys, ffamilies, fcounts, fvectors) = unpack(store)
    addr, sign, baddr, bsign, p, q, start, b = read_scratch(salts_u, init_u)
    sides = ((salts_u, bsalts_u, init_u, p), (salts_i, bsalts_i, init_i, q))
    bias = np.empty(2)
    mu = mean_of(stats)
    imp = store.implicit
    implicit_on = imp.owners.shape[0] > 0
    for n in range(ukeys.shape[0]):
        keys = (ukeys[n], ikeys[n])
        for s in range(2):   # the user's reads, then the item's: one copy of the code (as _learn)
            salts, bsalts, init, vec = sides[s]
            slot = read_id(cells, salts, init, fkeys, ffamilies, fcounts, fvectors, keys[s], s,
                           hp[INIT_STD], addr, sign, vec, start)
            bias[s] = read_bias_of(bias_cells, bsalts, fvectors, slot, keys[s], baddr, bsign, b)
        if implicit_on:
            add_implicit(imp, ukeys[n], p, start)
        pred = mu + dot(p, q) + bias[USER] + bias[ITEM]
        out[n] = clip_to_range(pred, stats) if clip else pred


@njit(nogil=True, cache=True)
def sketch_score(store, ukey, ikeys, hp, stats, out):
    """Unclipped scores of many items for ONE user (ranking): the user's vector is read once."""
    (cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i,
     fkeys, ffamilies, fcounts, fvectors) = unpack(store)
    addr, sign, baddr, bsign, p, q, start, b = read_scratch(salts_u, init_u)
    uslot = read_id(cells, salts_u, init_u, fkeys, ffamilies, fcounts, fvectors, ukey, USER,
                    hp[INIT_STD], addr, sign, p, start)
    add_implicit(store.implicit, ukey, p, start)
    base = mean_of(stats) + read_bias_of(bias_cells, bsalts_u, fvectors, uslot, ukey, baddr, bsign, b)
    for n in range(ikeys.shape[0]):
        islot = read_id(cells, salts_i, init_i, fkeys, ffamilies, fcounts, fvectors, ikeys[n], ITEM,
                        hp[INIT_STD], addr, sign, q, start)
        out[n] = (base + dot(p, q)
                  + read_bias_of(bias_cells, bsalts_i, fvectors, islot, ikeys[n], baddr, bsign, b))


@njit(nogil=True, cache=True)
def sketch_factors(store, keys, family, init_std, vectors, biases):
    """Latent vectors and biases of many ids of one family, as the model sees them."""
    cells, bias_cells, salts, bsalts, init_salts = (store.cells, store.bias_cells, store.salts[family],
                                                    store.bias_salts[family], store.init_salts[family])
    fkeys, ffamilies, fcounts, fvectors = store.heavy
    addr, sign, baddr, bsign, p, q, start, b = read_scratch(salts, init_salts)
    for n in range(keys.shape[0]):
        slot = read_id(cells, salts, init_salts, fkeys, ffamilies, fcounts, fvectors, keys[n],
                       family, init_std, addr, sign, vectors[n], start)
        if family == USER:
            add_implicit(store.implicit, keys[n], vectors[n], start)
        biases[n] = read_bias_of(bias_cells, bsalts, fvectors, slot, keys[n], baddr, bsign, b)
