"""The line between the release and operator state, as functions the CLI and the server call.

The release (what a central-DP guarantee covers): the model's cells, biases and offset, the
answers of /predict and the scores of /recommend, and what /privacy shows. Everything else —
checkpoints, per-user cap counts, exact counters, the monitor's raw moments, Bloom filters,
popularity, the catalogue — is operator state (README "What the guarantee covers" has the full table).

- ``public_capacity``: in a DP mode the model's shape comes from public parameters only. The sketch
  width was the exact count of distinct users + items (defect D4: replacing the only rating of
  one of ML-100k's 141 single-rating items changed the released width 10500 -> 10496).
- ``public_stats``: /stats and /metrics in a DP mode keep only what no rating changes.
- ``access_control_default``: per-user answers need a credential in every privacy mode.
"""

from __future__ import annotations

DEFAULT_DP_CAPACITY = 4096  # public default of distinct users + items in the DP modes (a constant)
# /stats fields no rating changes (given the public parameters and the stream's length)
PUBLIC_STATS = ("model_bytes", "uptime_s", "paused", "read_only", "offsets", "broker", "ready",
                "checkpoint_age_s")


def public_capacity(private: bool, option: int | None, counted: int | None = None) -> int:
    """The capacity (distinct users + items) that sizes the sketch.

    Non-private: ``option`` if given, else ``counted`` (the data's exact count, as before). In a
    DP mode: ``option`` if given, else ``DEFAULT_DP_CAPACITY``; ``counted`` is never used there.

    >>> public_capacity(False, None, 2625), public_capacity(True, None, 2625), public_capacity(True, 9000)
    (2625, 4096, 9000)
    """
    if option is not None:
        if option < 1:
            raise ValueError("capacity must be >= 1")
        return int(option)
    if private:
        return DEFAULT_DP_CAPACITY
    if counted is None:
        raise ValueError("need a capacity or a count of distinct users + items")
    return int(counted)


def check_public_shape(private: bool, capacity: int, option: int | None) -> None:
    """Refuse a DP model sized by anything but the public option or default (a data-derived
    count would make the release's shape depend on single ratings)."""
    if private and capacity != public_capacity(True, option):
        raise ValueError(f"in a DP mode the capacity must come from --capacity (or the public "
                         f"default {DEFAULT_DP_CAPACITY}), not from the data (got {capacity})")


def public_stats(stats: dict, private: bool) -> dict:
    """What /stats shows: everything outside the DP modes; in them, only ``PUBLIC_STATS`` (the
    exact counts of ratings learned, skipped, seen items, throughput and prequential RMSE are
    operator state, served by the admin route)."""
    if not private:
        return stats
    return {**{k: stats[k] for k in PUBLIC_STATS if k in stats},
            "operator_state": "GET /admin/privacy (exact counters; not covered)"}


def access_control_default(model, ldp: bool = False) -> bool:
    """Whether per-user answers need a credential by default: in every privacy mode (DP-SGD,
    SGLD, loss clipping, local DP), and always for a joint-DP model (``joint_dp``: its answers
    about U may go only to U or the backend)."""
    return (getattr(model, "dp", None) is not None or getattr(model, "joint_dp", False) or bool(getattr(model, "sgld_temperature", None))
            or getattr(model, "clip_loss", None) is not None or ldp)
