"""Cosine sketches: binary codes whose Hamming distances estimate angles (thesis ch. 5).

A code of L bits for x in R^d is b = sign(W^T x), W = [w_1 ... w_L] (d x L):
- ``lsh``: the w_j are independent Gaussian directions (eq. 5.1; Charikar's sim-hash);
- ``frame``: W is a tight frame, W W^T = I_d — the first d columns of Q from the QR
  decomposition of an L x d Gaussian matrix, transposed (eq. 5.9) — so the reconstruction
  x^ = W b is a better estimate of the direction of x;
- ``qolsh``: start from the frame's signs and greedily flip the one bit that most increases
  L(b) = x . W b / ||W b|| (the cosine between x and its reconstruction), at most M flips
  (eq. 5.10-5.12): a better quantizer for the same code length.
The asymmetric estimator (5.14) compares an uncoded query y with a code: cos(y, x^) =
sum_j (y . w_j) b_j / ||W b||. Hamming distances run on packed bits with numpy's popcount.
"""

from __future__ import annotations

import numpy as np

METHODS = ("lsh", "frame", "qolsh")


class CosineSketch:
    """Encoder of d-dimensional vectors into L-bit codes by ``method`` (see module docstring);
    the directions depend only on (dim, bits, seed), and ``frame`` and ``qolsh`` share them.

    >>> sketch = CosineSketch(dim=4, bits=16, seed=0)
    >>> x = np.array([[1.0, 2.0, 0.0, -1.0]])
    >>> code = sketch.encode(x)
    >>> code.shape, code.dtype.name  # 16 bits in 2 bytes
    ((1, 2), 'uint8')
    >>> bool(sketch.estimate_cosine(x, code)[0, 0] > 0.9)  # the code points close to x
    True
    """

    def __init__(self, dim: int, bits: int, seed: int = 0, method: str = "qolsh", max_flips: int = 5):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}")
        if dim < 1 or bits < 1 or max_flips < 0:
            raise ValueError("dim and bits must be positive, max_flips non-negative")
        self.dim, self.bits, self.method, self.max_flips = int(dim), int(bits), method, int(max_flips)
        rng = np.random.default_rng(seed)
        gauss = rng.standard_normal((max(bits, dim), dim))
        if method == "lsh":
            self.W = gauss[:bits].T.copy()
        else:
            if bits < dim:
                raise ValueError("a tight frame needs bits >= dim")
            q, _ = np.linalg.qr(gauss[:bits])  # (L, d), orthonormal columns
            self.W = q.T.copy()                 # (d, L): W W^T = I_d

    def signs(self, X) -> np.ndarray:
        """+-1 codes (n, L) of the rows of X."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        proj = X @ self.W
        b = np.where(proj >= 0, 1.0, -1.0)
        if self.method == "qolsh" and self.max_flips:
            b = self._improve(X, b, proj)
        return b.astype(np.int8)

    def _improve(self, X, b, proj) -> np.ndarray:
        """Greedy bit flips (eq. 5.10-5.12), vectorised over rows: flipping bit j changes
        x.Wb by -2 b_j (x.w_j) and ||Wb||^2 by -4 b_j (w_j.Wb) + 4 ||w_j||^2."""
        gram = self.W.T @ self.W                    # (L, L): w_j . w_l
        wn2 = np.diag(gram)
        dot = np.einsum("nl,nl->n", proj, b)        # x . W b
        back = b @ gram                             # (n, L): w_j . W b
        norm2 = np.einsum("nl,nl->n", back, b)      # ||W b||^2
        active = np.ones(len(b), dtype=bool)
        rows = np.arange(len(b))
        for _ in range(self.max_flips):
            new_dot = dot[:, None] - 2 * b * proj
            new_norm2 = norm2[:, None] - 4 * b * back + 4 * wn2
            gain = new_dot / np.sqrt(np.maximum(new_norm2, 1e-300)) - (dot / np.sqrt(norm2))[:, None]
            j = np.argmax(gain, axis=1)
            better = active & (gain[rows, j] > 1e-12)
            if not better.any():
                break
            r, jj = rows[better], j[better]
            sj = b[r, jj].copy()
            dot[r] = new_dot[r, jj]
            norm2[r] = new_norm2[r, jj]
            back[r] -= 2 * sj[:, None] * gram[jj]
            b[r, jj] = -sj
            active = better
        return b

    def encode(self, X) -> np.ndarray:
        """Packed codes (n, ceil(L / 8)) uint8, bit 1 for +1."""
        return np.packbits(self.signs(X) > 0, axis=1)

    def unpack(self, codes) -> np.ndarray:
        bits = np.unpackbits(np.asarray(codes, dtype=np.uint8), axis=1)[:, :self.bits]
        return bits.astype(np.float64) * 2 - 1

    def reconstruct(self, codes) -> np.ndarray:
        """Unit-norm reconstructions W b / ||W b|| of packed codes."""
        x = self.unpack(codes) @ self.W.T
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)

    def estimate_cosine(self, queries, codes) -> np.ndarray:
        """Asymmetric estimator (5.14): cosines (n_queries, n_codes) between the (uncoded, any
        norm) queries and the reconstructions of the codes."""
        Y = np.atleast_2d(np.asarray(queries, dtype=np.float64))
        Y = Y / np.maximum(np.linalg.norm(Y, axis=1, keepdims=True), 1e-300)
        B = self.unpack(codes)
        norms = np.linalg.norm(B @ self.W.T, axis=1)
        return (Y @ self.W) @ B.T / np.maximum(norms, 1e-300)


def hamming(query_code, codes) -> np.ndarray:
    """Hamming distances between one packed code and many (popcount of the XOR)."""
    codes = np.asarray(codes, dtype=np.uint8)
    return np.bitwise_count(codes ^ np.asarray(query_code, dtype=np.uint8)).sum(axis=-1, dtype=np.int64)


def hamming_cosine(distance, bits: int) -> np.ndarray:
    """The angle estimate of sign-random-projection codes: cos(pi h / L)."""
    return np.cos(np.pi * np.asarray(distance, dtype=np.float64) / bits)
