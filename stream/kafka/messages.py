"""Rating messages on a topic: CSV or JSON, one rating or a batch, validated with named reasons.

Accepted message values (UTF-8):
- CSV, one rating: ``user,item,rating,timestamp`` (timestamp optional)
- CSV, batched: several such lines separated by newlines
- JSON, one rating: ``{"user": .., "item": .., "rating": .., "timestamp": ..}``
- JSON, batched: a list of such objects

A message that cannot be decoded at all is rejected whole; in a batch, each bad rating is rejected
on its own and the good ones are kept. Every rejection carries a short reason, which is what the
dead-letter topic and the counters record. ``parse_message`` never raises: JSON nested too deep,
and any error nobody foresaw, is a rejection with its own reason (a poison message must never
stop the consumer, or stop it again on every restart).

>>> parse_message(b'{"user": 18446744073709551616, "item": 1, "rating": 4}').ratings
[('18446744073709551616', 1, 4.0, 0)]
>>> parse_message(b"[" * 5000 + b"]" * 5000).rejected[0][1]
'JSON nested too deep'
>>> parsed = parse_message(b'[{"user": "\\\\ud800", "item": 1, "rating": 3}, {"user": 2, "item": 1, "rating": 3}]')
>>> parsed.ratings, parsed.rejected[0][:2]
([(2, 1, 3.0, 0)], (0, 'id not valid Unicode (lone surrogate)'))
>>> encode_batch([("a,9", 1, 4.0, 0)])  # an id a CSV line cannot hold goes as JSON
b'[{"user": "a,9", "item": 1, "rating": 4.0, "timestamp": 0}]'
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from sketchrec.data import MAX_ID_LENGTH, parse_line
from sketchrec.sketches.hashing import key_of

MAX_MESSAGE_BYTES = 8 << 20
_INT64 = range(-(1 << 63), 1 << 63)
_CSV_UNSAFE = (",", "\n", "\r")


@dataclass
class Parsed:
    """The ratings a message held, and its rejected parts as (index in batch, reason, text)."""

    ratings: list[tuple] = field(default_factory=list)  # (user, item, rating, timestamp)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)


def _json_id(value, what: str):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"bad {what} id type")
    text = str(value)
    if not text.strip():
        raise ValueError("empty id")
    if len(text) > MAX_ID_LENGTH:
        raise ValueError("oversized id")
    # an integer id wider than int64 is kept as its text, as a CSV line's long digit id is
    return text if isinstance(value, int) and value not in _INT64 else value


def _check_id(value) -> None:
    """An id must be text the whole system can carry (UTF-8: dead letters, /recommend answers,
    checkpoints) and one the learner can hash: checked here, per rating, so that an id that fails
    is that rating's rejection and never an error in the learner's batch (which would stop
    learning on every restart)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("id not valid Unicode (lone surrogate)") from None
    try:
        key_of(value)
    except Exception as exc:  # noqa: BLE001 - whatever the hashing refuses
        raise ValueError(f"unhashable id ({type(exc).__name__})") from None


def _json_rating(obj) -> tuple:
    if not isinstance(obj, dict):
        raise ValueError("not a rating object")
    missing = [k for k in ("user", "item", "rating") if k not in obj]
    if missing:
        raise ValueError("missing fields")
    user, item = _json_id(obj["user"], "user"), _json_id(obj["item"], "item")
    rating = obj["rating"]
    if isinstance(rating, bool) or not isinstance(rating, (int, float, str)):
        raise ValueError("non-numeric rating")
    try:
        rating = float(rating)
    except ValueError:
        raise ValueError("non-numeric rating") from None
    if not math.isfinite(rating):
        raise ValueError("non-finite rating")
    stamp = obj.get("timestamp", 0)
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        raise ValueError("bad timestamp")
    return user, item, rating, int(stamp)


def parse_message(value: bytes | None, rating_range: tuple[float, float] | None = None) -> Parsed:
    """All ratings in one message value; see the module docstring for the forms. Never raises."""
    try:
        return _parse(value, rating_range)
    except Exception as exc:  # noqa: BLE001 - a message must never stop the consumer
        out = Parsed()
        out.rejected.append((0, f"unparseable message ({type(exc).__name__})", _preview(value)))
        return out


