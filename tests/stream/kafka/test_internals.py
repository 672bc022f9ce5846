"""kafka-python's internals (reached from stream/kafka/internals.py alone: tests/test_versions.py)
are read only on the versions they were checked against: on another, each feature says so in one
line and takes the public path (the library's own record reader, the broker counted as answering,
no topic id), never a result read from internals that may have changed."""

import logging
from types import SimpleNamespace as NS

import pytest
from kafka.record.default_records import DefaultRecordBatch

from sketchrec.stream.kafka import contact, fast_records, internals


def _stalled():
    """A consumer whose one connection has had a request unanswered for 5 s."""
    conn = NS(connected=True, in_flight_requests=[(1, None, 90.0, 120.0, None)],
              transport=NS(last_read=89.0))
    part = NS(highwater=120, position=NS(offset=100))
    return NS(_client=NS(_manager=NS(_conns={0: conn}), cluster=NS(topic_id=lambda t: "id-1")),
              _subscription=NS(assignment={"t-0": part}))


def test_the_installed_kafka_python_is_a_checked_one_and_its_internals_are_read():
    assert internals.checked() and fast_records.partition_records_class() is not None
    consumer = _stalled()
    assert contact.broker_contact(consumer, now=95.0).answering is False
    assert contact.messages_behind(consumer) == 20 and internals.topic_id(consumer, "t") == "id-1"


def test_an_unchecked_version_takes_the_public_path_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(internals, "version", lambda: "3.9.0")
    monkeypatch.setattr(internals.GUARD, "said", set())
    consumer, uncompress = _stalled(), DefaultRecordBatch._maybe_uncompress
    with caplog.at_level(logging.WARNING, logger="sketchrec"):
        for _ in range(2):
            assert fast_records.partition_records_class() is None     # the library's reader
            assert fast_records.install(NS(_fetcher=object())) is False
            assert internals.wrap_uncompress(lambda batch, exc: None) is False
            assert internals.fetching_partition(consumer) is None
            assert contact.broker_contact(consumer, now=95.0).answering is True   # no false alarm
            assert contact.messages_behind(consumer) is None
            assert contact.track_stable_offsets(NS(_fetcher=NS(_parse_fetched_data=print))) is False
            assert internals.topic_id(consumer, "t") is None
    assert DefaultRecordBatch._maybe_uncompress is uncompress        # nothing wrapped
    lines = [r.getMessage() for r in caplog.records if "event=internals library=kafka-python" in r.getMessage()]
    assert len(lines) == 6 and len(set(lines)) == 6                 # one line per feature, once
    assert all("version=3.9.0 checked=3.0.x" in line and "fallback=" in line for line in lines)
    assert any("feature='compiled record reader'" in line for line in lines)


@pytest.mark.parametrize("installed, ok", [("3.0.0", True), ("3.0.12", True), ("3.1.0", False),
                                           ("2.0.6", False), ("3", False), ("", False)])
def test_only_checked_versions_pass_the_guard(installed, ok):
    assert internals.GUARD.checked(installed) is ok

