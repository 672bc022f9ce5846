"""Privacy accounting for the noisy training modes, by Google's ``dp-accounting``.

Every noisy release a learner makes is a (Poisson-subsampled) Gaussian mechanism. The ledger keeps
them as entries ``(noise_multiplier, sampling_rate, count)`` — the noise multiplier already divided
by the privacy unit's sensitivity factor (see ``models.dp_sgd``) — and composes the whole
sequence in dp-accounting's RDP accountant (or its PLD accountant) whenever an epsilon is asked
for. The entries are plain numbers, so the ledger goes into every checkpoint as JSON and a restart
continues it instead of starting over.

Proven: the epsilon reported is an upper bound for the composed sequence of every noisy iterate
(so serving every intermediate model is covered), under the ledger's neighbouring relation, given
that the mechanism ran as recorded. The relation is named exactly: epoch training with Poisson
sampling is accounted for one unit added or removed; one pass over a stream in fixed chunks for one
unit replaced by another, with the stream's length public (adding a rating would shift every later
chunk: a valid add/remove bound for such a pass is far larger). A ledger holds one relation. The RDP figure is a valid but slightly
loose bound; PLD is tighter and slower.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass

import numpy as np

from sketchrec.extras import MissingExtra

ACCOUNTANTS = ("rdp", "pld")


def _dp():
    """``dp_accounting`` (the dp extra), imported when an epsilon is first composed: a run that
    accounts nothing (non-private) needs neither it nor its dependencies."""
    try:
        import dp_accounting
        from absl import logging as absl_logging
    except ImportError as exc:
        raise MissingExtra("DP accounting", "dp") from exc
    # dp-accounting logs a warning for every RDP order whose series does not converge (it then
    # leaves that order out, which keeps the bound valid): noise on a command line, not news
    absl_logging.set_verbosity(absl_logging.ERROR)
    return dp_accounting


def load_accountant() -> None:
    """Import the accountant now, in the calling thread (``_dp``): a process that composes an
    epsilon from another thread (a served DP model's /privacy, in an HTTP thread) calls this on
    its main thread first, so that dp-accounting and the SciPy it pulls in are never first
    imported in a thread beside the kernels' compiles and loads."""
    _dp()


RELATIONS = ("add/remove", "replace-one")


@dataclass(frozen=True)
class GaussianSteps:
    """``count`` releases of a Gaussian mechanism with this noise multiplier (noise std over
    sensitivity), each on a Poisson sample of the data taken with probability ``sampling_rate``
    (1.0: the whole data). ``mechanism="laplace"``: Laplace releases, the multiplier being the
    scale over the L1 sensitivity (epsilon = 1 / multiplier each)."""

    noise_multiplier: float
    sampling_rate: float = 1.0
    count: int = 1
    mechanism: str = "gaussian"

    def __post_init__(self):
        if not self.noise_multiplier > 0 or not 0 < self.sampling_rate <= 1 or self.count < 0:
            raise ValueError("need noise_multiplier > 0, 0 < sampling_rate <= 1, count >= 0")

    def event(self) -> dp_accounting.DpEvent:
        dp_accounting = _dp()
        single = (dp_accounting.LaplaceDpEvent(self.noise_multiplier) if self.mechanism == "laplace"
                  else dp_accounting.GaussianDpEvent(self.noise_multiplier))
        if self.sampling_rate < 1.0:
            single = dp_accounting.PoissonSampledDpEvent(self.sampling_rate, single)
        return dp_accounting.SelfComposedDpEvent(single, self.count)


# 1e-4 discretisation keeps the PLD's epsilon within ~1e-3 of the exact curve for our mechanisms
PLD_INTERVAL = 1e-4


def _accountant(kind: str, orders=None, interval: float = PLD_INTERVAL) -> dp_accounting.PrivacyAccountant:
    if kind == "rdp":
        return _dp().rdp.RdpAccountant(orders)
    if kind == "pld":
        return _dp().pld.PLDAccountant(value_discretization_interval=interval)
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}")


