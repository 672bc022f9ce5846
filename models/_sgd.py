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

The sketch learner's kernels take its parameters as one ``models.storage.FactorStore``.

The loops run sequentially (true SGD order) with the GIL released, so a concurrent reader can
query the model while it learns; a reader may see a vector mid-update but never a NaN.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.sketches.count_sketch import gather_mean, locate
from sketchrec.sketches.hashing import mix64, unit_interval
from sketchrec.models._adaptive import (ADAGRAD, ADAGRAD_ID, adagrad_id_scale, adagrad_scale, adopt,
                                        sum_squares)
from sketchrec.models.heavy_filter import find, touch
from sketchrec.models.implicit import implicit_step, implicit_sum, remember, row_of
from sketchrec.models._writes import write_plain, write_slot_or_cells
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
    before its loop (tuple fields or views read per rating made predictions 1.6x slower)."""
    salts, bias_salts, init_salts = store.salts, store.bias_salts, store.init_salts
    keys, families, counts, vectors = store.heavy
    return (store.cells, store.bias_cells, salts[USER], salts[ITEM], bias_salts[USER],
            bias_salts[ITEM], init_salts[USER], init_salts[ITEM], keys, families, counts, vectors)


def sketch_learn(store, acc, ukeys, ikeys, ratings, hp, stats, counters, out_pred):
    """Sequential SGD over a batch on a ``FactorStore``; out_pred[n] is the prediction made before
    rating n was learned. With hp[OPTIMIZER] other than SGD the steps are AdaGrad's (per
    coordinate or per id), its sums in ``acc`` (``models._adaptive.Accumulators``).

    Ids holding a heavy-filter slot (``store.heavy``, see models.heavy_filter) are read and
    written there; every rating first counts its user and item in the filter.

    The kernel takes the sums as the argument of the optimizer that runs and None for the other:
    numba drops the branches of a None argument before compiling, so a run compiles the steps of
    its optimizer only (a kernel per optimizer used); likewise the implicit term's history (None
    when the term is off) and SGLD's noisy writes (None without a temperature)."""
    mode = int(hp[OPTIMIZER])
    imp = store.implicit if store.implicit.owners.shape[0] > 0 else None   # the term is on
    sgld = hp if hp[SGLD_TAU] > 0.0 else None   # SGLD's noisy writes
    _learn(store, acc if mode == ADAGRAD else None, acc if mode == ADAGRAD_ID else None, imp, sgld,
           ukeys, ikeys, ratings, hp, stats, counters, out_pred)


