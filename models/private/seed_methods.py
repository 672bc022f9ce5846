"""Batch private factorization from the other seeds, next to the streaming sketch learner.

- ``NoisyALS`` (seed 001 Alg. 1): alternating least squares; users are solved exactly, every item's
  normal equations get additive noise on their right-hand side, v_j = (U_j^T U_j + lam I)^{-1}
  (U_j^T x_j + t), t drawn from a pluggable mechanism (None, Laplace, Gaussian, Huber: anything
  with ``sample(size, rng)``, see ``privacy.mechanisms``).
- ``HuberIRLS`` (seed 001 Alg. 2/3, R-IRLS): the same alternation under the Huber loss; each item
  is solved by K reweighted steps, each with fresh noise. Fixed here, as the digest flags: a zero
  residual gets weight 1 (w = min(1, alpha_w / |r|)), and the weights' alpha (``weight_alpha``) is
  a parameter of its own, separate from the noise mechanism's.
- ``BlpMogMF`` (seed 002): MF on Bounded-Laplace-perturbed ratings whose perturbation noise is
  modelled as a K-component zero-mean Gaussian mixture fitted by EM; the low-rank fit is weighted
  by each rating's expected precision sum_k gamma_ijk / sigma_k^2 (weighted ALS stands in for the
  paper's unspecified "Weighted PCA").

Privacy: these follow the seeds as published. The seeds derive no sensitivity for the ALS / IRLS
updates (the right-hand side U_j^T x_j scales with ||u_i||, which nothing bounds) and assume
Delta = 5: the epsilon those mechanisms are calibrated to is the seeds' nominal figure, not a
proven bound for the released factors (docs/privacy/). BLP-MoG's guarantee is the local one of its
input perturbation (``privacy.ldp``).
All learners share ``fit(users, items, ratings)`` and ``predict(users, items)`` on id arrays.
"""

from __future__ import annotations

import numpy as np


class _Indexed:
    """Ids -> dense row / column indices, and the ratings sorted by each side once."""

    def __init__(self, users, items, ratings):
        self.user_ids, self.u = np.unique(np.asarray(users), return_inverse=True)
        self.item_ids, self.i = np.unique(np.asarray(items), return_inverse=True)
        self.x = np.asarray(ratings, dtype=np.float64)
        self.by_user = np.argsort(self.u, kind="stable")
        self.by_item = np.argsort(self.i, kind="stable")

    def lookup(self, ids, known) -> np.ndarray:
        pos = np.searchsorted(known, ids)
        pos = np.clip(pos, 0, len(known) - 1)
        return np.where(known[pos] == ids, pos, -1)


def _normal_equations(order, rows, other, x, w, n_rows, lam):
    """Per row a: G_a = sum_b w_ab f_b f_b^T + lam I and h_a = sum_b w_ab x_ab f_b over its ratings
    (``order`` sorts the ratings by row; rows without ratings keep G = lam I, h = 0)."""
    r = other.shape[1]
    rows_sorted = rows[order]
    f = other[order] * np.sqrt(w[order])[:, None]
    starts = np.r_[0, np.flatnonzero(np.diff(rows_sorted)) + 1]
    present = rows_sorted[starts]
    G = np.tile(lam * np.eye(r), (n_rows, 1, 1))
    h = np.zeros((n_rows, r))
    if len(order):
        G[present] += np.add.reduceat(f[:, :, None] * f[:, None, :], starts, axis=0)
        h[present] = np.add.reduceat((w[order] * x[order])[:, None] * other[order], starts, axis=0)
    return G, h


class _Alternating:
    """Shared alternation: users solved exactly, items by ``_item_step`` (noisy)."""

    def __init__(self, rank: int = 10, lam: float = 0.5, iters: int = 50, noise=None,
                 center: bool = False, seed: int = 0):
        if rank < 1 or lam < 0 or iters < 1:
            raise ValueError("need rank >= 1, lam >= 0, iters >= 1")
        self.rank, self.lam, self.iters, self.noise = rank, lam, iters, noise
        self.center, self.seed = center, seed

    def fit(self, users, items, ratings):
        d = self.data = _Indexed(users, items, ratings)
        self.rng = np.random.default_rng(self.seed)
        self.mean = float(d.x.mean()) if self.center else 0.0
        x = d.x - self.mean
        n_u, n_i = len(d.user_ids), len(d.item_ids)
        self.U = self.rng.uniform(0, 1, (n_u, self.rank)) / np.sqrt(self.rank)
        self.V = self.rng.uniform(0, 1, (n_i, self.rank)) / np.sqrt(self.rank)
        ones = np.ones_like(x)
        for _ in range(self.iters):
            G, h = _normal_equations(d.by_user, d.u, self.V[d.i], x, ones, n_u, self.lam)
            self.U = np.linalg.solve(G, h[:, :, None])[:, :, 0]
            self.V = self._item_step(x)
        return self

    def _noise(self, shape) -> np.ndarray:
        return np.zeros(shape) if self.noise is None else np.asarray(self.noise.sample(shape, self.rng))

    def _solve_items(self, x, w) -> np.ndarray:
        d = self.data
        G, h = _normal_equations(d.by_item, d.i, self.U[d.u], x, w, len(d.item_ids), self.lam)
        return np.linalg.solve(G, (h + self._noise(h.shape))[:, :, None])[:, :, 0]

    def predict(self, users, items) -> np.ndarray:
        d = self.data
        u = d.lookup(np.asarray(users), d.user_ids)
        i = d.lookup(np.asarray(items), d.item_ids)
        pred = np.einsum("nr,nr->n", self.U[np.maximum(u, 0)], self.V[np.maximum(i, 0)])
        return np.where((u >= 0) & (i >= 0), pred, 0.0) + self.mean

    def full_matrix(self) -> np.ndarray:
        return self.U @ self.V.T + self.mean