def epsilon_of(steps: list[GaussianSteps], delta: float, accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` of the composition of every entry (0 for none)."""
    acc = _composed(steps, _accountant(accountant))
    return 0.0 if acc is None else float(acc.get_epsilon(delta))


def _composed(steps: list[GaussianSteps], acc):
    steps = [s for s in steps if s.count > 0]
    if not steps:
        return None
    acc.compose(_dp().ComposedDpEvent([s.event() for s in steps]))
    return acc


def rdp_epsilons(steps: list[GaussianSteps], delta: float, orders=None) -> dict:
    """Each RDP order's epsilon at ``delta`` for the composition: ``epsilon_of`` (RDP) is their
    minimum. ``orders``: a subset of the accountant's default orders. Each order is computed
    alone, so a subset's minimum is never below the default's: enough noise by a subset is
    enough by the ledger.

    >>> steps = [GaussianSteps(1.0, 0.01, 100)]
    >>> min(rdp_epsilons(steps, 1e-5).values()) == epsilon_of(steps, 1e-5)
    True
    >>> min(rdp_epsilons(steps, 1e-5, orders=[2, 8, 32]).values()) >= epsilon_of(steps, 1e-5)
    True
    """
    rdp = _dp().rdp
    orders = rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS if orders is None else orders
    acc = _composed(steps, _accountant("rdp", orders))
    if acc is None:
        return {}
    return {float(a): float(rdp.compute_epsilon([a], [r], delta)[0]) for a, r in zip(orders, acc.rdp)}


def pld_epsilon(steps: list[GaussianSteps], delta: float, interval: float) -> float:
    """``epsilon_of`` (PLD) at another discretisation ``interval``: a coarser one is cheaper and
    bounds neither way (a first guess only)."""
    acc = _composed(steps, _accountant("pld", interval=interval))
    return 0.0 if acc is None else float(acc.get_epsilon(delta))


class PrivacyLedger:
    """Every noisy release of one model, for one privacy unit, and what it has cost so far.

    ``unit`` is what one neighbouring dataset changes: ``"rating"`` or ``"user"``; ``relation``
    how (``RELATIONS``): Poisson-sampled steps (``record``) are add/remove, stream passes
    (``begin_pass``) replace-one; it is set by the first entry and a ledger never mixes them.
    ``record`` merges consecutive identical entries, so a run of T equal steps is one entry.
    """

    def __init__(self, unit: str = "rating", delta: float = 1e-5, accountant: str = "rdp",
                 steps: list[GaussianSteps] | None = None, relation: str | None = None,
                 ledger_id: str | None = None):
        if unit not in ("rating", "user"):
            raise ValueError("unit must be 'rating' or 'user'")
        if not 0 < delta < 1:
            raise ValueError("delta must be in (0, 1)")
        _accountant(accountant)
        self.unit, self.delta, self.accountant = unit, float(delta), accountant
        self.steps: list[GaussianSteps] = list(steps or [])
        if relation is not None and relation not in RELATIONS:
            raise ValueError(f"relation must be one of {RELATIONS}")
        self.relation = relation
        # which ledger this is: a checkpoint directory holding one refuses any other
        self.ledger_id = ledger_id or secrets.token_hex(8)

    def _use(self, relation: str) -> None:
        if self.relation not in (None, relation):
            raise ValueError(f"this ledger accounts {self.relation} neighbours; a {relation} "
                             "release cannot be composed into it")
        self.relation = relation

    def record(self, noise_multiplier: float, sampling_rate: float = 1.0, count: int = 1,
               relation: str = "add/remove", mechanism: str = "gaussian") -> None:
        """Record ``count`` releases (epoch training: Poisson-sampled steps, add/remove)."""
        self._use(relation)
        entry = GaussianSteps(float(noise_multiplier), float(sampling_rate), int(count), mechanism)
        last = self.steps[-1] if self.steps else None
        if last and (last.noise_multiplier, last.sampling_rate, last.mechanism) == \
                (entry.noise_multiplier, entry.sampling_rate, entry.mechanism):
            self.steps.pop()
            entry = GaussianSteps(last.noise_multiplier, last.sampling_rate, last.count + entry.count,
                                  mechanism)
        self.steps.append(entry)

    @property
    def n_releases(self) -> int:
        return sum(s.count for s in self.steps)

    def epsilon(self, delta: float | None = None) -> float:
        """The proven epsilon spent so far, at ``delta`` (default: the ledger's delta)."""
        return epsilon_of(self.steps, self.delta if delta is None else delta, self.accountant)

    def epsilon_if(self, noise_multiplier: float, sampling_rate: float = 1.0, count: int = 1) -> float:
        """What the epsilon would be after ``count`` more such releases."""
        return epsilon_of(self.steps + [GaussianSteps(noise_multiplier, sampling_rate, count)],
                          self.delta, self.accountant)

    def affordable(self, budget: float, noise_multiplier: float, sampling_rate: float = 1.0,
                   limit: int = 1 << 30) -> int:
        """The largest number (<= limit) of further such releases keeping epsilon <= budget."""
        cost = self._epsilon_after(noise_multiplier, sampling_rate)
        if cost(0) > budget:
            return 0
        lo, hi = 0, 1
        while hi <= limit and cost(hi) <= budget:
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)
        while hi - lo > 1:  # epsilon grows with the count: bisect the first count over budget
            mid = (lo + hi) // 2
            if cost(mid) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    def _epsilon_after(self, noise_multiplier: float, sampling_rate: float):
        """``epsilon_if`` as a function of the count. RDP: the accountant adds count times one
        release's RDP to the ledger's, order by order, so both are computed once and every count
        costs a few array operations: the same figure, to the last bit."""
        if self.accountant != "rdp":
            return lambda count: self.epsilon_if(noise_multiplier, sampling_rate, count)
        rdp, step = _dp().rdp, GaussianSteps(noise_multiplier, sampling_rate)
        orders = rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS
        spent, one = (_composed(steps, _accountant("rdp")) for steps in (self.steps, [step]))

        def cost(count: int) -> float:
            if spent is None and count == 0:
                return 0.0
            total = spent.rdp if count == 0 else (0.0 if spent is None else spent.rdp) + count * one.rdp
            return float(rdp.compute_epsilon(np.array(orders), total, self.delta)[0])
        return cost

    def begin_pass(self, noise_multiplier: float, budget: float | None = None) -> bool:
        """Record one more pass over a stream (each rating in one noisy step; a restart or a
        replay of offsets is a new pass: replayed ratings are counted again). False, and nothing
        recorded, when the pass would take epsilon over ``budget``."""
        if budget is not None and self.epsilon_if(noise_multiplier) > budget:
            return False
        self.record(noise_multiplier, relation="replace-one")
        return True

    def to_dict(self) -> dict:
        return {"unit": self.unit, "delta": self.delta, "accountant": self.accountant,
                "relation": self.relation, "ledger_id": self.ledger_id,
                "steps": [{k: v for k, v in asdict(s).items() if (k, v) != ("mechanism", "gaussian")}
                          for s in self.steps]}

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyLedger":
        steps = [GaussianSteps(**s) for s in data["steps"]]
        relation = data.get("relation")
        if relation is None and steps:  # ledgers from before the relation was stored
            relation = "add/remove" if all(s.sampling_rate < 1 for s in steps) else "replace-one"
        return cls(data["unit"], data["delta"], data.get("accountant", "rdp"), steps, relation,
                   data.get("ledger_id"))


def neighbouring(ledger: PrivacyLedger) -> tuple[str, str]:
    """(privacy_unit label, phrase for the guarantee sentence) naming the exact relation."""
    unit, relation = ledger.unit, ledger.relation or "add/remove"
    if relation == "replace-one":
        return (f"replace-one {unit} (stream length public)",
                f"one {unit} replaced by another (the stream's length is public)")
    return f"add/remove {unit}", f"one {unit} added or removed"


def describe(ledger: PrivacyLedger, mode: str = "dp-sgd", void: str | None = None) -> dict:
    """The figures /privacy and `replay --json` report for a DP-SGD-trained model. ``void``: why
    the accounted figure proves nothing (e.g. reproducible debug noise, ``privacy.entropy``)."""
    eps = ledger.epsilon()
    label, phrase = neighbouring(ledger)
    guarantee = (f"({eps:.4g}, {ledger.delta:g})-DP for {phrase}, proven by "
                 f"{ledger.accountant.upper()} accounting over every noisy iterate so far (serving "
                 "each intermediate model is covered); the noise and the Poisson sample come from "
                 "fresh secret entropy; the hash seed, rating range, capacity and stream length "
                 "are public; covers the released surfaces only (docs/privacy/surfaces.md)")
    if void:
        guarantee = f"none: {void} (the accountant alone would say {eps:.4g})"
    return {"mode": mode, "epsilon": float("inf") if void else eps, "delta": ledger.delta,
            "privacy_unit": label, "unit": ledger.unit, "neighbouring": ledger.relation or "add/remove",
            "proven_bound": not void, "accountant": ledger.accountant,
            "noisy_releases": ledger.n_releases, "guarantee": guarantee}


def calibrate_noise(target_epsilon: float, delta: float, sampling_rate: float = 1.0,
                    count: int = 1, accountant: str = "rdp") -> float:
    """The smallest noise multiplier whose ``count`` (Poisson-subsampled) Gaussian releases cost
    at most ``target_epsilon`` at ``delta`` (dp-accounting's calibrate_dp_mechanism)."""
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError("target_epsilon must be positive and finite")
    dp_accounting = _dp()
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda z: GaussianSteps(z, sampling_rate, count).event(),
        target_epsilon, delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))
