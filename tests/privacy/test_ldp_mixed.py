"""A stream whose ratings came perturbed under different local-DP mechanisms: /privacy claims no
single epsilon (the last mechanism's would be false for the others' ratings) and predictions are
not mapped back through either map, in one learner and across a fleet's deltas."""

from __future__ import annotations

from collections import Counter

from sketchrec.models import SketchMF
from sketchrec.models.metrics import ErrorStats
from sketchrec.privacy.ldp import HEADER, MIXED, MIXED_LINE, DeviceRandomiser
from sketchrec.stream.fleet.model_topic import HEADER as DELTA_HEADER
from sketchrec.stream.fleet.model_topic import FleetState, decode_meta, encode_meta
from sketchrec.stream.fleet.replicas import FleetService
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService


def header(epsilon: float) -> list:
    return [(HEADER, DeviceRandomiser(epsilon, 1.0, 5.0).header())]


def rec() -> Recommender:
    return Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100)


def assert_no_single_claim(service) -> None:
    figures = service.privacy()
    assert figures["mode"] == "non-private" and figures["epsilon"] is None   # not the last one's 0.5
    assert figures["local_dp"]["mechanism"] == MIXED and figures["local_dp"]["guarantee"] == MIXED_LINE
    assert figures["local_dp"]["perturbed_on_device"] == 1000
    assert service.recommender.debias is None   # neither mechanism's map fits every rating


def test_one_learner_seeing_two_mechanisms_claims_no_single_epsilon():
    service = LearningService(rec(), debias_ldp=True)
    service.record_origin(header(8.0), 990)
    service.record_origin(header(8.0), 0)
    assert service.privacy()["epsilon"] == 8.0 and service.recommender.debias is not None   # one: claimed
    service.record_origin(header(0.5), 10)
    assert_no_single_claim(service)
    service.record_origin(header(8.0), 0)   # mixed stays mixed
    assert_no_single_claim(service)


def test_a_fleet_settling_deltas_of_two_mechanisms_claims_no_single_epsilon():
    def delta(seq: int, *heard: tuple) -> dict:
        member = FleetService(rec())
        member.fleet = FleetState("m1", ldp_debias=True)
        for epsilon, n in heard:
            member.record_origin(header(epsilon), n)
        return decode_meta([(DELTA_HEADER, encode_meta("m1", seq, {0: (seq, seq + 1)}, ErrorStats(),
                                                       Counter(), origin=member.take_origin()))])

    mixed_in_one = delta(0, (8.0, 990), (0.5, 10))
    assert mixed_in_one["origin"]["mechanism"] == MIXED   # one member's delta
    for metas in ([mixed_in_one], [delta(0, (8.0, 990)), delta(1, (0.5, 10))]):
        replica = FleetService(rec())
        replica.fleet = FleetState(ldp_debias=True)
        for offset, meta in enumerate(metas):
            replica.fleet.settle(meta, offset)
            replica.follow_origin()
        assert_no_single_claim(replica)
