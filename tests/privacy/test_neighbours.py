"""The neighbour-difference harness: every privacy mode of the mode table, on D and on each
adversarial neighbour D' under every relation it claims, with the noise keys fixed (the debug
noise seed: reported as not proven), compared surface by surface.

A central-DP mode passes when every field its public routes show belongs to a surface it declares
public or noised (``privacy.mode``, via ``privacy.release.FIELDS``), and every field that differs
between D and D' is declared noised. Its mechanisms pass when the largest change of each
pre-noise statistic over the neighbours is at most the sensitivity it is calibrated to
(``Mechanism.bound``). The modes are iterated from the enum: a mode added tomorrow without a
runner here fails. The harness is shown to catch a leaked surface and an under-calibrated
mechanism (monkeypatched variants).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sketchrec.data import Ratings, SyntheticStream
from sketchrec.models.private import fallback as fb
from sketchrec.models.private.dp_sgd import DPConfig, NoisyStepper, clipped_gradient_sum
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS, PrivateBaseline
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy.access import UserTokens
from sketchrec.privacy import accounting, budget, joint_dp
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.joint_dp import CHOICE_CLIP
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.privacy.release import FIELDS, release
from sketchrec.privacy.report import privacy_figures
from sketchrec.replay.protocols import cap_per_user, train_private_epochs
from sketchrec.sketches.hashing import as_keys
from sketchrec.stream import service as service_module
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving import http, joint as joint_module
from sketchrec.stream.serving.joint import JointRecommender, JointService
from sketchrec.stream.service import LearningService

CAP, WIDTH, SEED, ADMIN = 6, 64, 11, "backend-token"
TOKENS = UserTokens(b"neighbour-harness-key")
BASE = SyntheticStream(300, n_users=25, n_items=30, seed=5).all()
CATALOGUE = np.arange(1, 200_000)   # public: the same for D and every D'
A, B = 10_000, 10_001               # the adversarial units' user ids


def _sharing(n: int) -> np.ndarray:
    ids = np.arange(100_000, 200_000)
    cells = fb.buckets(ids, WIDTH)
    return ids[cells == cells[0]][:n]


def _user_cases() -> dict:
    """The added (or replacing) user's ratings: items, values."""
    return {"m ratings of one item": (np.full(CAP, 7), np.full(CAP, 5.0)),
            "m items sharing a bucket": (_sharing(CAP), np.full(CAP, 1.0)),
            "duplicated ratings": (np.repeat([3, 4], CAP // 2), np.full(CAP, 5.0)),
            "extreme values": (np.full(CAP, 7), np.tile([1e9, -1e9], CAP // 2)),
            "a user with one rating": (np.array([7]), np.array([5.0]))}


def _rating_cases() -> dict:
    """One rating: (user, item, value)."""
    u, i = int(BASE.users[0]), int(BASE.items[0])
    return {"an extreme value": (u, 7, 1e9), "a duplicate of a rating": (u, i, float(BASE.ratings[0])),
            "an item sharing a bucket": (u, int(_sharing(2)[1]), 1.0),
            "a new user with one rating": (A, 7, 5.0)}


def _append(data: Ratings, users, items, ratings) -> Ratings:
    n = len(ratings)
    extra = Ratings(np.asarray(users, BASE.users.dtype).reshape(n), np.asarray(items, BASE.items.dtype),
                    np.asarray(ratings, np.float64), np.zeros(n, BASE.timestamps.dtype))
    return Ratings.concat([data, extra])


def neighbours(relation: str) -> dict:
    """Name -> (D, D') for one relation (replace-one: same length, same positions)."""
    out = {}
    if relation.endswith("user"):
        for name, (items, values) in _user_cases().items():
            if relation.startswith("add/remove"):
                out[name] = (BASE, _append(BASE, np.full(len(items), A), items, values))
            else:   # user A's ratings at these positions, or user B's plain ones
                out[name] = (_append(BASE, np.full(len(items), B), np.arange(500, 500 + len(items)),
                                     np.full(len(items), 3.0)),
                             _append(BASE, np.full(len(items), A), items, values))
    else:
        for name, (u, i, r) in _rating_cases().items():
            if relation.startswith("add/remove"):
                out[name] = (BASE, _append(BASE, [u], [i], [r]))
            else:
                out[name] = (_append(BASE, [u], [500], [3.0]), _append(BASE, [u], [i], [r]))
    return out


# --- running a mode: the surfaces it shows ---------------------------------------------------------

def _dp(mode: PrivacyMode, **kw) -> DPConfig:
    user = mode is PrivacyMode.DP_SGD_USER
    return DPConfig(2.0, batch_size=100, unit="user" if user else "rating",
                    user_cap=CAP if user else None, debug_noise_seed=SEED,
                    mode="sgld-dp" if mode is PrivacyMode.SGLD_DP else "dp-sgd", **kw)


def _routes(service) -> dict:
    """What an anonymous client (and an unknown user, asked by the backend) sees."""
    with TestClient(http.create_app(service, ADMIN, TOKENS)) as c:
        metrics = {}
        for line in c.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                metrics[name.split("{")[0].removeprefix("sketchrec_").removesuffix("_total")
                        .removeprefix("privacy_")] = float(value)
        unknown = c.get("/recommend", params={"user": "never-seen", "k": 5},
                        headers={"Authorization": f"Bearer {ADMIN}"}).json()
        return {"/stats": c.get("/stats").json(), "/privacy": c.get("/privacy").json(),
                "/metrics": metrics, "/recommend (unknown user)": unknown}


def _stream(mode: PrivacyMode, data: Ratings) -> dict:
    """A stream pass (replace-one at fixed positions), served."""
    model = fb.with_fallback(SketchMF(dim=4, width=512, seed=1, dp=_dp(mode)), WIDTH)
    service = LearningService(Recommender(model, pair_capacity=5000, seed=1))
    service.begin_private_pass(model.dp.unit, 1e-5, None)
    service.recommender.learn_many(data.users, data.items, data.ratings)
    return _routes(service)


def _epochs(mode: PrivacyMode, data: Ratings, target: float | None = None) -> dict:
    """Epoch training (add/remove): the --json privacy block as `replay` builds it; at a given
    noise (--dp-noise) unless ``target`` (--dp-epsilon: a calibration per run, the slow part)."""
    model = fb.with_fallback(SketchMF(dim=4, width=512, seed=1, dp=_dp(mode)), WIDTH)
    ledger = PrivacyLedger(model.dp.unit, 1e-5)
    info = train_private_epochs(model, data, 1, seed=1, ledger=ledger, target_epsilon=target)
    block = {**privacy_figures(model, ledger=ledger), **model.fallback_figures(),
             "dp": {**model.dp.to_dict(), **info}}
    return {"--json privacy": release(mode, block)}


def _joint(mode: PrivacyMode, data: Ratings) -> dict:
    unit = "user" if mode is PrivacyMode.JOINT_USER else "rating"
    cfg = JointDPConfig(epsilon=4.0, unit=unit, rank=2, iterations=2, cap=CAP, debug_noise_seed=SEED)
    model = PrivateALS(cfg, CATALOGUE[:40]).fit(data.users, data.items, data.ratings)
    return _routes(JointService(JointRecommender(model, data)))


RUNNERS = {PrivacyMode.DP_SGD_RATING: (_stream, _epochs), PrivacyMode.DP_SGD_USER: (_stream, _epochs),
           PrivacyMode.SGLD_DP: (_stream, _epochs), PrivacyMode.JOINT_RATING: (_joint,),
           PrivacyMode.JOINT_USER: (_joint,)}


def _runner(mode: PrivacyMode, relation: str):
    runners = RUNNERS.get(mode)
    assert runners, f"no runner for the central mode {mode.value}: add one to RUNNERS"
    if mode.value.startswith("joint"):
        return runners[0]
    return runners[0] if relation.startswith("replace-one") else runners[1]


# --- the comparison --------------------------------------------------------------------------------

def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, path + (str(key),))
    elif isinstance(value, list):
        yield path, tuple(map(repr, value))
    else:
        yield path, value


METRICS = {"uptime_seconds": "uptime_s"}   # /metrics names that are not the /stats field's


def _surface(route: str, path: tuple) -> str | None:
    if route.startswith("/recommend"):
        return "public_ranking"
    path = tuple(METRICS.get(key, key) for key in path) if route == "/metrics" else path
    return next((FIELDS[key] for key in path if key in FIELDS), None)


def violations(mode: PrivacyMode, d: dict, d2: dict) -> list[str]:
    """Every field on a public route that the mode does not allow there, or that changed with one
    unit without being declared noised."""
    out = []
    for route in d.keys() | d2.keys():
        a, b = dict(_leaves(d.get(route, {}))), dict(_leaves(d2.get(route, {})))
        for path in a.keys() | b.keys():
            if a.get(path) is None and b.get(path) is None:   # an empty field tells nothing
                continue
            surface, where = _surface(route, path), f"{route} {'.'.join(path)}"
            how = mode.surface(surface) if surface else None
            if how not in ("public", "noised"):
                out.append(f"{where}: {how or 'unclassified'} on a public route")
            elif how == "public" and a.get(path) != b.get(path):
                out.append(f"{where}: public, changed with one unit ({a.get(path)!r} -> {b.get(path)!r})")
    return sorted(set(out))


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """Wall-clock figures (uptime, throughput) come from a fixed clock: they are public by
    construction, and a clock that moved between the D and D' runs is not a leak."""
    clock = SimpleNamespace(time=lambda: 1.0e9, perf_counter=lambda: 1.0e3, monotonic=lambda: 1.0e3)
    monkeypatch.setattr(service_module, "time", clock)
    monkeypatch.setattr(joint_module, "time", clock)


CASES = [(m, r) for m in PrivacyMode for r in m.relations or (None,)]


@pytest.fixture
def coupled_size(monkeypatch):
    """The coupling of the training size's noised release: D' takes the noise draw that gives it
    D's released size (the draw shifted by N' - N: as likely under the Gaussian, the proof's
    coupling). The rest of the plan must then be identical, or it read more of N than its release."""
    monkeypatch.setattr(budget, "noised_size", lambda size, sd, rng: len(BASE) + sd * rng.standard_normal())


@pytest.mark.parametrize("mode,relation", CASES, ids=[f"{m.value}:{r}" for m, r in CASES])
def test_every_mode_releases_only_what_it_declares(mode, relation, coupled_size):
    if not mode.central:   # claims no central release: every surface shown as computed
        assert set(mode.surfaces().values()) == {"exact"}
        assert release(mode, {"model_bytes": 1, "ratings_learned": 2}) == {"model_bytes": 1, "ratings_learned": 2}
        return
    run = _runner(mode, relation)
    for name, (d, d2) in neighbours(relation).items():
        found = violations(mode, run(mode, d), run(mode, d2))
        assert not found, f"{mode.value}, {relation}, {name}: " + "; ".join(found)


_ACCOUNTED: dict = {}


@pytest.fixture(autouse=True)
def accounted_once(monkeypatch):
    """Each composition's epsilon (the RDP accountant: most of the CPU of a run's privacy block
    and of a target-epsilon plan's bisection) computed once per set of entries. It is a pure
    function of them, so D and D' share one result only when both ledgers (or both plans) hold
    the same entries: a run that lets N or a unit's data into its releases changes the entries
    and gets its own epsilon, and the harness still sees the difference."""
    compute = accounting.epsilon_of

    def once(steps, delta, accountant="rdp"):
        key = (tuple(steps), delta, accountant)
        if key not in _ACCOUNTED:
            _ACCOUNTED[key] = compute(steps, delta, accountant)
        return _ACCOUNTED[key]
    monkeypatch.setattr(accounting, "epsilon_of", once)
    monkeypatch.setattr(joint_dp, "epsilon_of", once)


@pytest.mark.parametrize("mode", [PrivacyMode.DP_SGD_RATING, PrivacyMode.DP_SGD_USER])
def test_the_epoch_plan_releases_nothing_of_the_training_size(mode, coupled_size):
    """With a target epsilon the plan calibrates its noise from q and the steps: from the noised
    size only, so under its coupling the noise multiplier and epsilon are the same for D and D'."""
    relation = mode.relations[0]
    d, d2 = next(iter(neighbours(relation).values())) if mode.unit == "user" else \
        neighbours(relation)["an extreme value"]
    a, b = _epochs(mode, d, 4.0), _epochs(mode, d2, 4.0)
    assert not violations(mode, a, b)
    assert a["--json privacy"]["dp"]["released_train_size"] != len(d)


def test_the_harness_catches_a_plan_that_reads_the_exact_size(monkeypatch):
    """The deliberately broken planner (q from the exact N, as it once was): the noise multiplier
    it releases moves with one added rating."""
    monkeypatch.setattr(budget, "noised_size", lambda size, sd, rng: float(size))
    mode = PrivacyMode.DP_SGD_RATING
    d, d2 = neighbours("add/remove rating")["an extreme value"]
    found = violations(mode, _epochs(mode, d, 4.0), _epochs(mode, d2, 4.0))
    assert any("dp.noise_multiplier" in v for v in found), found


def test_the_harness_catches_a_leaked_surface(monkeypatch):
    """A release boundary that lets everything through (the joint mode's /stats then shows its
    model size and the exact counts): the harness names the fields."""
    monkeypatch.setattr(http, "release", lambda mode, values: dict(values))
    mode = PrivacyMode.JOINT_USER
    d, d2 = neighbours("add/remove user")["m ratings of one item"]
    found = violations(mode, _joint(mode, d), _joint(mode, d2))
    assert any("model_bytes" in v for v in found) and any("ratings_learned" in v for v in found)


# --- mechanisms: pre-noise statistics against their calibrated sensitivity --------------------------

def _fallback(unit: str, window: int = fb.WINDOW) -> fb.DPSGDFallback:
    dp = DPConfig(0.0, batch_size=100, unit=unit, user_cap=CAP if unit == "user" else None,
                  debug_noise_seed=SEED)   # noise 0: the statistics are released exactly
    return fb.DPSGDFallback(SketchMF(dim=2, width=256, seed=1, dp=dp), WIDTH, window)


def _item_statistics(unit, data):
    model = _fallback(unit)
    model.fit_fallback(data.users, data.items, data.ratings)
    return np.concatenate([model.release.sums, model.release.counts])


def _global_statistics(unit, data):
    model = _fallback(unit, window=len(data))
    model.learn_many(data.users, data.items, data.ratings)
    return np.array(model._totals[:2])


def _choice_statistic(unit, data):
    """The choice's sum of per-user clipped error differences, both models held fixed: they are
    earlier releases (the baseline) or public here (an untrained model), so the sensitivity is
    the statistic's given them (adaptive composition)."""
    model = _fallback(unit)
    ids, users = np.unique(data.users, return_inverse=True)
    diff = model._differences(data.users, data.items, data.ratings)
    per_user = np.bincount(users, diff, len(ids)) / np.bincount(users, minlength=len(ids))
    return np.array([np.clip(per_user, -CHOICE_CLIP, CHOICE_CLIP).sum()])


def _gradient_sum(unit, data):
    """One step's sum of clipped cell-space gradients, from the same starting state."""
    if unit == "user":
        data = cap_per_user(data, CAP)
    model = SketchMF(dim=2, width=256, seed=1, dp=DPConfig(0.0, batch_size=100, unit=unit,
                                                         user_cap=CAP if unit == "user" else None))
    s = NoisyStepper(model, model.dp)
    out = np.empty(len(data))
    clipped_gradient_sum(model.store, as_keys(data.users), as_keys(data.items),
                         np.ascontiguousarray(data.ratings, np.float64), model.hyper(0), model.stats,
                         model.dp.clip, s.offset_scale, s.acc, s.bacc, s.offset_acc, s.scratch,
                         s.bscratch, out)
    return np.concatenate([s.acc.ravel(), s.bacc.ravel(), s.offset_acc])


def _joint_biases(unit, data):
    cfg = JointDPConfig(epsilon=math.inf, unit=unit, cap=CAP, debug_noise_seed=SEED)  # same cap draws
    model = PrivateBaseline(cfg, CATALOGUE[:40]).fit(data.users, data.items, data.ratings)
    return np.concatenate([model.release.sums, model.release.counts])


PROBES = {"clipped gradient sum per step": _gradient_sum,
          "bucketed item (sum, count) of the baseline": _item_statistics,
          "global (sum, count) of the baseline": _global_statistics,
          "sum of clipped error differences (the choice)": _choice_statistic,
          "item bias (sum, count)": _joint_biases}
# statistics probed elsewhere (named, so that nothing is left out silently)
PROBED_ELSEWHERE = {"item factor Gram and cross statistics": "tests/models/private/test_user_dp.py"}


def largest_change(mode: PrivacyMode, mechanism) -> float:
    relation = next(r for r in mode.relations if r.startswith("add/remove"))
    probe = PROBES[mechanism.statistic]
    return max(float(np.linalg.norm(probe(mode.unit, d2) - probe(mode.unit, d)))
               for d, d2 in neighbours(relation).values())


MECHANISMS = [(m, mech) for m in PrivacyMode if m.central for mech in m.mechanisms]


@pytest.mark.parametrize("mode,mechanism", MECHANISMS,
                         ids=[f"{m.value}:{x.statistic}" for m, x in MECHANISMS])
def test_every_mechanism_moves_at_most_its_calibrated_sensitivity(mode, mechanism):
    if mechanism.statistic in PROBED_ELSEWHERE:
        return
    assert mechanism.statistic in PROBES, f"no probe for {mechanism.statistic!r} ({mode.value})"
    if mechanism.norm == "l1":   # a Laplace release: the change's L1 norm
        return
    assert largest_change(mode, mechanism) <= mechanism.bound(m=CAP) + 1e-9


def test_the_harness_catches_an_under_calibrated_mechanism(monkeypatch):
    """The user unit's item statistics without the per-user bound (every weight 1): one user's m
    ratings in one bucket move it past the calibrated sqrt(2m)."""
    monkeypatch.setattr(fb, "user_weights", lambda users, cells, x, allowance: (
        np.ones(len(users)), np.zeros(len(allowance))))
    mode = PrivacyMode.DP_SGD_USER
    mech = next(x for x in mode.mechanisms if x.statistic.startswith("bucketed"))
    assert largest_change(mode, mech) > mech.bound(m=CAP)
