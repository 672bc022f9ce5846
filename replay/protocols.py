"""Evaluation protocols over a rating stream.

- prequential (thesis §4.1.5.4, the dynamic setting): each rating is predicted, then learned, in
  one pass; RMSE/MAE are over those predictions.
- holdout (thesis §4.1.5.1 style): a seeded random split, E epochs over the training part
  (shuffled each epoch, eta_t = eta / (1 + t / T)), RMSE/MAE on the held-out part.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from models.metrics import ErrorStats
from privacy.audit import is_canary
from privacy.leakage import kld_from_errors
from stream.sources import Ratings

Progress = Callable[[int, float, float], None]  # (ratings so far, running RMSE, ratings/s)


def _pace(batch: Ratings, t0_stream: int | None, t0_wall: float, speed: float | None) -> int | None:
    """Sleep until the batch's first timestamp is due at `speed` times real time."""
    if speed is None or len(batch) == 0:
        return t0_stream
    if t0_stream is None:
        return int(batch.timestamps[0])
    due = t0_wall + (int(batch.timestamps[0]) - t0_stream) / speed
    delay = due - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    return t0_stream


def prequential(model, batches: Iterable[Ratings], progress: Progress | None = None,
                speed: float | None = None) -> dict:
    """Predict-then-learn over the stream, one pass."""
    errors = ErrorStats()
    t0 = time.perf_counter()
    t0_stream = None
    for batch in batches:
        t0_stream = _pace(batch, t0_stream, t0, speed)
        predictions = model.learn_many(batch.users, batch.items, batch.ratings)
        if batch.users.dtype == object:  # audit canaries are not part of the reported accuracy
            real = ~is_canary(batch.users)
            predictions, truth = predictions[real], batch.ratings[real]
        else:
            truth = batch.ratings
        errors.add(predictions, truth)
        if progress:
            progress(errors.n, errors.rmse, errors.n / max(time.perf_counter() - t0, 1e-9))
    seconds = time.perf_counter() - t0
    return {"protocol": "prequential", "ratings": errors.n, "rmse": errors.rmse, "mae": errors.mae,
            "seconds": seconds, "throughput_per_s": errors.n / max(seconds, 1e-9)}


def split_holdout(ratings: Ratings, fraction: float, seed: int) -> tuple[Ratings, Ratings]:
    if not 0 < fraction < 1:
        raise ValueError("holdout fraction must lie in (0, 1)")
    perm = np.random.default_rng(seed).permutation(len(ratings))
    n_test = int(round(fraction * len(ratings)))
    return ratings.take(np.sort(perm[n_test:])), ratings.take(np.sort(perm[:n_test]))


def train_epochs(model, train: Ratings, epochs: int, seed: int, batch_size: int = 10_000,
                 after_epoch: Callable[[int, int], None] | None = None) -> int:
    """`epochs` passes over `train`, shuffled each epoch (seeded), eta_t by epoch; ratings learned."""
    rng = np.random.default_rng(seed)
    learned = 0
    for epoch in range(epochs):
        for batch in train.take(rng.permutation(len(train))).batches(batch_size):
            model.learn_many(batch.users, batch.items, batch.ratings, epoch=epoch)
            learned += len(batch)
        if after_epoch:
            after_epoch(epoch, learned)
    return learned


def rmse_on(model, data: Ratings) -> float:
    errors = ErrorStats()
    errors.add(model.predict_many(data.users, data.items), data.ratings)
    return errors.rmse


def holdout(model, ratings: Ratings, fraction: float, epochs: int, seed: int,
            batch_size: int = 10_000, progress: Progress | None = None,
            extra_train: Ratings | None = None) -> dict:
    """Train `epochs` passes on a random (1 - fraction) split, report errors on the rest.

    ``extra_train`` (e.g. audit canaries) joins the training part only."""
    train, test = split_holdout(ratings, fraction, seed)
    if extra_train is not None and len(extra_train):
        train = Ratings.concat([train, extra_train])
    t0 = time.perf_counter()

    def each_epoch(epoch: int, learned: int) -> None:
        if progress:
            fit = ErrorStats()
            fit.add(model.predict_many(test.users, test.items), test.ratings)
            progress(learned, fit.rmse, learned / max(time.perf_counter() - t0, 1e-9))

    learned = train_epochs(model, train, epochs, seed + 1, batch_size, each_epoch)
    seconds = time.perf_counter() - t0
    test_pred = model.predict_many(test.users, test.items)
    train_err = model.predict_many(train.users, train.items) - train.ratings
    test_err = test_pred - test.ratings
    errors = ErrorStats()
    errors.add(test_pred, test.ratings)
    return {"protocol": "holdout", "ratings": learned, "train": len(train), "test": len(test),
            "epochs": epochs, "holdout": fraction, "rmse": errors.rmse, "mae": errors.mae,
            "train_rmse": float(np.sqrt(np.mean(train_err ** 2))),
            "kld": kld_from_errors(train_err, test_err),  # thesis eq. 4.15: training vs test errors
            "seconds": seconds, "throughput_per_s": learned / max(seconds, 1e-9)}
