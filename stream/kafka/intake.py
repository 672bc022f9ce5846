"""A poll's messages turned into the columns a learner takes, every rejection named and set aside.

This is the one message path of the single consumer (``kafka.consumer.KafkaLearner``) and of every
fleet member (``fleet.member.FleetLearner`` learns through the same ``learn_poll``). Its promise: no
message, and no rating inside a batch message, can raise out of here. Whatever goes wrong while
one message is decoded, parsed, its headers read or its ids checked against the hashing the
learner will apply is that message's (or that rating's) rejection, with a reason, and the rest of
the poll is learned. A poison message that crashed the learner would crash it again on every
restart (it is consumed again from the last checkpoint), so "set aside" is the only safe answer.

>>> import types
>>> from kafka import TopicPartition
>>> msgs = [types.SimpleNamespace(value=v, headers=None, offset=n)
...         for n, v in enumerate([b"1,2,4", b'{"user": "\\\\ud800", "item": 1, "rating": 3}'])]
>>> poll = read_poll({TopicPartition("t", 0): msgs}, (0.5, 5.0), lambda headers, n: None)
>>> poll.users.tolist(), dict(poll.skipped), [r.reason for r in poll.rejected]
([1], {'id not valid Unicode (lone surrogate)': 1}, ['id not valid Unicode (lone surrogate)'])
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sketchrec.stream.kafka.messages import Parsed, parse_fast, parse_message


@dataclass
class Rejected:
    """One set-aside message or rating: where it was (``tp``, the message), its index in a batch
    message, why, and a preview of its text (what the dead letter records)."""

    tp: object
    message: object
    index: int
    reason: str
    text: str


@dataclass
class Poll:
    """A poll's learnable ratings in order, what was set aside, the next offset per partition."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    skipped: Counter = field(default_factory=Counter)
    rejected: list[Rejected] = field(default_factory=list)
    offsets: dict = field(default_factory=dict)   # partition -> offset after its last message
    fast: int = 0   # ratings read in the fast form (no headers: their origin is counted at once)


def read_poll(records: dict, rating_range, record_origin: Callable) -> Poll:
    """``records`` (partition -> messages, kafka-python's poll) as one ``Poll``. ``record_origin
    (headers, n)`` counts where a message's ratings came from (it may raise on a poison header:
    that message is then set aside). Never raises on a message's content."""
    parts: list[tuple] = []   # (users, items, ratings): arrays (fast form) or tuples, in order
    poll = Poll(*_EMPTY)
    for tp, messages in records.items():
        poll.fast += _read_partition(tp, messages, rating_range, record_origin, parts, poll)
        poll.offsets[tp.partition] = messages[-1].offset + 1
    poll.users, poll.items, poll.ratings = columns(parts)
    return poll


def _read_partition(tp, messages: list, rating_range, record_origin, parts: list, poll: Poll) -> int:
    """Append one partition's ratings to ``parts`` in order, and its rejections to ``poll``; the
    number read in the fast form (``messages.parse_fast``: one compiled pass over plain CSV;
    messages with headers carry an origin to count and go one by one)."""
    if any(msg.headers for msg in messages):
        counts = np.full(len(messages), -1)
    else:
        *cols, counts = parse_fast([msg.value for msg in messages], rating_range)
        if counts.min() >= 0:   # the usual case: all of them
            parts.append(tuple(cols))
            return len(cols[2])
    starts = np.cumsum(np.maximum(counts, 0)) - np.maximum(counts, 0)
    fast = 0
    for msg, at, n in zip(messages, starts.tolist(), counts.tolist()):
        if n >= 0:
            parts.append(tuple(col[at:at + n] for col in cols))
            fast += n
            continue
        parsed = read_message(msg, rating_range, record_origin)
        for index, reason, text in parsed.rejected:
            poll.skipped[reason] += 1
            poll.rejected.append(Rejected(tp, msg, index, reason, text))
        if parsed.ratings:
            parts.append(tuple(zip(*parsed.ratings))[:3])
    return fast


def read_message(msg, rating_range, record_origin: Callable) -> Parsed:
    """One message's ratings (``messages.parse_message``, which checks each id against the
    hashing); a poison header, or any error nobody foresaw, is this message's rejection."""
    try:
        parsed = parse_message(msg.value, rating_range)
    except Exception as exc:  # noqa: BLE001 - parse_message never raises; this is the last net
        return Parsed(rejected=[(0, f"unparseable message ({type(exc).__name__})", "")])
    try:
        record_origin(msg.headers, len(parsed.ratings))
    except Exception as exc:  # noqa: BLE001 - a poison header is that message's fault only
        return Parsed(rejected=[(0, f"bad headers ({type(exc).__name__})", "")])
    return parsed


_EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))


def columns(parts: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """users, items, ratings of a poll's parts (fast-form arrays and parsed tuples, in order);
    ids as ``ids`` makes them (int64 unless some id is not an int)."""
    if not parts:
        return _EMPTY
    ratings = np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts])
    if all(isinstance(p[0], np.ndarray) for p in parts):
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), ratings
    both = [[v for p in parts for v in (p[n].tolist() if isinstance(p[n], np.ndarray) else p[n])]
            for n in (0, 1)]
    return ids(both[0]), ids(both[1]), ratings


def ids(values: list) -> np.ndarray:
    """Ids as one array: int64 when all are ints that fit, else their text (opaque ids)."""
    if all(type(v) is int for v in values):
        try:
            return np.asarray(values, dtype=np.int64)
        except OverflowError:  # wider than int64: ids are opaque text
            pass
    return np.asarray([str(v) for v in values], dtype=object)


# an error this large or larger is left out of the prequential sums: its square (1e200) leaves
# room for ~1e108 of them before the sum overflows to infinity
MAX_ERROR = 1e100


def finite_errors(predictions: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (prediction, truth) pairs whose error is below MAX_ERROR: one extreme rating (accepted
    with ``--rating-range none``) would otherwise make the prequential error sums infinite, and
    the reported RMSE null, for good.

    >>> finite_errors(np.array([4.0, 3.0]), np.array([1e300, 3.5]))
    (array([3.]), array([3.5]))
    """
    with np.errstate(over="ignore", invalid="ignore"):
        keep = np.abs(np.asarray(predictions) - np.asarray(truth)) < MAX_ERROR
    if keep.all():
        return predictions, truth
    return predictions[keep], truth[keep]
