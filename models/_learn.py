"""The sketch learner's SGD / AdaGrad / SGLD loop over a batch (the model, its steps and their noise
are in ``models._sgd``, whose helpers it inlines).

The loop runs on borrowed arrays (``models._intrinsics.borrow``): numba's reference counting,
an atomic add per copy of an array, had cost as much as the learning itself. Its caller holds every
array for the call: ``_learn`` allocates the scratch and ``_steps`` runs the ratings.

Each rating first asks the CPU for what a later rating will read (``look_ahead``): the filter
bucket of the ratings 8 places ahead, and the slot rows or sketch cells of those 3 places ahead,
so their cache misses overlap the current rating's work. A hint only: the ids' slots may change
before their rating comes, and the values learned are the same.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models._adaptive import (ADAGRAD, ADAGRAD_ID, Accumulators, adagrad_id_scale,
                                        adagrad_scale, adopt)
from sketchrec.models._intrinsics import borrow, prefetch
from sketchrec.models._sgd import (ACC0, IMPLICIT_LR, IMPLICIT_REG, INIT_STD, LEARNED, LR,
                                   OPTIMIZER, SGLD_TAU, SKIPPED_CLIP, SKIPPED_DIVERGED, _ONE,
                                   clip_to_range, dot, locate_in_sketch, mean_of, read_bias_of,
                                   read_id, record_rating, step_or_skip, unpack)
from sketchrec.models._writes import write_plain, write_slot_or_cells
from sketchrec.models.heavy_filter import _bucket_start, find, touch
from sketchrec.models.implicit import Implicit, implicit_step, implicit_sum, remember, row_of
from sketchrec.models.storage import ITEM, USER, FactorStore, HeavySlots
from sketchrec.sketches.count_sketch import locate

BUCKET_AHEAD, ROWS_AHEAD = 8, 3   # ratings ahead whose filter bucket, slots or cells are fetched


def sketch_learn(store, acc, ukeys, ikeys, ratings, hp, stats, counters, out_pred):
    """Sequential SGD over a batch on a ``FactorStore``; out_pred[n] is the prediction made before
    rating n was learned. With hp[OPTIMIZER] other than SGD the steps are AdaGrad's (per
    coordinate or per id), its sums in ``acc`` (``models._adaptive.Accumulators``).

    Ids holding a heavy-filter slot (``store.heavy``, see models.heavy_filter) are read and
    written there; every rating first counts its user and item in the filter.

    The kernel takes the sums as the argument of the optimizer that runs and None for the other,
    and SGLD's noisy writes as None without a temperature: numba drops the branches of a None
    argument before compiling, so a run compiles the steps of its optimizer only (a kernel per
    optimizer used). Compiled in, those branches slow the plain SGD loop measurably even when never
    taken (AdaGrad's scaling calls and SGLD's random draws keep the compiler from the plain loop's
    optimisations). The implicit term (on when its history has rows) is decided per call instead,
    by a branch each rating predicts the same way and which costs the loop nothing measurable:
    pruning it too had meant a kernel, and a first-use compile, per optimizer and term."""
    mode = int(hp[OPTIMIZER])
    sgld = hp if hp[SGLD_TAU] > 0.0 else None
    _learn(store, acc if mode == ADAGRAD else None, acc if mode == ADAGRAD_ID else None, sgld,
           ukeys, ikeys, ratings, hp, stats, counters, out_pred)


@njit(nogil=True, cache=True)
def _learn(store, per_coordinate, per_id, sgld, ukeys, ikeys, ratings, hp, stats, counters, out_pred):
    # the scratch, held here for the whole loop (which borrows it): per side (user, item, and a
    # third for the look-ahead) addresses and signs of the vector and bias cells, p or q and a
    # start vector; then z, p + z, the two vector steps; the two bias steps and a bias; slots
    k, sketched, d = store.salts.shape[1], store.salts.shape[2], store.init_salts.shape[1]
    side_work = (np.empty((3, k, sketched), dtype=np.int64), np.empty((3, k, sketched)),
                 np.empty((3, k, 1), dtype=np.int64), np.empty((3, k, 1)), np.empty((2, d)),
                 np.empty((2, d)))
    work = (np.empty((4, d)), np.empty((3, 1)), np.empty((2, 2), dtype=np.int64), np.empty(2),
            np.empty(d + 1))
    _steps(store, per_coordinate, per_id, sgld, ukeys, ikeys, ratings, hp, stats, counters, out_pred,
           side_work, work)


@njit(inline="always", cache=True)
def borrow_store(store):
    """The store with every array borrowed (``models._intrinsics.borrow``)."""
    heavy, history = store.heavy, store.implicit
    return FactorStore(borrow(store.cells), borrow(store.bias_cells), borrow(store.salts),
                       borrow(store.bias_salts), borrow(store.init_salts),
                       HeavySlots(borrow(heavy.keys), borrow(heavy.families), borrow(heavy.counts),
                                  borrow(heavy.vectors)),
                       Implicit(borrow(history.vectors), borrow(history.items), borrow(history.owners),
                                borrow(history.seen)))


@njit(inline="always", cache=True)
def borrow_sums(acc):
    """AdaGrad's sums borrowed."""
    return Accumulators(borrow(acc.cells), borrow(acc.bias_cells), borrow(acc.heavy))


