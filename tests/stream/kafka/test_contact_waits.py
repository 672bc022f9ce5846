"""The broker-health reader (``kafka.contact``) tells a broker holding a group's JoinGroup or
SyncGroup by design (while the group's dead leader's session runs out) from a broker that does
not answer: the requests are kafka-python's own, queued through its own protocol parser, whose
headers name their API (``kafka.internals.unanswered``)."""

from types import SimpleNamespace as NS

import pytest
from kafka.protocol.consumer.group import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest
from kafka.protocol.parser import KafkaProtocol

from sketchrec.stream.kafka.contact import broker_contact

SENT, TIMEOUT_S = 90.0, 30.0   # kafka-python's request timeout: a SyncGroup's deadline is an ordinary one


def _consumer(*requests):
    """A client with one connection awaiting ``requests``, sent at SENT, nothing read since."""
    parser = KafkaProtocol(client_id="test")
    in_flight = [(parser.send_request(request), None, SENT, SENT + TIMEOUT_S, None) for request in requests]
    conn = NS(connected=True, parser=parser, in_flight_requests=in_flight, transport=NS(last_read=SENT - 1))
    return NS(_client=NS(_manager=NS(_conns={0: conn})))


def _join():
    return JoinGroupRequest(version=5, group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=6000,
                            member_id="m", group_instance_id=None, protocol_type="consumer", protocols=[])


def _sync():
    return SyncGroupRequest(version=3, group_id="g", generation_id=1, member_id="m",
                            group_instance_id=None, assignments=[])


def _heartbeat():
    return HeartbeatRequest(version=3, group_id="g", generation_id=1, member_id="m", group_instance_id=None)


@pytest.mark.parametrize("held", [_join, _sync], ids=["JoinGroup", "SyncGroup"])
def test_a_group_request_the_broker_holds_is_no_silence(held):
    # a session (6 s) and more after it was sent: the broker answers it once the group forms
    assert broker_contact(_consumer(held()), now=SENT + 8).answering


def test_any_other_request_unanswered_is_silence():
    contact = broker_contact(_consumer(_heartbeat()), now=SENT + 5)
    assert not contact.answering and contact.since == SENT and "unanswered for 5 s" in contact.why


def test_a_held_sync_group_does_not_hide_another_request_unanswered():
    contact = broker_contact(_consumer(_sync(), _heartbeat()), now=SENT + 5)
    assert not contact.answering
