"""The line between the release and operator state: ONE boundary every public surface passes.

The release (what a central-DP guarantee covers): the model's cells, biases and offset, the
answers of /predict and the scores of /recommend, and what /privacy shows. Everything else —
checkpoints, per-user cap counts, exact counters, the monitor's raw moments, Bloom filters,
popularity, the catalogue, a joint model's size — is operator state (docs/privacy/surfaces.md has the
full table).

- ``release(mode, values)``: the public view of a dict a route, ``--json`` or the dashboard is
  about to show. Each field belongs to a surface of the mode table (``FIELDS`` ->
  ``privacy.mode.SURFACES``); in a central-DP mode only fields whose surface is public or noised
  pass, the rest (and any field this table does not know) stay behind the admin token.
- ``public_capacity``: in a DP mode the model's shape comes from public parameters only. The sketch
  width was the exact count of distinct users + items (defect D4: replacing the only rating of
  one of ML-100k's 141 single-rating items changed the released width 10500 -> 10496).
- ``access_control_default``: per-user answers need a credential in every privacy mode.
"""

from __future__ import annotations

from sketchrec.privacy.mode import PrivacyMode, mode_of

DEFAULT_DP_CAPACITY = 4096  # public default of distinct users + items in the DP modes (a constant)
OPERATOR = "GET /admin/privacy (exact operator state; not covered)"

# Each field a public dict may carry -> the surface of ``privacy.mode.SURFACES`` it shows.
FIELDS: dict[str, str] = {
    # /stats, /metrics, the dashboard
    **dict.fromkeys(("ratings_learned", "skipped", "throughput_per_s", "mean_throughput_per_s",
                     "prequential_rmse", "catalogue_items", "checkpoint",
                     "local_dp", "ratings", "steps", "train_kept", "stopped_by_budget",
                     "train_ratings", "test_ratings"),
                    "ratings_learned"),
    # post-processing of the training size's noised release (``privacy.budget``)
    **dict.fromkeys(("released_train_size", "sampling_rate", "planned_steps"), "epoch_plan"),
    **dict.fromkeys(("model_bytes", "serving_bytes", "memory_bytes", "part_bytes"), "model_bytes"),
    # a checkpoint's or snapshot's header (``public_manifest``): its number and time, its class
    **dict.fromkeys(("seq", "written_at"), "health"),
    "model_class": "model_shape",
    **dict.fromkeys(("uptime_s", "paused", "read_only", "checkpoint_age_s", "checkpoint_error",
                     "broker", "ready", "state"), "health"),
    # exact errors of the served model and of the private mean: operator state in DP
    "versus_private_mean": "ratings_learned",
    "offsets": "offsets",
    # /privacy, the --json privacy block: the guarantee and how it was made
    **dict.fromkeys(("epsilon", "delta", "privacy_unit", "mode", "proven_bound", "guarantee",
                     "accountant", "unit", "neighbouring", "noisy_releases", "joint",
                     "budget_exhausted", "epsilon_budget", "audit", "audit_epsilon_lower_bound",
                     "monitor", "fallback_budget", "budget_shares", "hyper_parameters",
                     "access_control", "catalogue", "operator_state",
                     "noise_multiplier", "clip", "batch_size", "user_cap", "rating_range",
                     "debug_noise_seed", "fallback_share", "budget_epsilon",
                     "composition", "passes_by_partition"), "guarantee"),
    # which model answers and the noisy evidence for it (a DP release)
    **dict.fromkeys(("serving", "fallback", "choice", "chose_factors", "released"), "predictions"),
    # the monitor's exact moments (``privacy.monitor.figures``)
    **dict.fromkeys(("kld", "kld_cumulative", "seen_error_mean", "seen_error_var", "seen_sample",
                     "unseen_error_mean", "unseen_error_var", "unseen_window", "unseen_total",
                     "kld_alert_threshold", "kld_alert", "kld_note"), "monitor"),
}

def release(mode: PrivacyMode, values: dict) -> dict:
    """The public view of ``values`` in ``mode``: outside the central-DP modes everything (their
    surfaces are exact); in them only the fields whose surface the mode declares public or noised,
    plus ``operator_state`` naming where the rest went when anything was withheld. Nested dicts
    are released field by field (e.g. the ``dp`` block of ``--json``).

    >>> release(PrivacyMode.DP_SGD_USER, {"epsilon": 1.0, "ratings_learned": 7, "model_bytes": 8})
    {'epsilon': 1.0, 'operator_state': 'GET /admin/privacy (exact operator state; not covered)'}
    >>> release(PrivacyMode.NONE, {"ratings_learned": 7})
    {'ratings_learned': 7}
    """
    if not mode.central:
        return dict(values)
    out, withheld = {}, False
    for key, value in values.items():
        surface = FIELDS.get(key)
        if surface is None and isinstance(value, dict):   # a block: released field by field
            inner = release(mode, value)
            inner.pop("operator_state", None)
            withheld = withheld or len(inner) < len(value)
            out[key] = inner
        elif surface is not None and mode.surface(surface) in ("public", "noised"):
            out[key] = value
        else:
            withheld = True
    if withheld:
        out.setdefault("operator_state", OPERATOR)
    return out


def public_manifest(mode: PrivacyMode, meta: dict, part_bytes: dict[str, int]) -> dict:
    """The public part of a checkpoint or a fleet snapshot: its metadata (``meta``) and the sizes
    of its parts, released like any other surface, with the epsilon its privacy ledger has spent
    in place of the ledger (whose entries count a stream's chunks: its length). The file itself is
    operator state; this is what may be shown about it (a listing, a snapshot's announcement).

    >>> meta = {"seq": 3, "model_class": "SketchMF", "ratings_learned": 9, "offsets": {"0": 9}}
    >>> public_manifest(PrivacyMode.DP_SGD_RATING, meta, {"cells": 800})["model_class"]
    'SketchMF'
    >>> sorted(public_manifest(PrivacyMode.NONE, meta, {"cells": 800}))[:3]
    ['model_class', 'offsets', 'part_bytes']
    """
    values = {key: value for key, value in meta.items() if key != "privacy_ledger"}
    if meta.get("privacy_ledger"):
        from sketchrec.privacy.accounting import PrivacyLedger
        ledger = PrivacyLedger.from_dict(meta["privacy_ledger"])
        values.update(epsilon=ledger.epsilon(), delta=ledger.delta)
    return release(mode, {**values, "part_bytes": dict(part_bytes)})


def operator_part(mode: PrivacyMode, values: dict) -> dict:
    """What ``release`` leaves out of ``values`` (the operator block, outside every covered one)."""
    kept = release(mode, values)
    out = {}
    for key, value in values.items():
        if key not in kept:
            out[key] = value
        elif isinstance(value, dict) and isinstance(kept[key], dict) and kept[key] != value:
            out[key] = operator_part(mode, value)
    return out


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


def service_mode(service) -> PrivacyMode:
    """The privacy mode of a serving service (learning, joint or replica): its model's, LDP when
    the ratings it learned arrived perturbed on the device."""
    origin = getattr(service, "origin", None) or {}
    return mode_of(service.recommender.model, True if origin.get("perturbed_on_device") else None)


def access_control_default(model, ldp: bool = False) -> bool:
    """Whether per-user answers need a credential by default: in every privacy mode (DP-SGD,
    SGLD, loss clipping, local DP, joint DP: its answers about U may go only to U or the backend)."""
    return mode_of(model).private or ldp
