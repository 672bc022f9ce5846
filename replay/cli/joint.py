"""`replay --holdout F --dp-epsilon E` in the joint-DP mode (`--dp-model joint`, the default for
`--dp-unit user`): the private bias/factor release plus each user's privately solved part
(``replay.private_holdout``), reported in the same result shape as the other protocols."""

from __future__ import annotations

import time

from sketchrec.data import Ratings
from sketchrec.replay.cli.config import ReplayConfig


def check_joint(config: ReplayConfig) -> None:
    """The joint mode trains in one batch and is not served: refuse what it cannot honour."""
    unsupported = {"--serve": config.serving.listen, "--checkpoint": config.serving.checkpoint,
                   "--audit-canaries": config.audit_canaries, "--ldp-epsilon": config.ldp_epsilon,
                   "--model dense/river": config.model.kind != "sketch"}
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise SystemExit(f"replay: the joint-DP mode (--dp-model joint) does not take {', '.join(given)}; "
                         "use --dp-model sgd")


def run_joint(config: ReplayConfig, data: Ratings, source_name: str, path, report) -> dict:
    """Fit and score the joint-DP model and its private baseline on the holdout split."""
    from sketchrec.models.private_als import JointDPConfig
    from sketchrec.replay.private_holdout import joint_holdout_report
    check_joint(config)
    dp = config.dp
    t0 = time.perf_counter()
    res = joint_holdout_report(path, data, config.holdout, config.seed, dp.epsilon, dp.delta, dp.unit,
                               dp.rating_range, cap=dp.user_cap, rank=dp.rank)
    seconds = time.perf_counter() - t0
    privacy = res["privacy"]
    return {
        "protocol": "holdout", "model": "joint-dp", "source": source_name, "order": config.order,
        "ratings": res["train_ratings"], "learned": res["train_ratings"], "train": res["train_ratings"],
        "test": res["test_ratings"], "epochs": JointDPConfig().iterations if dp.rank else 1,
        "rmse": res["rmse"],
        "mae": None, "baseline_rmse": res["baseline_rmse"], "seconds": seconds,
        "throughput_per_s": res["train_ratings"] / max(seconds, 1e-9), "model_bytes": None,
        "rss_mb": float("nan"), "params": {"seed": config.seed, "rank": dp.rank, "cap": dp.user_cap},
        "privacy": privacy, "baseline_privacy": res["baseline_privacy"], "kld": None,
        "skipped": dict(report.skipped), "skipped_total": report.n_skipped,
        "skipped_examples": [{"line": n, "reason": r, "text": t} for n, r, t in report.examples],
    }
