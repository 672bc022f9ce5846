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
>>> encode_batch([("a,9", 1, 4.0, 0)])  # an id a CSV line cannot hold goes as JSON
b'[{"user": "a,9", "item": 1, "rating": 4.0, "timestamp": 0}]'
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from sketchrec.data import MAX_ID_LENGTH, parse_line

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
    except ValueError as exc:
        out.rejected.append((n, str(exc), text))
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