@njit(nogil=True, cache=True)   # a call, not IR-inlined: the loop compiles less
def look_ahead(fkeys, ffamilies, fcounts, fvectors, cells, bias_cells, ukeys, ikeys, n, salts_u,
               salts_i, bsalts_u, bsalts_i, addr, sign, baddr, bsign):
    """Prefetch the filter buckets of rating n + BUCKET_AHEAD, and the slot rows (an id holding
    one) or the vector and bias cells (an id in the sketch) of rating n + ROWS_AHEAD."""
    n_slots = fcounts.shape[0]
    if n + BUCKET_AHEAD < ukeys.shape[0] and n_slots > 0:
        for s in range(2):
            at = _bucket_start(ukeys[n + BUCKET_AHEAD] if s == USER else ikeys[n + BUCKET_AHEAD],
                               s, n_slots)
            prefetch(fkeys, at)
            prefetch(fcounts, at)
            prefetch(ffamilies, at)
    if n + ROWS_AHEAD >= ukeys.shape[0]:
        return
    for s in range(2):
        key = ukeys[n + ROWS_AHEAD] if s == USER else ikeys[n + ROWS_AHEAD]
        slot = find(fkeys, ffamilies, fcounts, key, s)
        if slot >= 0:
            for l in range(0, fvectors.shape[1], 16):   # 16 float32: a cache line
                prefetch(fvectors, (slot, l))
            prefetch(fvectors, (slot, fvectors.shape[1] - 1))
            continue
        locate(salts_u if s == USER else salts_i, key, cells.shape[1], addr, sign)
        for j in range(addr.shape[0]):
            for l in range(addr.shape[1]):
                prefetch(cells, (j, addr[j, l]))
        locate(bsalts_u if s == USER else bsalts_i, key, bias_cells.shape[1], baddr, bsign)
        for j in range(baddr.shape[0]):
            prefetch(bias_cells, (j, baddr[j, 0]))


