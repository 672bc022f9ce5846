"""Evaluation protocols over a rating stream.

- prequential (thesis §4.1.5.4, the dynamic setting): each rating is predicted, then learned, in
  one pass; RMSE/MAE are over those predictions, the curve over windows of them, and top-N
  (``replay.topn``) ranks a sample of the ratings >= 4 before they are learned.
- holdout (thesis §4.1.5.1 style): a seeded random split, E epochs over the training part
  (shuffled each epoch, eta_t = eta / (1 + t / T)), RMSE/MAE on the held-out part.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from sketchrec.models.metrics import ErrorStats
from sketchrec.models.private.fallback import fallback_of
from sketchrec.privacy.budget import plan_private_epochs
from sketchrec.models.wrapped import Wrapped
from sketchrec.privacy.audit import real_rows
from sketchrec.privacy.entropy import sampling_generator
from sketchrec.privacy.mode import mode_of
from sketchrec.privacy.release import operator_part, release
from sketchrec.privacy.leakage import kld_from_errors
from sketchrec.data import Ratings
from sketchrec.replay.curve import WindowedErrors
from sketchrec.replay.interrupts import batch_whole

Progress = Callable[[int, float, float], None]  # (ratings so far, running RMSE, ratings/s)
OPERATOR_BLOCK = "the 'operator' block of this result (exact counts; not covered)"


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
                speed: float | None = None, window: int | None = None, topn=None) -> dict:
    """Predict-then-learn over the stream, one pass. With ``window`` the result's ``curve`` is
    the RMSE per window of that many ratings (``replay.curve``); with ``topn`` (a
    ``replay.topn.TopN``) its sampled events are ranked before they are learned, and ``seconds``
    leaves out the time that took (``topn.seconds``)."""
    errors = ErrorStats()
    windows = WindowedErrors(window) if window else None
    t0 = time.perf_counter()
    t0_stream = None
    interrupted = False
    try:
        for batch in batches:
            t0_stream = _pace(batch, t0_stream, t0, speed)
            with batch_whole():   # a Ctrl-C waits until the batch is learned and counted
                if topn is None:
                    predictions = model.learn_many(batch.users, batch.items, batch.ratings)
                else:
                    predictions = topn.learn(model, batch)
                real = real_rows(batch.users)  # audit canaries are not part of the reported accuracy
                errors.add(predictions[real], batch.ratings[real])
                if windows is not None:
                    windows.add(predictions[real], batch.ratings[real])
            if progress:
                progress(errors.n, errors.rmse, errors.n / max(time.perf_counter() - t0, 1e-9))
    except KeyboardInterrupt:  # Ctrl-C: the figures of what was learned so far
        interrupted = True
    seconds = time.perf_counter() - t0 - (topn.seconds if topn is not None else 0.0)
    return {"protocol": "prequential", "ratings": errors.n, "rmse": errors.rmse, "mae": errors.mae,
            "seconds": seconds, "throughput_per_s": errors.n / max(seconds, 1e-9),
            **({"curve": windows.curve()} if windows is not None else {}),
            **({"topn": topn.result()} if topn is not None else {}),
            **({"interrupted": True} if interrupted else {})}


def split_holdout(ratings: Ratings, fraction: float, seed: int) -> tuple[Ratings, Ratings]:
    if not 0 < fraction < 1:
        raise ValueError("holdout fraction must lie in (0, 1)")
    perm = np.random.default_rng(seed).permutation(len(ratings))
    n_test = int(round(fraction * len(ratings)))
    return ratings.take(np.sort(perm[n_test:])), ratings.take(np.sort(perm[:n_test]))


def train_epochs(model, train: Ratings, epochs: int, seed: int, batch_size: int = 10_000,
                 after_epoch: Callable[[int, int], None] | None = None) -> int:
    """`epochs` passes over `train`, shuffled each epoch (seeded), eta_t by epoch; ratings learned.
    A model with ``plan_epochs`` is told the number of passes first (e.g. the combination keeps a
    slice of the pairs unlearned until the last one, to weight its members on)."""
    rng = np.random.default_rng(seed)
    inner = model
    while inner is not None and not hasattr(inner, "plan_epochs"):
        inner = getattr(inner, "model", None)   # e.g. the serving recommender wraps the model
    if inner is not None:
        inner.plan_epochs(epochs)
    learned = 0
    try:
        for epoch in range(epochs):
            for batch in train.take(rng.permutation(len(train))).batches(batch_size):
                model.learn_many(batch.users, batch.items, batch.ratings, epoch=epoch)
                learned += len(batch)
            if after_epoch:
                after_epoch(epoch, learned)
    finally:
        if inner is not None:
            inner.plan_epochs(1)   # what it learns next is a stream (e.g. served, learning live)
    return learned


def cap_per_user(data: Ratings, cap: int) -> Ratings:
    """The first ``cap`` ratings of each user, in the data's order (exact counts: the user unit's
    sensitivity needs every user to hold at most ``cap`` ratings and nothing else to change)."""
    order = np.argsort(data.users, kind="stable")
    users = data.users[order]
    starts = np.r_[0, np.flatnonzero(users[1:] != users[:-1]) + 1]
    rank = np.arange(len(users)) - np.repeat(starts, np.diff(np.r_[starts, len(users)]))
    return data.take(np.sort(order[rank < cap]))


def train_private_epochs(model, train: Ratings, epochs: int, seed: int, ledger=None,
                         budget: float | None = None,
                         after_epoch: Callable[[int, int], None] | None = None,
                         target_epsilon: float | None = None) -> dict:
    """DP-SGD epochs with Poisson sampling: each noisy step takes every rating (rating unit) or
    every user with all of its capped ratings (user unit) independently with probability q,
    q = batch_size / N and round(1/q) steps per epoch, N the training size as released with
    noise by the planner (``privacy.budget``: the exact N would leak through q). Every release is
    recorded in ``ledger`` (a ``privacy.accounting.PrivacyLedger``) as it is made; with ``budget``
    the training stops before the step that would spend more than it. With ``target_epsilon``
    the noise is first calibrated (dp-accounting) so that the whole plan costs exactly that."""
    dp = model.dp
    if dp.unit == "user":
        train = cap_per_user(train, dp.user_cap)
        groups, inverse = np.unique(train.users, return_inverse=True)
        members = np.split(np.argsort(inverse, kind="stable"),
                           np.cumsum(np.bincount(inverse))[:-1])
        population = len(groups)
    else:
        population = len(train)
    fallback = fallback_of(model)   # the private baseline and the DP choice, same ledger
    plan = plan_private_epochs(fallback, dp, target_epsilon, ledger.delta if ledger else 1e-5,
                               len(train), epochs, budget)
    dp, q, per_epoch, planned = plan.dp, plan.sampling_rate, plan.per_epoch, plan.steps
    if target_epsilon is not None:
        model.dp = dp
    for entry in plan.fixed if ledger is not None else ():
        ledger.record(entry.noise_multiplier)
    z = dp.epoch_multiplier()
    allowed = planned
    if ledger is not None and budget is not None and z > 0:
        allowed = ledger.affordable(budget, z, q, limit=planned)
    rng = sampling_generator(dp.debug_noise_seed, seed)  # secret: the amplification needs it
    learned = 0
    for step in range(allowed):
        chosen = np.flatnonzero(rng.random(population) < q)
        if dp.unit == "user":
            chosen = np.concatenate([members[u] for u in chosen]) if len(chosen) else chosen
        batch = train.take(chosen)
        model.noisy_step(batch.users, batch.items, batch.ratings, epoch=step // per_epoch)
        learned += len(batch)
        if ledger is not None and z > 0:
            ledger.record(z, q)
        if after_epoch and (step + 1) % per_epoch == 0:
            after_epoch(step // per_epoch, learned)
    return {"ratings": learned, "steps": allowed, "planned_steps": planned, "sampling_rate": q,
            "train_kept": len(train), "released_train_size": plan.size, "stopped_by_budget": allowed < planned,
            **({"fallback": fallback.fit_fallback(train.users, train.items, train.ratings)}
               if fallback is not None else {})}


def rmse_on(model, data: Ratings) -> float:
    errors = ErrorStats()
    errors.add(model.predict_many(data.users, data.items), data.ratings)
    return errors.rmse


def _kld(train_err: np.ndarray, test_err: np.ndarray) -> float:
    """Thesis eq. 4.15 between training and test errors; NaN when errors too large for floats
    (a run with --rating-range none on absurd ratings) overflow it."""
    try:
        return kld_from_errors(train_err, test_err)
    except OverflowError:
        return float("nan")


def holdout(model, ratings: Ratings, fraction: float, epochs: int, seed: int,
            batch_size: int = 10_000, progress: Progress | None = None,
            extra_train: Ratings | None = None, ledger=None, budget: float | None = None,
            target_epsilon: float | None = None, perturb: Callable | None = None,
            predict_map: Callable | None = None) -> dict:
    """Train `epochs` passes on a random (1 - fraction) split, report errors on the rest.

    ``extra_train`` (e.g. audit canaries) joins the training part only. A DP-SGD model trains
    by ``train_private_epochs`` (``ledger`` and ``budget`` go there). ``perturb`` maps the training
    ratings as a device would before sending them (local DP); the test ratings stay raw, and
    ``predict_map`` (e.g. LDP debiasing) is applied to every prediction that is scored."""
    train, test = split_holdout(ratings, fraction, seed)
    if extra_train is not None and len(extra_train):
        train = Ratings.concat([train, extra_train])
    if perturb is not None:
        train = Ratings(train.users, train.items, perturb(train.ratings), train.timestamps)
    if predict_map is not None:
        model = Wrapped(model, predict_map=predict_map)
    t0 = time.perf_counter()
    done = [0]   # ratings learned by the last finished epoch (what Ctrl-C leaves counted)

    def each_epoch(epoch: int, learned: int) -> None:
        done[0] = learned
        if progress:
            fit = ErrorStats()
            fit.add(model.predict_many(test.users, test.items), test.ratings)
            progress(learned, fit.rmse, learned / max(time.perf_counter() - t0, 1e-9))

    dp_training, operator, interrupted = None, None, False
    mode = mode_of(model)
    try:
        if mode.dp_sgd:
            info = train_private_epochs(model, train, epochs, seed + 1, ledger, budget,
                                        each_epoch, target_epsilon)
            learned = info["ratings"]
            # the covered block keeps what the mode releases; the exact counts (ratings, steps,
            # the training part's size) go to an operator block beside it
            dp_training = {**release(mode, info), "operator_state": OPERATOR_BLOCK}
            operator = {"dp_training": operator_part(mode, info)}
        else:
            learned = train_epochs(model, train, epochs, seed + 1, batch_size, each_epoch)
    except KeyboardInterrupt:  # Ctrl-C: evaluate what the finished epochs learned
        learned, interrupted = done[0], True
    seconds = time.perf_counter() - t0
    test_pred = model.predict_many(test.users, test.items)
    train_err = model.predict_many(train.users, train.items) - train.ratings
    test_err = test_pred - test.ratings
    errors = ErrorStats()
    errors.add(test_pred, test.ratings)
    return {"protocol": "holdout", "ratings": learned, "train": len(train), "test": len(test),
            "epochs": epochs, "holdout": fraction, "rmse": errors.rmse, "mae": errors.mae,
            "train_rmse": float(np.sqrt(np.mean(train_err ** 2))),
            "kld": _kld(train_err, test_err),
            "seconds": seconds, "throughput_per_s": learned / max(seconds, 1e-9),
            **({"dp_training": dp_training, "operator": operator} if dp_training else {}),
            **(fallback_of(model).test_rmse(test.users, test.items, test.ratings)
               if fallback_of(model) is not None else {}),
            **({"interrupted": True} if interrupted else {})}