def _preview(value) -> str:
    try:
        return bytes(value[:120]).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        return ""


def _parse(value: bytes | None, rating_range: tuple[float, float] | None) -> Parsed:
    out = Parsed()
    if value is None:
        out.rejected.append((0, "empty message", ""))
        return out
    if len(value) > MAX_MESSAGE_BYTES:
        out.rejected.append((0, "oversized message", ""))
        return out
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        out.rejected.append((0, "not UTF-8", value[:120].decode("utf-8", "replace")))
        return out
    stripped = text.strip()
    if not stripped:
        out.rejected.append((0, "empty message", ""))
        return out
    if stripped[0] in "[{":
        try:
            doc = json.loads(stripped)
        except ValueError:
            out.rejected.append((0, "bad JSON", stripped[:120]))
            return out
        except RecursionError:
            out.rejected.append((0, "JSON nested too deep", stripped[:120]))
            return out
        items = doc if isinstance(doc, list) else [doc]
        for n, obj in enumerate(items):
            _keep(out, n, lambda: _json_rating(obj), _json_preview(obj), rating_range)
    else:
        for n, line in enumerate(stripped.splitlines()):
            _keep(out, n, lambda: parse_line(line, ","), line[:120], rating_range)
    return out


def _json_preview(obj) -> str:
    try:
        return json.dumps(obj)[:120]
    except (RecursionError, ValueError):
        return repr(obj)[:120] if not isinstance(obj, (list, dict)) else type(obj).__name__


def _keep(out: Parsed, n: int, parse, text: str, rating_range) -> None:
    try:
        rating = parse()
        _check_id(rating[0])
        _check_id(rating[1])
    except ValueError as exc:
        out.rejected.append((n, str(exc), text))
        return
    except Exception as exc:  # noqa: BLE001 - one rating's fault: the batch's others are kept
        out.rejected.append((n, f"unparseable rating ({type(exc).__name__})", text))
        return
    if rating_range is not None and not rating_range[0] <= rating[2] <= rating_range[1]:
        out.rejected.append((n, "rating out of range", text))
        return
    out.ratings.append(rating)


def dead_letter(topic: str, partition: int, offset: int, index: int, reason: str, text: str,
                raw: bytes | None) -> bytes:
    """The dead-letter record: where the message was, why it was set aside, and what it held."""
    return json.dumps({"topic": topic, "partition": partition, "offset": offset, "index": index,
                       "reason": reason, "text": text,
                       "value_hex": raw.hex() if raw is not None and len(raw) <= 4096 else None}).encode()


def encode_batch(rows: list[tuple]) -> bytes:
    """CSV lines for a batch of (user, item, rating, timestamp) — the batched message form; a JSON
    list when an id holds a comma or a line break (in CSV its second line would be a rating of
    another user)."""
    if any(isinstance(x, str) and any(c in x for c in _CSV_UNSAFE) for u, i, _, _ in rows for x in (u, i)):
        return json.dumps([{"user": u, "item": i, "rating": float(r), "timestamp": int(t)}
                           for u, i, r, t in rows]).encode()
    return "\n".join(f"{u},{i},{r:g},{t}" for u, i, r, t in rows).encode()


# --- the fast form -------------------------------------------------------------------------------
# Most topics carry only "digits,digits,rating[,digits]" lines; parsing them one Python string at a
# time was most of a consumer's cost past kafka-python's own. This compiled pass takes a
# poll's values at once and accepts only a strict subset of what parse_message accepts, where both
# give the same ratings bit for bit; any other message (JSON, text ids, signs, exponents, blank
# lines, out-of-range ratings, ...) is left to parse_message, with its named reasons.
_FAST_DIGITS = 15   # rating digits: the mantissa m < 2**53, so m / 10**k is float()'s rounding
_POW10 = np.array([10.0 ** k for k in range(_FAST_DIGITS + 1)])


