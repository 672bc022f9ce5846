"""Fleet snapshots in a Kafka topic: the full model, the input offsets it covers and its position in
the model topic, so that a new member or serving replica replays only what came after.

Where they live: ``MODEL_TOPIC.snapshots``, one partition, next to the model topic, so that a
replica on any machine needs nothing but the broker. A snapshot is zlib-compressed parts cut into
chunks of ``CHUNK`` bytes (under every broker's default message limit), then one manifest message
naming the chunks' offsets, the SHA-256 of the whole and the fleet state (``FleetState``) the model
is exact for. A writer that dies mid-way leaves chunks without a manifest, which readers ignore;
the newest manifest whose chunks verify wins. Old snapshots go with the topic's retention (keep
it longer than two snapshot intervals); the model topic must keep at least what came after the
newest snapshot.

Layout of the compressed body: u32 header length | header JSON {"parts": [[name, length], …]} |
the parts' bytes in order.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import uuid
import zlib
from dataclasses import dataclass

HEADER = "sketchrec.snapshot"
CHUNK = 900_000
_WINDOW = 256   # messages read per step when looking back for the newest manifest


@dataclass
class Snapshot:
    """A loaded snapshot: its parts (the recommender's and operator state) and its meta
    (``fleet``: the FleetState as a dict; ``model_class``; ``ratings_learned``; ``written_at``)."""

    parts: dict[str, bytes]
    meta: dict
    offset: int   # of its manifest in the snapshots topic


def snapshot_topic(model_topic: str) -> str:
    return f"{model_topic}.snapshots"


def pack(parts: dict[str, bytes]) -> bytes:
    """Parts as one compressed body (see the module docstring).

    >>> unpack(pack({"a": b"xy", "b": b""}))
    {'a': b'xy', 'b': b''}
    """
    header = json.dumps({"parts": [[name, len(blob)] for name, blob in parts.items()]}).encode()
    return zlib.compress(struct.pack("<I", len(header)) + header + b"".join(parts.values()), 1)


def unpack(body: bytes) -> dict[str, bytes]:
    raw = zlib.decompress(body)
    (n,) = struct.unpack_from("<I", raw)
    at, parts = 4 + n, {}
    for name, length in json.loads(raw[4:4 + n])["parts"]:
        parts[name] = raw[at:at + length]
        at += length
    return parts


def write(producer, topic: str, parts: dict[str, bytes], meta: dict, timeout: float = 60.0) -> int:
    """Publish one snapshot (chunks, then the manifest); the manifest's offset once acknowledged."""
    body = pack(parts)
    sid = uuid.uuid4().hex
    futures = [producer.send(topic, key=sid.encode(), value=body[at:at + CHUNK], partition=0,
                             headers=[(HEADER, json.dumps({"id": sid, "chunk": n}).encode())])
               for n, at in enumerate(range(0, len(body), CHUNK))]
    offsets = [f.get(timeout=timeout).offset for f in futures]
    manifest = {"id": sid, "manifest": True, "chunks": offsets,
                "sha256": hashlib.sha256(body).hexdigest(), "meta": {**meta, "written_at": time.time()}}
    future = producer.send(topic, key=sid.encode(), value=b"", partition=0,
                           headers=[(HEADER, json.dumps(manifest).encode())])
    return future.get(timeout=timeout).offset


def newest(bootstrap: str, topic: str, timeout: float = 30.0, check=None) -> Snapshot | None:
    """The newest snapshot whose chunks verify (SHA-256 of the whole, so Kafka's per-batch CRC,
    slow in Python, is not checked), or None when the topic holds none. ``check(meta)``, if
    given, sees each manifest's meta before its chunks are read, and what it raises propagates:
    a snapshot refused is never loaded (a replica that cannot be made exact from the newest
    snapshot learns so from its manifest, not from a whole model read again at every retry)."""
    from kafka import KafkaConsumer, TopicPartition
    from sketchrec.stream.kafka.consumer import kafka_config
    consumer = KafkaConsumer(**kafka_config(bootstrap), enable_auto_commit=False, check_crcs=False,
                             max_partition_fetch_bytes=4 << 20, fetch_max_bytes=64 << 20)
    try:
        if not consumer.partitions_for_topic(topic):
            return None
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        start = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        while end > start:  # look back window by window, newest manifest first
            lo = max(start, end - _WINDOW)
            manifests = [(o, h) for o, h, _ in _read(consumer, tp, lo, end, timeout) if h.get("manifest")]
            for offset, manifest in reversed(manifests):
                if check is not None:
                    check(manifest["meta"])
                snap = _load(consumer, tp, offset, manifest, timeout)
                if snap is not None:
                    return _first_empty(consumer, tp, start, snap, timeout)
            end = lo
        return None
    finally:
        consumer.close(autocommit=False)


def _first_empty(consumer, tp, start: int, snap: Snapshot, timeout: float) -> Snapshot:
    """``snap``, or when it is a fleet's first (model position 0: the empty model) the first such
    snapshot in the topic. Members starting at once each write one; the empty models are equal,
    but a private model's id key is drawn by its writer, and every replica must key ids alike."""
    if (snap.meta.get("fleet") or {}).get("position") != 0:
        return snap
    for offset, manifest, _ in _read(consumer, tp, start, snap.offset, timeout):
        if manifest.get("manifest") and (manifest["meta"].get("fleet") or {}).get("position") == 0:
            first = _load(consumer, tp, offset, manifest, timeout)
            if first is not None:
                return first
    return snap


def _read(consumer, tp, lo: int, hi: int, timeout: float, values: bool = False) -> list:
    """(offset, header, value if ``values``) of the messages in [lo, hi). A read that gets no
    message for ``timeout`` seconds raises TimeoutError: a part of the window taken for the whole
    would miss its newest manifest (its last message), and an older snapshot, or none, would be
    taken for the newest (a fleet would be handed a new empty first snapshot)."""
    consumer.seek(tp, lo)
    out, last = [], time.monotonic()
    while lo < hi:
        if time.monotonic() - last > timeout:
            raise TimeoutError(f"the snapshot topic {tp.topic} could not be read from offset {lo} "
                               f"to {hi}: no message for {timeout:g} s (is the broker answering?)")
        for msg in consumer.poll(timeout_ms=500).get(tp, []):
            if msg.offset >= hi:
                return out
            header = dict(msg.headers or []).get(HEADER)
            if header is not None:
                out.append((msg.offset, json.loads(header), msg.value if values else None))
            lo, last = msg.offset + 1, time.monotonic()
    return out


def _load(consumer, tp, offset: int, manifest: dict, timeout: float) -> Snapshot | None:
    chunks = manifest["chunks"]
    if not chunks or min(chunks) < consumer.beginning_offsets([tp])[tp]:
        return None   # none, or some deleted by retention: an older snapshot is not whole either
    wanted = set(chunks)
    got = {o: v for o, h, v in _read(consumer, tp, min(chunks), max(chunks) + 1, timeout, values=True)
           if o in wanted and h.get("id") == manifest["id"]}
    if len(got) != len(chunks):
        return None
    body = b"".join(got[o] for o in chunks)
    if hashlib.sha256(body).hexdigest() != manifest["sha256"]:
        return None
    return Snapshot(unpack(body), manifest["meta"], offset)