@njit(nogil=True, cache=True)
def _learn(store, per_coordinate, per_id, imp, sgld, ukeys, ikeys, ratings, hp, stats, counters,
           out_pred):
    # the user's and the item's reads, sightings, steps and writes are each written once, in loops
    # over the sides (the user's first: the order the results depend on): numba types and lowers
    # that code once instead of once per side or per write, which was most of a first run's compile
    (cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i,
     fkeys, ffamilies, fcounts, fvectors) = unpack(store)
    k, sketched = salts_u.shape
    d = init_u.shape[0]
    au, ai = np.empty((k, sketched), dtype=np.int64), np.empty((k, sketched), dtype=np.int64)
    su, si = np.empty((k, sketched)), np.empty((k, sketched))
    abu, abi = np.empty((k, 1), dtype=np.int64), np.empty((k, 1), dtype=np.int64)
    sbu, sbi = np.empty((k, 1)), np.empty((k, 1))
    p, q, p0, q0, z, pz = np.empty(d), np.empty(d), np.empty(d), np.empty(d), np.empty(d), np.empty(d)
    dp, dq, dbu, dbi, b = np.empty(d), np.empty(d), np.empty(1), np.empty(1), np.empty(1)
    sides = ((salts_u, bsalts_u, init_u, au, su, abu, sbu, p, p0),
             (salts_i, bsalts_i, init_i, ai, si, abi, sbi, q, q0))
    # the four writes in their order: user vector, item vector, user bias, item bias
    zero = np.int64(0)
    writes = ((cells, zero, au, su, abu, dp), (cells, zero, ai, si, abi, dq),
              (bias_cells, d, abu, sbu, abu, dbu), (bias_cells, d, abi, sbi, abi, dbi))
    slots, was, bias = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64), np.empty(2)
    tau = hp[SGLD_TAU]
    noise_std = np.sqrt(k * hp[LR] * tau) if tau > 0.0 else 0.0
    slot_noise_std = np.sqrt(hp[LR] * tau) if tau > 0.0 else 0.0
    exchange = np.empty(d + 1)
    clock = np.uint64(counters[LEARNED] + counters[SKIPPED_CLIP] + counters[SKIPPED_DIVERGED])
    for n in range(ukeys.shape[0]):
        clock += _ONE
        keys = (ukeys[n], ikeys[n])
        for s in range(2):
            salts, bsalts, init, addr, sign, baddr, bsign, vec, start = sides[s]
            slots[s] = read_id(cells, salts, init, fkeys, ffamilies, fcounts, fvectors, keys[s], s,
                               hp[INIT_STD], addr, sign, vec, start)
            bias[s] = read_bias_of(bias_cells, bsalts, fvectors, slots[s], keys[s], baddr, bsign, b)
        row, held = -1, 0
        if imp is not None:
            row = row_of(imp, ukeys[n], False)
            held = implicit_sum(imp, row, z) if row >= 0 else 0
        if held:  # the user's whole vector, summed as the predicting kernels sum it
            for l in range(d):
                pz[l] = p[l] + z[l]
        pred = mean_of(stats) + bias[USER] + bias[ITEM] + dot(pz if held else p, q)
        out_pred[n] = clip_to_range(pred, stats)
        # count the sightings after the prediction, which is then exactly what predict_many
        # returns beforehand; an id admitted now takes its step in its new slot
        was[0], was[1] = slots[0], slots[1]
        for s in range(2):
            salts, bsalts, init, addr, sign, baddr, bsign, vec, start = sides[s]
            slots[s] = touch(fkeys, ffamilies, fcounts, fvectors, store, keys[s], s, slots[s], clock,
                             addr, sign, baddr, bsign, exchange)
            o = 1 - s   # the other side: when this id took its slot, it is in the sketch now
            if slots[o] >= 0 and slots[o] == slots[s]:
                osalts, obsalts, _, oaddr, osign, obaddr, obsign, _, _ = sides[o]
                slots[o] = locate_in_sketch(cells, bias_cells, osalts, obsalts, keys[o], oaddr, osign,
                                            obaddr, obsign)
            if slots[s] >= 0 and slots[s] != was[s]:
                if per_coordinate is not None:
                    adopt(per_coordinate, ADAGRAD, slots[s], addr, baddr)
                if per_id is not None:
                    adopt(per_id, ADAGRAD_ID, slots[s], addr, baddr)
        take, step_u, step_i = step_or_skip(pred - ratings[n], p, q, bias[USER], bias[ITEM], hp,
                                            counters, dp, dq)
        if not take:
            continue
        if held:  # the item's step follows the user's whole vector p + z; z's own, the y's
            for l in range(d):
                dq[l] -= hp[LR] * (pred - ratings[n]) * z[l]
            if imp is not None:   # always, when held
                implicit_step(imp, row, held, pred - ratings[n], q, hp[IMPLICIT_LR], hp[IMPLICIT_REG])
        if imp is not None:
            remember(imp, row, ukeys[n], ikeys[n])
        dbu[0], dbi[0] = step_u, step_i
        for w in range(4):
            # AdaGrad scales a step from its own sums only, so each write may follow its scaling
            target, offset, addr, sign, baddr, delta = writes[w]
            slot = slots[w % 2]
            if per_coordinate is not None:
                adagrad_scale(per_coordinate.cells if w < 2 else per_coordinate.bias_cells,
                              per_coordinate.heavy, slot, offset, addr, delta, hp[LR], hp[ACC0])
            if per_id is not None:
                adagrad_id_scale(per_id.cells if w < 2 else per_id.bias_cells, per_id.heavy, slot,
                                 w // 2, baddr, delta, hp[LR], hp[ACC0])
            if sgld is None:   # pruned before compiling when the argument is None (see sketch_learn)
                write_plain(target, fvectors, slot, offset, addr, sign, delta)
            else:
                write_slot_or_cells(target, fvectors, slot, offset, addr, sign, delta, noise_std,
                                    slot_noise_std)
        record_rating(stats, ratings[n])
        counters[LEARNED] += 1


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
    """Predictions of many (user, item) pairs, clipped to the rating range when ``clip``: the
    kernel takes the implicit term's history as None when the term is off (pruned before compiling,
    as in ``sketch_learn``)."""
    imp = store.implicit if store.implicit.owners.shape[0] > 0 else None
    _predict(store, imp, ukeys, ikeys, hp, stats, clip, out)


@njit(nogil=True, cache=True)
def _predict(store, imp, ukeys, ikeys, hp, stats, clip, out):
    (cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i,
     fkeys, ffamilies, fcounts, fvectors) = unpack(store)
    addr, sign, baddr, bsign, p, q, start, b = read_scratch(salts_u, init_u)
    sides = ((salts_u, bsalts_u, init_u, p), (salts_i, bsalts_i, init_i, q))
    bias = np.empty(2)
    mu = mean_of(stats)
    for n in range(ukeys.shape[0]):
        keys = (ukeys[n], ikeys[n])
        for s in range(2):   # the user's reads, then the item's: one copy of the code (as _learn)
            salts, bsalts, init, vec = sides[s]
            slot = read_id(cells, salts, init, fkeys, ffamilies, fcounts, fvectors, keys[s], s,
                           hp[INIT_STD], addr, sign, vec, start)
            bias[s] = read_bias_of(bias_cells, bsalts, fvectors, slot, keys[s], baddr, bsign, b)
        if imp is not None:
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
