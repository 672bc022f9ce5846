"""Cosine sketches (LSH, tight frame, qoLSH), their estimators, and the retrieval index."""

import numpy as np
import pytest

from sketchrec.stream.retrieval import RetrievalIndex
from sketchrec.sketches.cosine import CosineSketch, hamming, hamming_cosine


def _unit(n, d=8, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _objective(sketch, X, b):
    recon = b @ sketch.W.T
    return np.einsum("nd,nd->n", X, recon) / np.linalg.norm(recon, axis=1)


def test_tight_frame_and_deterministic_codes():
    s = CosineSketch(8, 16, seed=3, method="frame")
    assert np.allclose(s.W @ s.W.T, np.eye(8), atol=1e-10)
    X = _unit(100)
    assert np.array_equal(s.encode(X), CosineSketch(8, 16, seed=3, method="frame").encode(X))
    assert np.array_equal(CosineSketch(8, 16, seed=3, method="qolsh").W, s.W)  # shared directions
    assert s.encode(X).shape == (100, 2) and s.reconstruct(s.encode(X)).shape == (100, 8)


def test_mse_ordering_and_qolsh_never_worse_than_its_start():
    X = _unit(20_000)
    mse = {}
    for method in ("lsh", "frame", "qolsh"):
        s = CosineSketch(8, 16, seed=1, method=method)
        mse[method] = np.mean(np.sum((X - s.reconstruct(s.encode(X))) ** 2, axis=1))
    assert mse["qolsh"] < mse["frame"] < mse["lsh"]
    frame, qo = CosineSketch(8, 16, seed=1, method="frame"), CosineSketch(8, 16, seed=1, method="qolsh")
    assert np.all(_objective(qo, X, qo.signs(X)) >= _objective(frame, X, frame.signs(X)) - 1e-12)


def test_optimal_code_bounds_qolsh():
    from sketchrec.experiments.qolsh import _all_codes, _optimal_codes
    X = _unit(300, seed=5)
    qo = CosineSketch(8, 16, seed=2, method="qolsh")
    best = _all_codes()[_optimal_codes(qo, X)].astype(np.float64)
    assert np.all(_objective(qo, X, best) >= _objective(qo, X, qo.signs(X)) - 1e-5)


def test_hamming_matches_naive_count_and_estimates_angles():
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 256, (50, 4), dtype=np.uint8)
    naive = [sum(bin(a ^ b).count("1") for a, b in zip(codes[0], row)) for row in codes]
    assert hamming(codes[0], codes).tolist() == naive
    s = CosineSketch(8, 256, seed=6, method="lsh")
    X = _unit(400, seed=7)
    true = X[1:] @ X[0]
    est_h = hamming_cosine(hamming(s.encode(X[:1])[0], s.encode(X[1:])), 256)
    assert np.mean(np.abs(est_h - true)) < 0.08


def test_asymmetric_estimator_beats_hamming_on_average():
    X, Y = _unit(2000, seed=8), _unit(20, seed=9)
    s = CosineSketch(8, 16, seed=10, method="qolsh")
    codes = s.encode(X)
    true = Y @ X.T
    asym = s.estimate_cosine(Y, codes)
    ham = np.stack([hamming_cosine(hamming(q, codes), 16) for q in s.encode(Y)])
    assert np.mean(np.abs(asym - true)) < np.mean(np.abs(ham - true))


def _catalogue(n, d=16, seed=11):
    rng = np.random.default_rng(seed)
    vectors = (rng.standard_normal((n, d)) * rng.uniform(0.2, 1.0, (n, 1))).astype(np.float32)
    return vectors, (0.3 * rng.standard_normal(n)).astype(np.float32)


def test_index_returns_exact_top_k_when_the_short_list_covers_the_catalogue():
    vectors, biases = _catalogue(300)
    index = RetrievalIndex(16, bits=64, seed=1, shortlist=1.0)
    index.update(vectors, biases)
    for u in np.random.default_rng(12).standard_normal((10, 16)).astype(np.float32):
        rows, scores = index.search(u, 10)
        exact = np.argsort(-(vectors @ u + biases), kind="stable")[:10]
        assert rows.tolist() == exact.tolist()


def test_index_recall_at_10_with_a_fifth_of_the_catalogue_scored():
    vectors, biases = _catalogue(20_000)
    index = RetrievalIndex(16, bits=128, seed=2, shortlist=0.2, min_shortlist=0)
    index.update(vectors, biases)
    recalls = []
    for u in np.random.default_rng(13).standard_normal((50, 16)).astype(np.float32):
        rows, _ = index.search(u, 10)
        exact = set(np.argpartition(-(vectors @ u + biases), 10)[:10].tolist())
        recalls.append(len(exact & set(rows.tolist())) / 10)
    assert index.shortlist_size() == 4000
    assert np.mean(recalls) >= 0.9


def test_index_refresh_is_incremental_and_exclusion_is_honoured():
    vectors, biases = _catalogue(1000)
    index = RetrievalIndex(16, bits=64, seed=3, shortlist=1.0)
    assert index.update(vectors, biases) == 1000
    assert index.update(vectors, biases) == 0  # nothing moved: nothing re-encoded
    moved = vectors.copy()
    moved[:5] = -moved[:5]
    grown = np.vstack([moved, vectors[:2] * 0.5])
    assert index.update(grown, np.r_[biases, biases[:2]]) == 7  # 5 moved + 2 new
    exclude = np.zeros(len(grown), dtype=bool)
    u = np.ones(16, dtype=np.float32)
    best = index.search(u, 3)[0]
    exclude[best] = True
    assert not set(index.search(u, 3, exclude)[0].tolist()) & set(best.tolist())
    with pytest.raises(ValueError):
        RetrievalIndex(16, bits=60)


def test_recommender_uses_the_index_on_large_catalogues_and_agrees_with_exact_scoring():
    from sketchrec.models import SketchMF
    from sketchrec.stream.recommender import Recommender
    from sketchrec.data import SyntheticStream
    data = SyntheticStream(20_000, 300, 400, seed=14).all()
    recs = {}
    for name, threshold in (("exact", 10**9), ("index", 0)):
        model = SketchMF(dim=16, width=4096, seed=15)
        rec = Recommender(model, pair_capacity=50_000, index_threshold=threshold, index_shortlist=1.0,
                          served_ranking=False)   # the index agrees with exact model scoring
        rec.learn_many(data.users, data.items, data.ratings)
        recs[name] = rec
    for user in data.users[:20].tolist():
        exact, src_exact = recs["exact"].recommend(user, 10)
        via_index, src_index = recs["index"].recommend(user, 10)
        assert src_exact == "model" and src_index == "model-index"
        assert [i for i, _ in via_index] == [i for i, _ in exact]
        assert np.allclose([s for _, s in via_index], [s for _, s in exact], atol=1e-4)
