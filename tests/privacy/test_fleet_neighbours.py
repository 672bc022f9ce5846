"""The neighbour-difference harness (``test_neighbours``) on the fleet input: a DP fleet of two
members over disjoint partitions (users by parity, as a topic keyed by user spreads them), served
by a read-only replica that applied both members' deltas, its ledger from the model topic's
claims. Run on D and on each adversarial neighbour D' of the relations a stream pass claims, with
the noise keys fixed; every field its public routes show must be declared public or noised, and
every field that changed must be declared noised.

The harness's power to catch a leaked surface is shown in ``test_neighbours``; here, that a fleet
whose ledger summed its members would be caught by the public /privacy changing with the
fleet's size is not a neighbour difference (the size is public), so the accounting rule is
tested by ``tests/integration/test_fleet_private.py`` instead."""

from __future__ import annotations

import pytest

from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.stream.fleet.model_topic import FleetState
from sketchrec.stream.fleet.replicas import FleetService
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.recommender import Recommender
from test_neighbours import _dp, _routes, frozen_clock, neighbours, violations  # noqa: F401

FLEET_MODES = (PrivacyMode.DP_SGD_RATING, PrivacyMode.DP_SGD_USER, PrivacyMode.SGLD_DP)


def _fleet(mode: PrivacyMode, data) -> dict:
    """Two members learn their partitions, a replica applies both deltas and serves."""
    recs = [Recommender(SketchMF(dim=4, width=512, seed=1, dp=_dp(mode, fallback_share=0.0)),
                        pair_capacity=5000, seed=1) for _ in range(3)]
    trackers = [DeltaTracker(rec, member) for rec, member in zip(recs, ("a", "b", None))]
    for n in (0, 1):
        part = data.users % 2 == n
        recs[n].learn_many(data.users[part], data.items[part], data.ratings[part])
    for n in (0, 1):
        trackers[2].apply(trackers[n].take())
    trackers[2].settle()
    service = FleetService(recs[2], None, read_only=True)
    dp = recs[2].model.dp
    service.fleet = FleetState(dp={"unit": dp.unit, "delta": 1e-5, "multiplier": dp.stream_multiplier()})
    for seq, (member, p) in enumerate((("a", "0"), ("b", "1"))):
        service.fleet.settle({"member": member, "seq": 0, "covers": {}, "claims": [p]}, seq)
    return _routes(service)


@pytest.mark.parametrize("mode", FLEET_MODES, ids=[m.value for m in FLEET_MODES])
def test_a_dp_fleet_releases_only_what_it_declares(mode):
    relations = [r for r in mode.relations if r.startswith("replace-one")]
    assert relations, f"{mode.value} claims no stream relation"
    for relation in relations:
        for name, (d, d2) in neighbours(relation).items():
            one, two = _fleet(mode, d), _fleet(mode, d2)
            assert "parallel" in one["/privacy"]["composition"]   # the fleet's ledger is served
            found = violations(mode, one, two)
            assert not found, f"{mode.value} fleet, {relation}, {name}: " + "; ".join(found)