@njit(nogil=True, cache=True)
def _steps(store, per_coordinate, per_id, sgld, ukeys, ikeys, ratings, hp, stats, counters, out_pred,
           side_work, work):
    # every array borrowed (module docstring); the sums under new names: numba prunes the
    # branches of a None argument only while the argument is never assigned
    store = borrow_store(store)
    history = store.implicit
    implicit_on = history.owners.shape[0] > 0   # the term is on (see sketch_learn)
    if per_coordinate is not None:
        coordinate_sums = borrow_sums(per_coordinate)
    if per_id is not None:
        id_sums = borrow_sums(per_id)
    ukeys, ikeys, ratings, hp = borrow(ukeys), borrow(ikeys), borrow(ratings), borrow(hp)
    stats, counters, out_pred = borrow(stats), borrow(counters), borrow(out_pred)
    (cells, bias_cells, salts_u, salts_i, bsalts_u, bsalts_i, init_u, init_i,
     fkeys, ffamilies, fcounts, fvectors) = unpack(store)
    k = salts_u.shape[0]
    d = init_u.shape[0]
    addrs, signs = borrow(side_work[0]), borrow(side_work[1])
    baddrs, bsigns = borrow(side_work[2]), borrow(side_work[3])
    vecs, starts = borrow(side_work[4]), borrow(side_work[5])
    au, ai, ahead_addr, su, si, ahead_sign = addrs[0], addrs[1], addrs[2], signs[0], signs[1], signs[2]
    abu, abi, ahead_baddr = baddrs[0], baddrs[1], baddrs[2]
    sbu, sbi, ahead_bsign = bsigns[0], bsigns[1], bsigns[2]
    p, q, p0, q0 = vecs[0], vecs[1], starts[0], starts[1]
    vectors, ones, ints = borrow(work[0]), borrow(work[1]), borrow(work[2])
    bias, exchange = borrow(work[3]), borrow(work[4])
    z, pz, dp, dq = vectors[0], vectors[1], vectors[2], vectors[3]
    dbu, dbi, b, slots, was = ones[0], ones[1], ones[2], ints[0], ints[1]
    # the user's and the item's reads, sightings, steps and writes are each written once, in loops
    # over the sides (the user's first: the order the results depend on): numba types and lowers
    # that code once instead of once per side or per write, which was most of a first run's compile
    sides = ((salts_u, bsalts_u, init_u, au, su, abu, sbu, p, p0),
             (salts_i, bsalts_i, init_i, ai, si, abi, sbi, q, q0))
    # the four writes in their order: user vector, item vector, user bias, item bias
    zero = np.int64(0)
    writes = ((cells, zero, au, su, abu, dp), (cells, zero, ai, si, abi, dq),
              (bias_cells, d, abu, sbu, abu, dbu), (bias_cells, d, abi, sbi, abi, dbi))
    tau = hp[SGLD_TAU]
    noise_std = np.sqrt(k * hp[LR] * tau) if tau > 0.0 else 0.0
    slot_noise_std = np.sqrt(hp[LR] * tau) if tau > 0.0 else 0.0
    clock = np.uint64(counters[LEARNED] + counters[SKIPPED_CLIP] + counters[SKIPPED_DIVERGED])
    for n in range(ukeys.shape[0]):
        clock += _ONE
        look_ahead(fkeys, ffamilies, fcounts, fvectors, cells, bias_cells, ukeys, ikeys, n, salts_u,
                   salts_i, bsalts_u, bsalts_i, ahead_addr, ahead_sign, ahead_baddr, ahead_bsign)
        keys = (ukeys[n], ikeys[n])
        for s in range(2):
            salts, bsalts, init, addr, sign, baddr, bsign, vec, start = sides[s]
            slots[s] = read_id(cells, salts, init, fkeys, ffamilies, fcounts, fvectors, keys[s], s,
                               hp[INIT_STD], addr, sign, vec, start)
            bias[s] = read_bias_of(bias_cells, bsalts, fvectors, slots[s], keys[s], baddr, bsign, b)
        row, held = -1, 0
        if implicit_on:
            row = row_of(history, ukeys[n], False)
            held = implicit_sum(history, row, z) if row >= 0 else 0
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
                    adopt(coordinate_sums, ADAGRAD, slots[s], addr, baddr)
                if per_id is not None:
                    adopt(id_sums, ADAGRAD_ID, slots[s], addr, baddr)
        take, step_u, step_i = step_or_skip(pred - ratings[n], p, q, bias[USER], bias[ITEM], hp,
                                            counters, dp, dq)
        if not take:
            continue
        if held:  # the item's step follows the user's whole vector p + z; z's own, the y's
            for l in range(d):
                dq[l] -= hp[LR] * (pred - ratings[n]) * z[l]
            if implicit_on:   # always, when held
                implicit_step(history, row, held, pred - ratings[n], q, hp[IMPLICIT_LR], hp[IMPLICIT_REG])
        if implicit_on:
            remember(history, row, ukeys[n], ikeys[n])
        dbu[0], dbi[0] = step_u, step_i
        for w in range(4):
            # AdaGrad scales a step from its own sums only, so each write may follow its scaling
            target, offset, addr, sign, baddr, delta = writes[w]
            slot = slots[w % 2]
            if per_coordinate is not None:
                adagrad_scale(coordinate_sums.cells if w < 2 else coordinate_sums.bias_cells,
                              coordinate_sums.heavy, slot, offset, addr, delta, hp[LR], hp[ACC0])
            if per_id is not None:
                adagrad_id_scale(id_sums.cells if w < 2 else id_sums.bias_cells, id_sums.heavy, slot,
                                 w // 2, baddr, delta, hp[LR], hp[ACC0])
            if sgld is None:   # pruned before compiling when the argument is None (sketch_learn)
                write_plain(target, fvectors, slot, offset, addr, sign, delta)
            else:
                write_slot_or_cells(target, fvectors, slot, offset, addr, sign, delta, noise_std,
                                    slot_noise_std)
        record_rating(stats, ratings[n])
        counters[LEARNED] += 1


