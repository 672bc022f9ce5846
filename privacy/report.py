"""What /privacy and `replay --json` report: the training mode's guarantee, the monitor's figures
(outside the DP modes) and the last canary audit.

In the central-DP modes the guarantee covers only what is released (docs/privacy/surfaces.md).
The monitor's moments are exact functions of the ratings (reading /privacy around each rating
gave back 300/300 ratings exactly, defect D3), so there they are operator state: ``operator_figures``
gives them to the admin route, labelled not covered, and /privacy names where they went.
"""

from __future__ import annotations

from sketchrec.privacy.accounting import describe
from sketchrec.privacy.entropy import DEBUG_NOTE
from sketchrec.privacy.mode import PrivacyMode, mode_of

NOT_COVERED = "not covered by any privacy guarantee: exact operator state (admin only)"


def privacy_figures(model, monitor=None, audit: dict | None = None, ledger=None,
                    ldp=None) -> dict:
    """The training mode's guarantee (and whether it is proven), the monitor's figures (not in
    the DP modes) and the last canary audit, as /privacy and `replay --json` report them.
    ``ldp``: a ``privacy.ldp.LDPSettings`` when the ratings were perturbed on the device."""
    mode = mode_of(model, ldp)
    figures = {"epsilon": None, "delta": None, "privacy_unit": None, "proven_bound": None,
               "mode": "non-private" if mode is PrivacyMode.NONE else mode.value}
    dp = model.dp if mode.dp_sgd else None
    debug = dp is not None and dp.debug_noise_seed is not None
    if dp is not None and dp.noise_multiplier > 0 and ledger is not None:
        figures.update(describe(ledger, dp.mode, DEBUG_NOTE if debug else None))
    elif dp is not None:
        figures.update(mode=dp.mode, epsilon=float("inf"), privacy_unit=dp.unit, proven_bound=False,
                       guarantee="none: clipped DP-SGD without noise (epsilon = infinity)")
    elif mode is PrivacyMode.LDP:
        figures.update(ldp.figures())
    elif mode is PrivacyMode.CLIP_LOSS:
        figures.update(epsilon=model.clip_loss, privacy_unit="rating", proven_bound=False,
                       guarantee="the thesis's claimed epsilon for loss clipping at epsilon (§4.2.2): "
                       "heuristic, not a proven bound")
    elif mode is PrivacyMode.SGLD:
        figures.update(guarantee="SGLD without gradient clipping has no privacy bound")
    else:
        figures.update(guarantee="none: the model is trained without privacy protection")
    if monitor is not None:
        if mode.central:
            figures["monitor"] = f"GET /admin/privacy ({NOT_COVERED})"
        else:
            figures.update(monitor.figures())
    if audit is not None:
        figures["audit"] = audit
        figures["audit_epsilon_lower_bound"] = audit["epsilon_lower_bound"]
    return figures


def operator_figures(monitor=None, stats: dict | None = None) -> dict:
    """What the admin route shows in a DP mode: the monitor's exact figures and the exact
    counters, labelled not covered."""
    return {"covered": False, "note": NOT_COVERED,
            "monitor": monitor.figures() if monitor is not None else None, "stats": stats}


def versus_private_mean(served_rmse: float, mean_rmse: float) -> dict:
    """Whether a private model served worse than its private global mean would have on the same
    ratings, with a line saying so (both RMSEs are exact: operator state in a DP mode, where
    only ``release`` decides what is public).

    >>> versus_private_mean(1.15, 1.13)["worse"], versus_private_mean(0.98, 1.13)["note"]
    (True, None)
    """
    worse = bool(served_rmse > mean_rmse)
    return {"served_rmse": served_rmse, "private_mean_rmse": mean_rmse, "worse": worse,
            "note": (f"served RMSE {served_rmse:.4f} is worse than the private global mean's "
                     f"{mean_rmse:.4f}: predicting that mean alone would have served better") if worse else None}
