"""The argparse groups the commands share (learner, DP-SGD, monitor, serving), the typed
converters that check every option's domain where it is parsed (a value outside it ends the
command with one line, ``PROG: argument --X: ...``), and the parsers of the small text
formats ("L,U", "HOST:PORT")."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Callable, NoReturn

from sketchrec.models.capabilities import DEFAULT_KIND, KINDS, PRIVATE_KIND
from sketchrec.models.registry import ADAGRAD_DEFAULTS, DEFAULTS, DP_DEFAULTS, MIX_FACTOR_MEMBER
from sketchrec.models.sketch_mf import DEFAULT_HEAVY_FRACTION
from sketchrec.models.steps import OPTIMIZERS
from sketchrec.privacy.admin_token import add_admin_token_args
from sketchrec.cli.feedback import add_items_arg


class Refused(SystemExit):
    """A refused command: exit status 2, its one line (``PROG: why; what works instead``) already
    printed to stderr; ``str()`` is that line."""

    def __init__(self, line: str):
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def refuse(prog: str, lines: list[str]) -> NoReturn:
    """End the command with the first of ``lines``: one line on stderr, exit status 2. Every
    refusal of the commands ends this way (the capability table's, and the options')."""
    line = f"{prog}: {lines[0]}"
    print(line, file=sys.stderr, flush=True)
    raise Refused(line)


class DefaultsShown(argparse.HelpFormatter):
    """--help names the default of every option whose help does not already say what runs."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS):
            return text
        return f"{text} (default %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: ...`` (no usage block), exit 2, as
    every other refusal of the commands (``refuse``), and whose --help shows the defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)
        # a negative number or range ("-10,10", "-2.5e1") is an option's value, not an option
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?(,\S*)?$")

    def error(self, message: str):
        refuse(self.prog, [f"{message} (see --help)"])

    def _get_values(self, action, arg_strings):
        # called for the options the command line gave (never for a default): the options that
        # do not apply to a run are refused, not ignored (``refuse_inapplicable``)
        self.__dict__.setdefault("given", set()).add(action.dest)
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        self.given = set()
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.given = frozenset(self.given)
        return parsed, extras


def refuse_inapplicable(prog: str, args: argparse.Namespace,
                        rules: list[tuple[str, bool, str]]) -> None:
    """Refuse the first option the command line gave (``Parser``'s ``args.given``) where its rule
    holds: (option, does not apply, why and what works instead)."""
    given = getattr(args, "given", frozenset())
    for option, inapplicable, why in rules:
        if inapplicable and option.lstrip("-").replace("-", "_") in given:
            refuse(prog, [f"{option} {why}"])


def _number(kind: type, test: Callable[[float], bool], domain: str) -> Callable[[str], float]:
    """An argparse ``type``: ``kind(text)``, accepted when ``test`` holds, else a message naming
    the ``domain``."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {domain}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {domain}, got {text!r}")
        return value
    convert.__name__ = domain  # argparse names the type in some messages
    return convert


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
window_int = _number(int, lambda v: v >= 2, "an integer >= 2")   # a window fits a Gaussian
nonnegative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
finite_float = _number(float, math.isfinite, "a finite number")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
nonnegative_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
epsilon_float = _number(float, lambda v: v > 0, "a number > 0 or 'inf'")       # nan fails v > 0
unit_fraction = _number(float, lambda v: 0 < v < 1, "a fraction strictly between 0 and 1")
heavy_fraction = _number(float, lambda v: 0 <= v < 1, "a fraction in [0, 1)")


def speed(text: str) -> float | None:
    """--speed: 'max' (None: as fast as possible) or a finite multiple of real time > 0.

    >>> speed("max"), speed("3600")
    (None, 3600.0)
    """
    if text == "max":
        return None
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'max' or a finite number > 0, got {text!r}") from None


def directory(text: str) -> Path:
    """A directory to write into: it may not exist yet, but must not be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    return path


