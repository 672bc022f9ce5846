"""The SGD / SGLD loops of ``models._sgd`` on ordinary per-id arrays (``DenseMF``, the regular
factorization the sketch is measured against)."""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models._sgd import LR, SGLD_TAU, clip_to_range, mean_of, record_rating, step_or_skip
from sketchrec.models._sgd import LEARNED


@njit(nogil=True, cache=True)
def dense_learn(P, Q, bu_arr, bi_arr, uidx, iidx, ratings, hp, stats, counters, out_pred):
    """The same SGD on ordinary per-id arrays (the regular-factorization baseline)."""
    d = P.shape[1]
    dp = np.empty(d)
    dq = np.empty(d)
    p = np.empty(d)
    q = np.empty(d)
    noise_std = np.sqrt(hp[LR] * hp[SGLD_TAU]) if hp[SGLD_TAU] > 0.0 else 0.0
    for n in range(uidx.shape[0]):
        u, i = uidx[n], iidx[n]
        dot = 0.0
        for l in range(d):
            p[l] = P[u, l]
            q[l] = Q[i, l]
            dot += p[l] * q[l]
        bu, bi = bu_arr[u], bi_arr[i]
        pred = mean_of(stats) + bu + bi + dot
        out_pred[n] = clip_to_range(pred, stats)
        take, dbu, dbi = step_or_skip(pred - ratings[n], p, q, bu, bi, hp, counters, dp, dq)
        if not take:
            continue
        for l in range(d):
            P[u, l] += dp[l] + (noise_std * np.random.standard_normal() if noise_std > 0.0 else 0.0)
            Q[i, l] += dq[l] + (noise_std * np.random.standard_normal() if noise_std > 0.0 else 0.0)
        bu_arr[u] += dbu + (noise_std * np.random.standard_normal() if noise_std > 0.0 else 0.0)
        bi_arr[i] += dbi + (noise_std * np.random.standard_normal() if noise_std > 0.0 else 0.0)
        record_rating(stats, ratings[n])
        counters[LEARNED] += 1


@njit(nogil=True, cache=True)
def dense_predict(P, Q, bu_arr, bi_arr, uidx, iidx, u_start, i_start, stats, clip, out):
    """Predictions; index -1 means an unknown id, which uses its start vector and zero bias."""
    mu = mean_of(stats)
    for n in range(uidx.shape[0]):
        u, i = uidx[n], iidx[n]
        pred = mu + (bu_arr[u] if u >= 0 else 0.0) + (bi_arr[i] if i >= 0 else 0.0)
        for l in range(P.shape[1]):
            pu = P[u, l] if u >= 0 else u_start[n, l]
            qi = Q[i, l] if i >= 0 else i_start[n, l]
            pred += pu * qi
        out[n] = clip_to_range(pred, stats) if clip else pred