class NoisyALS(_Alternating):
    """ALS with noise on every item's normal equations (seed 001 Alg. 1); see module docstring."""

    def _item_step(self, x) -> np.ndarray:
        return self._solve_items(x, np.ones_like(x))


class HuberIRLS(_Alternating):
    """Huber-loss factorization by R-IRLS on the item side, ``irls_iters`` reweighted solves per
    item update, each with fresh noise (seed 001 Alg. 2/3, thesis Alg. 1)."""

    def __init__(self, rank: int = 10, lam: float = 0.5, iters: int = 50, noise=None,
                 irls_iters: int = 20, weight_alpha: float = 1.0, center: bool = False, seed: int = 0):
        super().__init__(rank, lam, iters, noise, center, seed)
        if irls_iters < 1 or weight_alpha <= 0:
            raise ValueError("need irls_iters >= 1 and weight_alpha > 0")
        self.irls_iters, self.weight_alpha = irls_iters, weight_alpha

    def _item_step(self, x) -> np.ndarray:
        d = self.data
        V = self.V
        for _ in range(self.irls_iters):
            residual = x - np.einsum("nr,nr->n", self.U[d.u], V[d.i])
            # psi(r)/r = min(1, alpha/|r|), and 1 at r = 0 (the seeds leave 0/0 undefined)
            w = np.minimum(1.0, self.weight_alpha / np.maximum(np.abs(residual), 1e-300))
            V = self._solve_items(x, w)
        return V


class BlpMogMF:
    """MF of Bounded-Laplace-perturbed ratings with a zero-mean Gaussian-mixture noise model
    (seed 002 Alg. 2): EM alternates responsibilities gamma_ijk, mixture weights and variances,
    and a precision-weighted ALS sweep of U and V."""

    def __init__(self, rank: int = 10, components: int = 3, lam: float = 0.5, iters: int = 30,
                 center: bool = True, seed: int = 0):
        if rank < 1 or components < 1 or iters < 1:
            raise ValueError("need rank, components and iters >= 1")
        self.rank, self.components, self.lam, self.iters = rank, components, lam, iters
        self.center, self.seed = center, seed

    def fit(self, users, items, ratings):
        d = self.data = _Indexed(users, items, ratings)
        rng = np.random.default_rng(self.seed)
        self.mean = float(d.x.mean()) if self.center else 0.0
        x = d.x - self.mean
        n_u, n_i = len(d.user_ids), len(d.item_ids)
        self.U = rng.normal(0, 0.1, (n_u, self.rank))
        self.V = rng.normal(0, 0.1, (n_i, self.rank))
        spread = max(float(x.var()), 1e-6)
        self.sigma2 = spread * np.geomspace(0.25, 4.0, self.components)
        self.pi = np.full(self.components, 1.0 / self.components)
        for _ in range(self.iters):
            e = x - np.einsum("nr,nr->n", self.U[d.u], self.V[d.i])
            # E-step (eq. 8), in logs for stability
            logp = (np.log(self.pi) - 0.5 * np.log(2 * np.pi * self.sigma2))[None, :] \
                - 0.5 * e[:, None] ** 2 / self.sigma2[None, :]
            logp -= logp.max(axis=1, keepdims=True)
            gamma = np.exp(logp)
            gamma /= gamma.sum(axis=1, keepdims=True)
            # M-step for the mixture (eq. 9)
            mass = gamma.sum(axis=0) + 1e-12
            self.pi = mass / mass.sum()
            self.sigma2 = np.maximum((gamma * e[:, None] ** 2).sum(axis=0) / mass, 1e-6)
            # M-step for U, V: weights = expected precision of each rating's noise (eq. 10)
            w = (gamma / self.sigma2[None, :]).sum(axis=1)
            w /= w.mean()
            G, h = _normal_equations(d.by_user, d.u, self.V[d.i], x, w, n_u, self.lam)
            self.U = np.linalg.solve(G, h[:, :, None])[:, :, 0]
            G, h = _normal_equations(d.by_item, d.i, self.U[d.u], x, w, n_i, self.lam)
            self.V = np.linalg.solve(G, h[:, :, None])[:, :, 0]
        return self

    predict = _Alternating.predict


