"""The argparse groups the commands share (learner, DP-SGD, monitor, serving) and the parsers of
their small text formats ("L,U", "HOST:PORT")."""

from __future__ import annotations

import argparse
from pathlib import Path

from sketchrec.models.registry import DEFAULTS, DP_DEFAULTS
from sketchrec.models.sketch_mf import DEFAULT_HEAVY_FRACTION
from sketchrec.replay.cli.admin import add_admin_token_args


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The learner's options, shared by replay and consume (DP-SGD's among them)."""
    ap.add_argument("--dim", type=int, help=f"latent dimension d (default {DEFAULTS['dim']}; "
                    f"{DP_DEFAULTS['dim']} with DP-SGD)")
    ap.add_argument("--depth", type=int, default=DEFAULTS["depth"], help="sketch rows k (1 = feature hashing)")
    width = ap.add_mutually_exclusive_group()
    width.add_argument("--space-gain", type=float, default=DEFAULTS["space_gain"],
                       help="gamma: width = ceil((|U|+|I|) d / (gamma k)) (eq. 4.9)")
    width.add_argument("--width", type=int, help="sketch width w, given directly")
    ap.add_argument("--heavy-fraction", type=float, help="share of the sketch's memory given to "
                    f"exact slots of heavy users and items (default {DEFAULT_HEAVY_FRACTION}; "
                    "0 = the thesis's pure count sketch, and always 0 with DP-SGD)")
    ap.add_argument("--light-dim", type=int, help="components the other ids keep in the sketch "
                    "(default: as many as fill it about once, at most d)")
    ap.add_argument("--lr", type=float, help=f"learning rate eta (default {DEFAULTS['lr']}; "
                    f"{DP_DEFAULTS['lr']} with DP-SGD)")
    ap.add_argument("--reg", type=float, help=f"L2 regularisation lambda (default {DEFAULTS['reg']}; "
                    f"{DP_DEFAULTS['reg']} with DP-SGD)")
    ap.add_argument("--bias-reg", type=float, default=DEFAULTS["bias_reg"], help="L2 weight of the biases")
    ap.add_argument("--init-std", type=float, default=DEFAULTS["init_std"], help="std of start vectors")
    ap.add_argument("--sgld", type=float, metavar="TAU", help="SGLD with temperature TAU")
    ap.add_argument("--clip-loss", type=float, metavar="EPS",
                    help="thesis data clipping: skip a rating when (r - r^)^2 > EPS")
    add_dp_args(ap)


def add_dp_args(ap: argparse.ArgumentParser) -> None:
    dp = ap.add_argument_group("DP-SGD (a proven (epsilon, delta) bound; see README 'Privacy')")
    noise = dp.add_mutually_exclusive_group()
    noise.add_argument("--dp-epsilon", type=float, metavar="E",
                       help="train with DP-SGD, noise calibrated so the planned run costs E "
                       "('inf': clipping without noise)")
    noise.add_argument("--dp-noise", type=float, metavar="SIGMA",
                       help="train with DP-SGD at this noise multiplier; epsilon is accounted")
    noise.add_argument("--sgld-dp", type=float, metavar="TAU",
                       help="SGLD at temperature TAU with clipped gradients: the Langevin noise "
                       "(sqrt(k lr TAU) per cell per step) is a Gaussian mechanism, accounted "
                       "like DP-SGD's with sigma = sqrt(k TAU / lr) / C")
    dp.add_argument("--dp-delta", type=float, default=DP_DEFAULTS["delta"])
    dp.add_argument("--dp-clip", type=float, default=DP_DEFAULTS["clip"], metavar="C",
                    help="L2 bound of one rating's update in sketch-cell space")
    dp.add_argument("--dp-batch", type=int, default=DP_DEFAULTS["batch"], metavar="B",
                    help="ratings per noisy step (expected, with Poisson sampling in epochs)")
    dp.add_argument("--dp-unit", choices=("rating", "user"), default="rating",
                    help="what is protected: one rating, or one user's whole history")
    dp.add_argument("--dp-user-cap", type=int, metavar="M",
                    help="ratings kept per user (required with --dp-unit user)")
    dp.add_argument("--dp-range", default="0.5,5", metavar="L,U",
                    help="public rating range: predictions are clipped to it")
    dp.add_argument("--budget-epsilon", type=float, metavar="E",
                    help="stop learning (keep serving) before the spent epsilon would exceed E")


def add_monitor_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-monitor", action="store_true", help="turn the privacy monitor off")
    ap.add_argument("--kld-window", type=int, default=20_000, help="ratings in the monitor's KLD window")
    ap.add_argument("--kld-alert", type=float, help="log a warning when the windowed KLD exceeds this")


# --access-control's choices, as create_app's ``access`` argument
ACCESS = {"auto": "auto", "on": True, "off": False}


def add_serving_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--serve", metavar="HOST:PORT",
                    help="serve the live HTTP endpoint while learning (replay: and after it ends, "
                    "until interrupted)")
    add_admin_token_args(ap)
    ap.add_argument("--checkpoint", metavar="DIR", type=Path,
                    help="checkpoint directory (replay: written at the end and on POST /checkpoint)")
    add_access_args(ap)


def add_access_args(ap: argparse.ArgumentParser) -> None:
    """Who may read a user's answers (README "Threat model"); shared by every serving command."""
    ap.add_argument("--access-control", choices=ACCESS, default="auto",
                    help="per-user tokens for /predict and /recommend (HMAC under "
                    "$SKETCHREC_USER_TOKEN_KEY; the admin token acts as the backend): 'auto' turns "
                    "them on in every privacy mode")


def parse_range(text: str) -> tuple[float, float]:
    """ "L,U" as two floats; SystemExit with a one-line message otherwise.

    >>> parse_range("0.5,5")
    (0.5, 5.0)
    """
    try:
        lo, hi = (float(x) for x in text.split(",", 1))
    except ValueError:
        raise SystemExit(f"expected L,U, got {text!r}") from None
    return lo, hi


def parse_host_port(text: str) -> tuple[str, int]:
    """ "HOST:PORT" as (host, port); SystemExit with a one-line message otherwise.

    >>> parse_host_port("127.0.0.1:8000")
    ('127.0.0.1', 8000)
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SystemExit(f"expected HOST:PORT, got {text!r}")
    return host, int(port)
