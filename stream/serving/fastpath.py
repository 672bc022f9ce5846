"""The hot paths of /predict and /recommend: one ASGI layer in front of the FastAPI app.

A request that certainly passes FastAPI's validation and access control is answered here, by one
call into the recommender and one ``orjson`` encoding, without the framework's routing, dependency
solving, thread-pool hop and response-model validation (many times the model's own time per answer).
Everything else (a missing, blank, long or repeated parameter, a k that is not a plain number in
range, a credential that does not grant access, a model still warming up, any other route) goes
on to the app, which gives the same answers and errors as before: the fast path only ever answers
what the app would have answered with 200, and answers it with the same JSON.

``ServingApp`` (the FastAPI app's class) asks the fast path first, before the app's middleware
stack, and times every request into the ``sketchrec_request_seconds`` histogram, labelled with the
route's path (no ``BaseHTTPMiddleware``: Starlette's costs more per request than the model).

>>> parse_query(b"user=7&k=10&token=")
{'user': '7', 'k': '10', 'token': ''}
>>> parse_query(b"user=7&user=8") is None        # repeated: the app decides
True
>>> [valid_id(v) for v in ("5", " x ", "   ", "\\t", "x" * 300, "é")]
[True, True, False, False, False, False]
>>> [plain_k(v) for v in ("10", "1000", "1001", "0", "010", "+5", "1.0")]
[10, 1000, None, None, None, None, None]
"""

from __future__ import annotations

import re
import time
from typing import Callable
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI

from sketchrec.stream.serving.ids import json_id
from sketchrec.stream.serving.headers import SECURITY_HEADERS, secured

MAX_ID = 256
MAX_K = 1000

_VISIBLE = re.compile(r"[!-~]")         # an ASCII visible character: \S for every regex engine
_PLAIN_K = re.compile(r"[1-9][0-9]{0,3}")
_JSON = [(b"content-type", b"application/json")] + SECURITY_HEADERS


def parse_query(raw: bytes) -> dict[str, str] | None:
    """The query string as Starlette reads it, or None when a parameter is repeated."""
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    params = dict(pairs)
    return params if len(params) == len(pairs) else None


def valid_id(value: str | None) -> bool:
    """An id the app certainly accepts: 1..MAX_ID characters with an ASCII visible one (ids
    the app may still accept, e.g. only non-ASCII letters, are left to it)."""
    return value is not None and len(value) <= MAX_ID and _VISIBLE.search(value) is not None


def plain_k(value: str | None) -> int | None:
    """k written as a plain number in 1..MAX_K (the default 10 when absent), else None."""
    if value is None:
        return 10
    return int(value) if _PLAIN_K.fullmatch(value) and int(value) <= MAX_K else None


def public_ranking(items: list[tuple[object, float]]) -> list[tuple[object, float]]:
    """The ranking a user the model has not seen gets: the items in order, each scored by its
    position alone (1, 1/2, 1/3, ...), never by the rating counts that ordered them.

    >>> public_ranking([("film", 312.0), ("book", 7.0)])
    [('film', 1.0), ('book', 0.5)]
    """
    return [(item, 1.0 / (rank + 1)) for rank, (item, _) in enumerate(items)]


def _header(scope: dict, name: bytes) -> str | None | bool:
    """The one value of a request header, None when absent, False when repeated."""
    found = [v for k, v in scope["headers"] if k == name]
    return found[0].decode("latin-1") if len(found) == 1 else (None if not found else False)


class FastQueries:
    """Answers ``GET /predict`` and ``GET /recommend`` that certainly succeed (see module docstring).

    ``service_ref`` gives the current service (a read replica swaps it on reload), ``allowed(user,
    authorization, token)`` is the app's access control (True: may read that user's answers)."""

    def __init__(self, service_ref: Callable, allowed: Callable[[str, str | None, str | None], bool],
                 tokens_on: bool):
        self.service_ref, self.allowed, self.tokens_on = service_ref, allowed, tokens_on
        self.titled = False   # /recommend answers carry titles (--items): the app answers them

    def __call__(self, scope: dict) -> bytes | None:
        route = scope["path"]
        if route not in ("/predict", "/recommend") or scope["method"] != "GET":
            return None
        params = parse_query(scope["query_string"])
        service = self.service_ref()
        if params is None or not service.health.ready:
            return None
        user, token = params.get("user"), params.get("token")
        if not valid_id(user) or (token is not None and len(token) > MAX_ID):
            return None
        authorization = _header(scope, b"authorization") if self.tokens_on else None
        if authorization is False or not self.allowed(user, authorization, token):
            return None
        if route == "/predict":
            item = params.get("item")
            if not valid_id(item):
                return None
            rating = service.recommender.predict(user, item)
            return orjson.dumps({"user": json_id(user), "item": json_id(item), "rating": rating})
        k = plain_k(params.get("k"))
        if k is None or self.titled:
            return None
        items, source = service.recommender.recommend(user, k)
        if source == "popular":
            items = public_ranking(items)
        if any(type(item) not in (str, int) for item, _ in items):
            return None  # an id the response model would coerce: the app answers
        return orjson.dumps({"user": json_id(user),
                             "items": [{"item": json_id(i), "score": s} for i, s in items],
                             "source": "ranked" if self.tokens_on else source})


class ServingApp(FastAPI):
    """The FastAPI app with ``fast`` (a ``FastQueries``) answering what it can before the app's
    own middleware stack (bytes: a 200 JSON body); an exception there leaves the request to the
    app, which answers it (or its 500) as before. Every request's latency goes to ``latency`` (a
    prometheus Histogram with an ``endpoint`` label: the route's path). Every answer carries the
    security headers (``secured``)."""

    fast: FastQueries | None = None
    latency = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.latency is None:
            await super().__call__(scope, receive, secured(scope, send))
            return
        t0 = time.perf_counter()
        try:
            body = self.fast(scope) if self.fast is not None else None
        except Exception:  # noqa: BLE001 - the app answers it, with its own error handling
            body = None
        if body is not None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": _JSON + [(b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
            self.latency.labels(scope["path"]).observe(time.perf_counter() - t0)
            return
        try:
            await super().__call__(scope, receive, secured(scope, send))
        finally:
            route = scope.get("route")
            self.latency.labels(getattr(route, "path", "unmatched")).observe(time.perf_counter() - t0)
