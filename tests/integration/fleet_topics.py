"""What a fleet's topics hold, read back for the fleet integration tests (``test_fleet.Fleet``): the
records for a timed-out wait's message, and the members' views checked against one reading."""

import json
import time


def model_record(fleet) -> str:
    """Each process's first lines, and the model topic's and snapshot topic's headers (offset,
    member, seq, covers, claims; a snapshot's position): what a replica that disagrees with the
    others read, for a timed-out wait's message (never part of an assertion)."""
    from kafka import KafkaConsumer, TopicPartition
    from sketchrec.stream.fleet.model_topic import decode_meta
    lines = [f"--- {p} (start):\n{fleet.logs[p].read_text()[:3000]}" for p in fleet.logs]
    for topic in (f"{fleet.topic}.model", f"{fleet.topic}.model.snapshots"):
        consumer = KafkaConsumer(bootstrap_servers=fleet.bootstrap, enable_auto_commit=False)
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end, lines = consumer.end_offsets([tp])[tp], lines + [f"--- {topic}:"]
            deadline = time.monotonic() + 30
            while consumer.position(tp) < end and time.monotonic() < deadline:
                for msg in consumer.poll(timeout_ms=2000).get(tp, []):
                    if topic.endswith(".model"):
                        meta = decode_meta(msg.headers) or {}
                        lines.append(f"{msg.offset} {meta.get('member')} #{meta.get('seq')} "
                                     f"covers={meta.get('covers')} claims={meta.get('claims')}")
                    elif b'"manifest"' in dict(msg.headers or []).get("sketchrec.snapshot", b""):
                        state = json.loads(dict(msg.headers)["sketchrec.snapshot"])["meta"]["fleet"]
                        lines.append(f"{msg.offset} snapshot " + json.dumps(
                            {k: state[k] for k in ("position", "covered", "owners", "seen")}))
        except Exception as exc:   # noqa: BLE001 - a record for the message only
            lines.append(f"({topic} not read: {exc})")
        finally:
            consumer.close(autocommit=False)
    return "\n" + "\n".join(lines)


def views_against_one_reading(fleet) -> tuple[int, list]:
    """Read the model topic once from its start as a replica does (``FleetState`` verdicts only,
    no deltas applied) and compare every header's view (``stream.fleet.views``) with that
    replica's digest at the view's position: (views compared, those differing)."""
    from kafka import KafkaConsumer, TopicPartition
    from sketchrec.stream.fleet.model_topic import FleetState, decode_meta
    consumer = KafkaConsumer(bootstrap_servers=fleet.bootstrap, enable_auto_commit=False)
    tp, state, checked, differing = TopicPartition(f"{fleet.topic}.model", 0), FleetState(), 0, []
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end, deadline = consumer.end_offsets([tp])[tp], time.monotonic() + 60
        while state.position < end and time.monotonic() < deadline:
            for msg in consumer.poll(timeout_ms=2000).get(tp, []):
                assert msg.offset == state.position   # one partition, read in order
                meta = decode_meta(msg.headers)
                if meta is None or state.duplicate(meta):
                    state.passed(msg.offset, "n")
                    continue
                if meta.get("view"):
                    checked += 1
                    if state.views.at(meta["view"][0]) != meta["view"]:
                        differing.append((msg.offset, meta["member"], meta["view"]))
                if state.accepts(meta):
                    state.settle(meta, msg.offset)
                else:
                    state.refuse(meta)
                    state.passed(msg.offset, "r")
    finally:
        consumer.close(autocommit=False)
    assert state.position == end
    return checked, differing