def value_range(text: str) -> tuple[float, float]:
    """--dp-range/--ldp-range: "L,U", finite, L < U."""
    try:
        lo, hi = parse_range(text)
    except SystemExit as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise argparse.ArgumentTypeError(f"expected L,U with finite L < U, got {text!r}")
    return lo, hi


def rating_range(text: str) -> tuple[float, float] | str:
    """--rating-range: "L,U" or 'none' (keep every finite rating)."""
    return "none" if text.strip().lower() == "none" else value_range(text)


def add_model_kind_arg(ap: argparse.ArgumentParser, kinds: tuple[str, ...]) -> None:
    """--model, the same default in every command (the capability table's ``DEFAULT_KIND``),
    each kind described by the table."""
    described = "; ".join(f"{k}: {KINDS[k].summary}" for k in kinds)
    ap.add_argument("--model", choices=kinds, help=f"the learner (default {DEFAULT_KIND}, in a "
                    f"fleet too; the privacy modes and --lr/--reg/--optimizer/--implicit use one "
                    f"learner, {PRIVATE_KIND}). {described}. `sketchrec modes` shows what each "
                    "runs with")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The learner's options, shared by replay and consume (DP-SGD's among them)."""
    ap.add_argument("--dim", type=positive_int, help=f"latent dimension d (default {DEFAULTS['dim']}; "
                    f"{DP_DEFAULTS['dim']} with DP-SGD)")
    ap.add_argument("--depth", type=positive_int, default=DEFAULTS["depth"], help="sketch rows k (1 = feature hashing)")
    width = ap.add_mutually_exclusive_group()
    width.add_argument("--space-gain", type=positive_float, default=DEFAULTS["space_gain"],
                       help="gamma: width = ceil((|U|+|I|) d / (gamma k)) (eq. 4.9)")
    width.add_argument("--width", type=positive_int, help="sketch width w, given directly")
    ap.add_argument("--heavy-fraction", type=heavy_fraction, help="share of the sketch's memory given to "
                    f"exact slots of heavy users and items (default {DEFAULT_HEAVY_FRACTION}; "
                    "0 = the thesis's pure count sketch, and always 0 with DP-SGD)")
    ap.add_argument("--light-dim", type=positive_int, help="components the other ids keep in the sketch "
                    "(default: as many as fill it about once, at most d)")
    ap.add_argument("--implicit", type=nonnegative_int, metavar="K", help="one factor model "
                    "(--model sketch) adds to a user's vector its last K distinct rated items' "
                    "implicit vectors (SVD++; 0 = off, the default; not with the privacy modes). "
                    "The combination turns it on (K = 64) when it trains several epochs")
    ap.add_argument("--optimizer", choices=tuple(OPTIMIZERS), help="steps of one "
                    "factor model (--model sketch): 'sgd' the thesis's plain SGD (default; always "
                    "with DP-SGD and SGLD); 'adagrad' per-coordinate AdaGrad (sums in a count-min "
                    "sketch beside the vectors: twice their memory); 'adagrad-id' one AdaGrad sum "
                    "per id (a count-min the size of the bias sketch; as fast as SGD)")
    mix = MIX_FACTOR_MEMBER   # the default learner's factor member tunes its own
    ap.add_argument("--lr", type=positive_float, help="learning rate eta of one factor model "
                    f"(--model sketch: default {DEFAULTS['lr']}; {ADAGRAD_DEFAULTS['lr']} with "
                    f"--optimizer adagrad; {DP_DEFAULTS['lr']} with DP-SGD). The default learner, "
                    f"{DEFAULT_KIND}, runs its factor member at lr {mix['lr']} (one pass) or "
                    f"{mix['epochs']['lr']} (epochs) and takes no --lr")
    ap.add_argument("--reg", type=nonnegative_float, help="L2 regularisation lambda of one factor "
                    f"model (--model sketch: default {DEFAULTS['reg']}; {ADAGRAD_DEFAULTS['reg']} "
                    f"with adagrad; {DP_DEFAULTS['reg']} with DP-SGD). {DEFAULT_KIND}'s factor member: "
                    f"reg {mix['reg']} (one pass) or {mix['epochs']['reg']} (epochs)")
    ap.add_argument("--bias-reg", type=nonnegative_float, default=DEFAULTS["bias_reg"], help="L2 weight of the biases")
    ap.add_argument("--init-std", type=nonnegative_float, default=DEFAULTS["init_std"], help="std of start vectors")
    ap.add_argument("--sgld", type=nonnegative_float, metavar="TAU", help="SGLD with temperature TAU")
    ap.add_argument("--clip-loss", type=positive_float, metavar="EPS",
                    help="thesis data clipping: skip a rating when (r - r^)^2 > EPS")
    add_dp_args(ap)


def add_dp_args(ap: argparse.ArgumentParser) -> None:
    dp = ap.add_argument_group("DP-SGD (a proven (epsilon, delta) bound; docs/privacy/dp-sgd.md)")
    noise = dp.add_mutually_exclusive_group()
    noise.add_argument("--dp-epsilon", type=epsilon_float, metavar="E",
                       help="train with DP-SGD, noise calibrated so the planned run costs E "
                       "('inf': clipping without noise)")
    noise.add_argument("--dp-noise", type=nonnegative_float, metavar="SIGMA",
                       help="train with DP-SGD at this noise multiplier; epsilon is accounted")
    noise.add_argument("--sgld-dp", type=positive_float, metavar="TAU",
                       help="SGLD at temperature TAU with clipped gradients: the Langevin noise "
                       "(sqrt(k lr TAU) per cell per step) is a Gaussian mechanism, accounted "
                       "like DP-SGD's with sigma = sqrt(k TAU / lr) / C")
    dp.add_argument("--dp-delta", type=unit_fraction, default=DP_DEFAULTS["delta"])
    dp.add_argument("--dp-clip", type=positive_float, default=DP_DEFAULTS["clip"], metavar="C",
                    help="L2 bound of one rating's update in sketch-cell space")
    dp.add_argument("--dp-batch", type=positive_int, default=DP_DEFAULTS["batch"], metavar="B",
                    help="ratings per noisy step (expected, with Poisson sampling in epochs)")
    dp.add_argument("--dp-unit", choices=("rating", "user"), default="rating",
                    help="what is protected: one rating, or one user's whole history")
    dp.add_argument("--dp-user-cap", type=positive_int, metavar="M",
                    help="ratings kept per user (required with --dp-unit user and DP-SGD; the "
                    "joint mode defaults to 80)")
    dp.add_argument("--dp-range", type=value_range, default="0.5,5", metavar="L,U",
                    help="public rating range: predictions are clipped to it")
    dp.add_argument("--dp-model", choices=("auto", "sgd", "joint"), default="auto",
                    help="the private learner of `replay --holdout --dp-epsilon`: 'sgd' (DP-SGD on the "
                    "sketch), 'joint' (joint-DP biases and item factors released, each user's own part "
                    "solved privately: docs/privacy/joint.md); 'auto': joint for --dp-unit user, "
                    "sgd otherwise; streams (prequential, consume) always use DP-SGD")
    dp.add_argument("--dp-rank", type=nonnegative_int, default=0, metavar="R",
                    help="rank of the joint mode's private item factors (0: biases only, the "
                    "measured best on MovieLens-sized user counts)")
    dp.add_argument("--budget-epsilon", type=positive_float, metavar="E",
                    help="stop learning (keep serving) before the spent epsilon would exceed E")


def add_evaluation_args(ap: argparse.ArgumentParser) -> None:
    """What the prequential protocol measures beside RMSE (replay.curve, replay.topn), and the
    synthetic stream's drift."""
    ev = ap.add_argument_group("prequential evaluation")
    ev.add_argument("--window", type=positive_int, metavar="N",
                    help="ratings per window of the RMSE curve (--json: curve; default 1%% of the stream)")
    ev.add_argument("--plot", metavar="PATH", help="draw the windowed RMSE curve into a PNG")
    ev.add_argument("--topn", type=positive_int, nargs="?", const=2000, metavar="EVENTS",
                    help="top-10 quality: rank every unrated item for EVENTS sampled ratings >= 4 "
                    "(default 2000; seeded), before each is learned, beside a popularity ranker")
    ev.add_argument("--change-point", type=unit_fraction, metavar="F",
                    help="synthetic stream: every user's taste vector is redrawn at fraction F of it")
    ev.add_argument("--synthetic-taste", type=positive_float, metavar="S",
                    help="synthetic stream: std of the taste term u.v (default 1/sqrt(8))")
    ev.add_argument("--synthetic-noise", type=nonnegative_float, default=0.5, metavar="S",
                    help="synthetic stream: std of the rating noise (default 0.5)")


