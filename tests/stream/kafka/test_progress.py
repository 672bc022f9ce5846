"""What the consumer loop tells the health after each poll (``KafkaLearner._watch``), from what its
kafka-python client already knows: a broker that does not answer (a hung broker keeps its TCP
connection: "connected" said ok for ~50 s) and a lag that grows while nothing is taken."""

import re
import time
import types

from sketchrec.stream.health import Health
from sketchrec.stream.kafka.consumer import KafkaLearner
from sketchrec.stream.kafka.contact import broker_contact

NS = types.SimpleNamespace


class Client:
    """A kafka-python consumer as ``kafka.contact`` reads it: one connection, its requests in
    flight (sent times) and its last read; one partition's high watermark and position."""

    def __init__(self):
        self.conn = NS(connected=True, in_flight_requests=[], transport=NS(last_read=time.monotonic()))
        self._client = NS(_manager=NS(_conns={0: self.conn}))
        self.part = NS(highwater=None, position=NS(offset=0))
        self._subscription = NS(assignment={"t-0": self.part})

    def hang(self, ago: float) -> None:
        """A request sent ``ago`` seconds ago, nothing read since."""
        sent = time.monotonic() - ago
        self.conn.in_flight_requests = [(1, None, sent, sent + 30.5, None)]
        self.conn.transport.last_read = sent


def _learner() -> KafkaLearner:
    learner = KafkaLearner.__new__(KafkaLearner)
    learner.health, learner.taken, learner.consumer = Health(), 0, Client()
    learner.health.watch_broker()
    return learner


def test_a_broker_that_does_not_answer_is_lost_from_its_last_answer():
    learner = _learner()
    learner._watch({})
    assert learner.health.problems() == [] and learner.health.connected
    learner.consumer.hang(ago=0.5)    # a fetch waits: not yet silence (room for a paused test)
    learner._watch({})
    assert learner.health.connected
    learner.consumer.hang(ago=6.0)    # 6 s without an answer: lost since then, shown at once
    learner._watch({})
    reasons = learner.health.problems()
    # the figure is whole seconds since the last answer: a pause here (a collection, a loaded
    # machine) may add some
    found = re.match(r"broker unreachable for (\d+) s \(broker not answering", reasons[0])
    assert len(reasons) == 1 and found and 6 <= int(found[1]) < 60, reasons
    learner.consumer.conn.transport.last_read = time.monotonic()   # it answers again
    learner.consumer.conn.in_flight_requests = []
    learner._watch({})
    assert learner.health.problems() == [] and learner.health.lost_since is None


def test_a_group_join_waiting_long_is_not_silence():
    learner = _learner()
    learner.consumer.hang(ago=20.0)
    sent = learner.consumer.conn.in_flight_requests[0][2]
    learner.consumer.conn.in_flight_requests = [(1, None, sent, sent + 300.0, None)]  # a join's deadline
    learner._watch({})
    assert learner.health.connected and learner.health.problems() == []


def test_a_lag_that_grows_while_nothing_is_taken_is_a_stall():
    learner, part = _learner(), None
    part = learner.consumer.part
    part.highwater, part.position.offset = 100, 100
    learner._watch({"t-0": [1, 2, 3]})          # read to the end
    for highwater in (150, 200):                # messages arrive, polls return nothing
        part.highwater = highwater
        learner._watch({})
    assert learner.health.behind == 100 and learner.health.stalled_since is not None
    learner.health.stalled_since -= 11   # (the seconds shown: 11, or more if this test was paused)
    found = re.fullmatch(r"no progress for (\d+) s while 100 messages wait", *learner.health.problems())
    assert found and 11 <= int(found[1]) < 60, learner.health.problems()
    part.position.offset = 150                  # a poll takes 50 of them: progress
    learner._watch({"t-0": list(range(50))})
    assert learner.health.problems() == [] and learner.health.behind == 50


def test_learning_paused_over_http_is_no_stall():
    learner = _learner()
    learner.consumer.part.highwater = 100
    learner._watch({})
    learner._watch({})
    learner.health.stalled_since = time.monotonic() - 60
    learner.health.held()
    assert learner.health.problems() == []


def test_healthz_asks_the_client_itself_while_the_loop_is_blocked_in_a_step():
    """A loop blocked in a step (a flush, a snapshot) waiting for the hung broker does not poll;
    /healthz asks the client's connections (the health's probe) and says so all the same."""
    learner = _learner()
    learner._watch({})
    learner.health.probe = lambda: broker_contact(learner.consumer)
    learner.consumer.hang(ago=7.0)            # no _watch since: the loop is blocked
    reasons = learner.health.problems()
    found = re.match(r"broker unreachable for (\d+) s \(broker not answering", reasons[0])
    assert len(reasons) == 1 and found and 7 <= int(found[1]) < 60, reasons
    learner.health.probe = None               # a broken variant: judged by the loop alone
    assert learner.health.problems() == []