def _unit_columns(X: np.ndarray) -> np.ndarray:
    """Scale every column to L2 norm at most 1 (what the sensitivity analysis needs, enforced)."""
    return X / np.maximum(1.0, np.linalg.norm(X, axis=0, keepdims=True))


class PrivateNMF:
    """Robust NMF with outliers and Gaussian noise on the W step's sufficient statistics (seed 004
    Alg. 2): a trusted curator holds V (D x N, one column per user) and computes H, R; each outer
    iteration releases A = H H^T / N + N(0, tau_A^2) and B = (V - R) H^T / N + N(0, tau_B^2),
    tau = (Delta / eps_t) sqrt(2 log(1.25 / delta)), from which the analyst updates W.

    Enforced here, unlike the paper's Algorithm 2: every column of V is scaled to unit L2 norm at
    ``fit``, every column of H and R is projected to the unit ball after each of its updates, so
    Delta_A = 2/N and Delta_B = 4/N hold (replace-one neighbours, N public). The seed's random-free
    NNDSVD start is replaced by a seeded uniform start. ``epsilon_t=None`` is the non-private run.
    ``steps()`` lists the releases for the accountant: 2T Gaussian mechanisms with noise
    multipliers tau_A / Delta_A and tau_B / Delta_B."""

    def __init__(self, rank: int = 10, iters: int = 50, epsilon_t: float | None = 0.5,
                 delta: float = 1e-5, lam: float = 0.1, outlier_bound: float = 1.0,
                 inner: int = 5, analyst_steps: int = 5, seed: int = 0):
        if rank < 1 or iters < 1 or (epsilon_t is not None and not 0 < epsilon_t < 1):
            raise ValueError("need rank, iters >= 1 and 0 < epsilon_t < 1 (Gaussian mechanism)")
        self.rank, self.iters, self.epsilon_t, self.delta = rank, iters, epsilon_t, delta
        self.lam, self.M, self.inner, self.analyst_steps, self.seed = lam, outlier_bound, inner, analyst_steps, seed

    def noise_multiplier(self) -> float:
        """tau / Delta, the same for A and B under the seed's calibration."""
        return float(np.sqrt(2 * np.log(1.25 / self.delta)) / self.epsilon_t)

    def steps(self) -> list[tuple[float, int]]:
        """(noise multiplier, count) of every Gaussian release, for ``privacy.accounting``."""
        return [] if self.epsilon_t is None else [(self.noise_multiplier(), 2 * self.iters)]

    def closed_form_epsilon(self) -> float:
        """Theorem 3.1 with the optimal order: eps = T s / 2 + sqrt(2 T s log(1/delta)),
        s = (Delta_A/tau_A)^2 + (Delta_B/tau_B)^2 over two, i.e. eps_t^2 / log(1.25/delta)."""
        s = self.epsilon_t ** 2 / np.log(1.25 / self.delta)
        return float(self.iters * s / 2 + np.sqrt(2 * self.iters * s * np.log(1 / self.delta)))

    def _shrink(self, X: np.ndarray) -> np.ndarray:
        """S_{lam, M} (eq. 13-14): soft threshold at lam, magnitude capped at M."""
        return np.sign(X) * np.clip(np.abs(X) - self.lam, 0.0, self.M)

    def fit(self, V: np.ndarray):
        rng = np.random.default_rng(self.seed)
        self.scale = np.maximum(1.0, np.linalg.norm(V, axis=0))
        V = _unit_columns(np.asarray(V, dtype=np.float64))
        D, N = V.shape
        W = _unit_columns(rng.uniform(0, 1, (D, self.rank)))
        H = _unit_columns(rng.uniform(0, 1, (self.rank, N)))
        R = np.zeros_like(V)
        tau = None if self.epsilon_t is None else self.noise_multiplier()
        for _ in range(self.iters):
            # curator: H and R on the exact data, never released
            step_h = 1.0 / max(np.linalg.norm(W.T @ W, 2), 1e-9)
            for _ in range(self.inner):
                H = _unit_columns(np.maximum(H - step_h * (W.T @ (W @ H) - W.T @ (V - R)), 0.0))
                R = _unit_columns(self._shrink(V - W @ H))
            A, B = H @ H.T / N, (V - R) @ H.T / N
            if tau is not None:
                A = A + tau * (2.0 / N) * rng.standard_normal(A.shape)
                B = B + tau * (4.0 / N) * rng.standard_normal(B.shape)
            # analyst: projected gradient steps on the released statistics (post-processing)
            step_w = 1.0 / max(np.linalg.norm((A + A.T) / 2, 2), 1e-9)
            for _ in range(self.analyst_steps):
                W = _unit_columns(np.maximum(W - step_w * (W @ A - B), 0.0))
        self.W, self.H, self.R = W, H, R
        return self

    def reconstruction(self) -> np.ndarray:
        """W H on the original scale of V's columns."""
        return (self.W @ self.H) * self.scale[None, :]