def add_monitor_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-monitor", action="store_true", help="turn the privacy monitor off")
    ap.add_argument("--kld-window", type=window_int, default=20_000, help="ratings in the monitor's KLD window")
    ap.add_argument("--kld-alert", type=nonnegative_float, help="log a warning when the windowed KLD exceeds this")


# --access-control's choices, as create_app's ``access`` argument
ACCESS = {"auto": "auto", "on": True, "off": False}


def add_serving_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--serve", metavar="HOST:PORT",
                    help="serve the live HTTP endpoint while learning (replay: and after it ends, "
                    "until interrupted)")
    add_admin_token_args(ap)
    ap.add_argument("--checkpoint", metavar="DIR", type=directory,
                    help="checkpoint directory (replay: written at the end and on POST /checkpoint)")
    add_access_args(ap)
    add_workers_arg(ap, nice=LEARNING_NICE)
    add_items_arg(ap)
    add_max_items_arg(ap)


def add_max_items_arg(ap: argparse.ArgumentParser) -> None:
    """--max-items: what bounds the serving side's per-item memory (``stream.catalogue``)."""
    from sketchrec.stream.catalogue import MAX_ITEMS_CAP
    ap.add_argument("--max-items", metavar="N", type=_number(
        int, lambda v: 1 <= v <= MAX_ITEMS_CAP, f"an integer from 1 to {MAX_ITEMS_CAP}"),
        help="items the service keeps for serving (catalogue, item factors, retrieval index, "
        "served ranking: their memory, in /stats); past N the least rated are dropped from "
        "recommendations, never from the model (default: what the model is sized for)")


