"""`replay --holdout F --dp-epsilon E` in the joint-DP mode (`--dp-model joint`, the default for
`--dp-unit user`): the private bias/factor release plus each user's privately solved part
(``replay.private_holdout``), reported in the same result shape as the other protocols; with
`--serve` the fitted model is then served read-only (``stream.serving.joint``), per-user access
control always on; with `--checkpoint DIR` it is written there with its ledger (a ledger already
in DIR is extended, never reset)."""

from __future__ import annotations

import time

from typing import TYPE_CHECKING

from sketchrec.data import Ratings
from sketchrec.cli.config import ReplayConfig, refuse

if TYPE_CHECKING:
    from sketchrec.stream.serving.joint import JointService


def check_joint(config: ReplayConfig, prog: str = "replay") -> None:
    """What the capability table cannot see (the kind, canaries, serving and protocol it checks in
    ``ReplayConfig.from_args``): per-user access control, and LDP beside the joint mode."""
    lines = []
    if config.serving.listen and config.serving.access is False:
        lines.append("the joint-DP model is served with per-user access control only; leave "
                     "--access-control at auto or on")
    if config.ldp_epsilon is not None:
        lines.append("the joint-DP mode (--dp-model joint) does not take --ldp-epsilon (one privacy "
                     "mode per run); use --dp-model sgd")
    if lines:
        refuse(prog, lines)


def run_joint(config: ReplayConfig, data: Ratings, source_name: str, path,
              report) -> tuple[dict, "JointService | None"]:
    """Fit and score the joint-DP model and its private baseline on the holdout split (the options
    checked by ``check_joint`` first); and with `--serve` the read-only service over the fitted
    model (else None)."""
    from sketchrec.models.private.joint_als import JointDPConfig
    from sketchrec.replay.joint_holdout import joint_holdout_report
    dp, directory = config.dp, config.serving.checkpoint
    t0 = time.perf_counter()
    res = joint_holdout_report(path, data, config.holdout, config.seed, dp.epsilon, dp.delta, dp.unit,
                               dp.rating_range, cap=dp.user_cap, rank=dp.rank,
                               ledger=_stored_ledger(directory, dp.unit, dp.delta))
    seconds = time.perf_counter() - t0
    privacy, service, written = res["privacy"], None, None
    if config.serving.listen or directory:
        from sketchrec.stream.checkpoint import CheckpointStore
        from sketchrec.stream.serving.joint import JointRecommender, JointService
        service = JointService(JointRecommender(res["model"], res["train"], res["catalogue_source"]),
                               CheckpointStore(directory) if directory else None)
        written = service.checkpoint() if directory else None
    return {
        "protocol": "holdout", "model": "joint-dp", "source": source_name, "order": config.order,
        "ratings": res["train_ratings"], "learned": res["train_ratings"], "train": res["train_ratings"],
        "test": res["test_ratings"], "epochs": JointDPConfig().iterations if dp.rank else 1,
        "rmse": res["rmse"],
        "mae": None, "baseline_rmse": res["baseline_rmse"], "seconds": seconds,
        "throughput_per_s": res["train_ratings"] / max(seconds, 1e-9), "model_bytes": None,
        "params": {"seed": config.seed, "rank": dp.rank, "cap": dp.user_cap},
        "privacy": privacy, "baseline_privacy": res["baseline_privacy"], "kld": None,
        **({"checkpoint": written} if written else {}), **report.summary(),
    }, service if config.serving.listen else None


def _stored_ledger(directory, unit: str, delta: float):
    """The ledger a checkpoint directory already holds (the new fit is charged on top of it:
    a restart never resets the budget), or None."""
    if not directory:
        return None
    from sketchrec.stream.checkpoint import continue_ledger
    try:
        stored = continue_ledger(directory, unit, delta)
    except ValueError as exc:   # another unit or delta, or a tampered ledger
        raise SystemExit(f"replay: {exc}") from None
    if stored.relation not in (None, "add/remove"):
        raise SystemExit(f"replay: {directory} holds a {stored.relation} ledger (a stream's); the "
                         "joint mode accounts add/remove: use another directory")
    return stored if stored.steps else None
