"""The holdout protocol of the joint-DP modes: what `replay --holdout F --dp-unit user
--dp-epsilon E` calls, and the public item catalogue those modes need.

``train_user_private`` fits the private model (``models.private_als``) and the private baseline
under the same (epsilon, delta) and unit on the training part and scores both on the test part.
Every test answer for user U is computed from the release and U's own training ratings only.
The fitted model (not the baseline: it falls back by itself) is what `--serve` then serves.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from sketchrec.data import Ratings
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS, PrivateBaseline

CATALOGUES = (("u.item", "|", "latin-1"), ("movies.csv", ",", "utf-8"))


def public_catalogue(data_path: str | Path | None, ratings: Ratings) -> tuple[np.ndarray, str]:
    """The item ids the release is indexed by, and where they came from: the MovieLens catalogue
    file beside the ratings (u.item, movies.csv: public metadata), else the data's own items — then
    the release shows which items were rated at all, and the figures say so."""
    folder = Path(data_path).parent if data_path else None
    for name, sep, enc in CATALOGUES:
        path = folder / name if folder else None
        if path and path.exists():
            lines = path.read_text(encoding=enc, errors="replace").splitlines()
            ids = [line.split(sep, 1)[0] for line in lines if line and line[0].isdigit()]
            return np.array(sorted({int(x) for x in ids}), dtype=np.int64), f"public catalogue {path.name}"
    return np.unique(ratings.items), "items of the data (assumed public: not covered)"


def _rmse(model, test: Ratings) -> float:
    return float(np.sqrt(np.mean((model.predict_many(test.users, test.items) - test.ratings) ** 2)))


def train_user_private(train: Ratings, test: Ratings, epsilon: float, delta: float = 1e-5,
                       unit: str = "user", catalogue: np.ndarray | None = None,
                       rating_range: tuple[float, float] = (1.0, 5.0),
                       config: JointDPConfig | None = None, catalogue_source: str = "",
                       ledger=None) -> dict:
    """Fit the joint-DP model and the private baseline (same budget, unit and catalogue) on
    ``train``; their test RMSE and the /privacy figures. ``epsilon`` = inf: no noise (reference).

    >>> from sketchrec.data import SyntheticStream
    >>> data = SyntheticStream(3000, n_users=60, n_items=40, seed=0).all()
    >>> res = train_user_private(data.take(slice(0, 2400)), data.take(slice(2400, None)), 8.0)
    >>> res["privacy"]["proven_bound"], res["test_ratings"]   # the noise is fresh: RMSEs vary
    (True, 600)
    """
    cfg = replace(config or JointDPConfig(), epsilon=float(epsilon), delta=delta, unit=unit,
                  rating_range=tuple(rating_range))
    items = np.unique(np.concatenate([train.items, test.items])) if catalogue is None else catalogue
    t0 = time.perf_counter()
    model = PrivateALS(cfg, items)
    if ledger is not None and model.ledger is not None:  # a stored ledger: this fit is charged on top
        model.ledger = ledger
    model.fit(train.users, train.items, train.ratings)
    seconds = time.perf_counter() - t0
    baseline = PrivateBaseline(cfg, items).fit(train.users, train.items, train.ratings)
    figures = model.figures()
    if catalogue is None or catalogue_source:
        figures["catalogue"] = catalogue_source or "items of the data (assumed public: not covered)"
    base_rmse = _rmse(baseline, test)
    return {"rmse": _rmse(model, test), "baseline_rmse": base_rmse, "train_ratings": len(train),
            "test_ratings": len(test), "seconds": seconds, "fallback": figures["fallback"],
            "privacy": figures, "baseline_privacy": baseline.figures(),
            "non_private": not math.isfinite(epsilon), "model": model}


def joint_holdout_report(path: str | Path | None, data: Ratings, fraction: float, seed: int,
                         epsilon: float, delta: float, unit: str, rating_range: tuple[float, float],
                         cap: int | None = None, rank: int = 0, ledger=None) -> dict:
    """What `replay PATH --holdout F --seed S --dp-epsilon E --dp-unit U` reports in the joint-DP
    mode: the same split as ``replay.protocols.holdout`` (``split_holdout(data, F, S)``), the
    public catalogue beside PATH, ``JointDPConfig`` defaults unless ``cap`` / ``rank`` are given.
    Also the fitted model, its training part and the catalogue's source (to serve it; not JSON)."""
    from sketchrec.replay.protocols import split_holdout
    train, test = split_holdout(data, fraction, seed)
    catalogue, source = public_catalogue(path, data)
    cfg = replace(JointDPConfig(), rank=rank, **({"cap": int(cap)} if cap else {}))
    res = train_user_private(train, test, epsilon, delta, unit, catalogue, rating_range, cfg, source,
                             ledger)
    return {"protocol": "holdout", "fraction": fraction, "rmse": res["rmse"],
            "baseline_rmse": res["baseline_rmse"], "train_ratings": res["train_ratings"],
            "test_ratings": res["test_ratings"], "seconds": res["seconds"],
            "privacy": res["privacy"], "baseline_privacy": res["baseline_privacy"],
            "model": res["model"], "train": train, "catalogue_source": source}