# readers of a learning service yield a little to the learner: at niceness 2 learning kept most of
# its rate alone with the readers' tail within bound, where 0 slowed learning and 3 let the tail
# pass its bound (docs/results.md, Serving: the readers' niceness)
LEARNING_NICE = 2


def add_workers_arg(ap: argparse.ArgumentParser, nice: int = 0) -> None:
    """--workers: HTTP serving processes (docs/serving.md, "Serving from several processes"); ``nice``:
    their default niceness."""
    ap.add_argument("--workers", type=positive_int, metavar="N",
                    help="serving processes answering from the live model in shared memory "
                    "(default: one per core; 1: serve from the learning process itself)")
    ap.add_argument("--worker-nice", type=nonnegative_int, default=nice, metavar="N",
                    help=f"niceness of the serving processes (default {nice}): higher keeps "
                    "learning nearer its alone rate under load, at the cost of request latency "
                    "(docs/serving.md)")


def add_access_args(ap: argparse.ArgumentParser) -> None:
    """Who may read a user's answers (docs/privacy/threat-model.md); shared by every serving command."""
    ap.add_argument("--access-control", choices=ACCESS, default="auto",
                    help="per-user tokens for /predict and /recommend (HMAC under "
                    "$SKETCHREC_USER_TOKEN_KEY; the admin token acts as the backend): 'auto' turns "
                    "them on in every privacy mode and on a --listen/--serve address that is not loopback")
    ap.add_argument("--open", dest="access_control", action="store_const", const="off",
                    help="no credential for /predict and /recommend even on a non-loopback address "
                    "(same as --access-control off)")


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