def parse_fast(values: list, rating_range: tuple[float, float] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, ratings, counts) of messages in the fast form, in order: ``counts[j]`` is
    how many ratings message j gave, -1 where it is not in the fast form (parse it with
    ``parse_message``; it gave none here). Ids are int64 (an all-digit id of at most 18 digits is
    an int, as in ``sketchrec.data``); timestamps are checked, not kept.

    >>> users, items, ratings, counts = parse_fast([b"1,2,4.5,99", b"x,2,3", b"7,8,5\\n9,10,0.5,"])
    >>> users.tolist(), items.tolist(), ratings.tolist(), counts.tolist()
    ([1, 7, 9], [2, 8, 10], [4.5, 5.0, 0.5], [1, -1, 2])
    """
    counts = np.full(len(values), -1, np.int64)
    if None in values:   # a message without a value (a tombstone) is empty: not in the fast form
        values = [b"" if v is None else v for v in values]
    blob = b"\n".join(values)
    ends = np.cumsum(np.fromiter((len(v) + 1 for v in values), np.int64, len(values))) - 1
    lo, hi = rating_range if rating_range is not None else (-np.inf, np.inf)
    n = blob.count(b"\n") + 1
    users, items, ratings = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    got = _parse_fast(np.frombuffer(blob, np.uint8), ends, float(lo), float(hi), MAX_MESSAGE_BYTES,
                      _POW10, users, items, ratings, counts)
    return users[:got], items[:got], ratings[:got], counts


@njit(cache=True, nogil=True)
def _digits(buf, pos, end, most):
    """(value, position after) of 1..``most`` ASCII digits at ``pos``; value -1 if none/too many."""
    value, start = 0, pos
    while pos < end and 48 <= buf[pos] <= 57:
        if pos - start == most:
            return -1, pos
        value = value * 10 + (buf[pos] - 48)
        pos += 1
    return (value if pos > start else -1), pos


@njit(cache=True, nogil=True)
def _fast_line(buf, pos, end, lo, hi, pow10, users, items, ratings, at):
    """One line at ``pos``: its end (before the newline), or -1 if it is not in the fast form."""
    user, pos = _digits(buf, pos, end, 18)
    if user < 0 or pos >= end or buf[pos] != 44:       # ','
        return -1
    item, pos = _digits(buf, pos + 1, end, 18)
    if item < 0 or pos >= end or buf[pos] != 44:
        return -1
    pos += 1
    mantissa, digits, scale, dot = 0, 0, 0, False
    while pos < end:
        c = buf[pos]
        if 48 <= c <= 57:
            mantissa, digits = mantissa * 10 + (c - 48), digits + 1
            scale += 1 if dot else 0
        elif c == 46 and not dot:                       # '.'
            dot = True
        else:
            break
        pos += 1
    if digits == 0 or digits > _FAST_DIGITS:
        return -1
    rating = mantissa / pow10[scale]
    if not lo <= rating <= hi:
        return -1                                       # parse_message names the reason
    if pos < end and buf[pos] == 44:                    # an optional timestamp (empty: 0)
        pos += 1
        if pos < end and buf[pos] != 10 and buf[pos] != 13:
            stamp, pos = _digits(buf, pos, end, 18)
            if stamp < 0:
                return -1
    if pos < end and buf[pos] == 13:                    # '\r\n'
        pos += 1
        if pos >= end or buf[pos] != 10:
            return -1
    if pos < end and buf[pos] != 10:
        return -1
    users[at], items[at], ratings[at] = user, item, rating
    return pos


@njit(cache=True, nogil=True)
def _parse_fast(buf, ends, lo, hi, max_bytes, pow10, users, items, ratings, counts):
    """parse_fast's pass over the joined values (message j ends at ends[j]); ratings written."""
    at, start = 0, 0
    for j in range(ends.shape[0]):
        end = ends[j]
        while end > start and (buf[end - 1] == 10 or buf[end - 1] == 13):
            end -= 1                                    # trailing line breaks (parse strips them)
        ok = start < end and ends[j] - start <= max_bytes
        first, pos = at, start
        while ok:
            pos = _fast_line(buf, pos, end, lo, hi, pow10, users, items, ratings, at)
            if pos < 0:
                ok = False
                break
            at += 1
            if pos >= end:
                break
            pos += 1                                    # past '\n': a line must follow
            if pos >= end or not 48 <= buf[pos] <= 57:
                ok = False
        if ok:
            counts[j] = at - first
        else:
            at = first                                  # its ratings are parse_message's to give
        start = ends[j] + 1
    return at
