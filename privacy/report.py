"""What /privacy and `replay --json` report: the training mode's guarantee, the monitor's figures
and the last canary audit."""

from __future__ import annotations

from sketchrec.privacy.accounting import describe


def privacy_figures(model, monitor=None, audit: dict | None = None, ledger=None) -> dict:
    """The training mode's guarantee (and whether it is proven), the monitor's figures and the
    last canary audit, as /privacy and `replay --json` report them."""
    clip = getattr(model, "clip_loss", None)
    sgld = getattr(model, "sgld_temperature", None)
    dp = getattr(model, "dp", None)
    figures = {"epsilon": None, "delta": None, "privacy_unit": None, "proven_bound": None,
               "mode": "clip-loss" if clip else "sgld" if sgld else "non-private"}
    if dp is not None and dp.noise_multiplier > 0 and ledger is not None:
        figures.update(describe(ledger, dp.mode))
    elif dp is not None:
        figures.update(mode=dp.mode, epsilon=float("inf"), privacy_unit=dp.unit, proven_bound=False,
                       guarantee="none: clipped DP-SGD without noise (epsilon = infinity)")
    elif clip:
        figures.update(epsilon=clip, privacy_unit="rating", proven_bound=False,
                       guarantee="the thesis's claimed epsilon for loss clipping at epsilon (§4.2.2): "
                       "heuristic, not a proven bound")
    elif sgld:
        figures.update(guarantee="SGLD without gradient clipping has no privacy bound")
    else:
        figures.update(guarantee="none: the model is trained without privacy protection")
    if monitor is not None:
        figures.update(monitor.figures())
    if audit is not None:
        figures["audit"] = audit
        figures["audit_epsilon_lower_bound"] = audit["epsilon_lower_bound"]
    return figures
