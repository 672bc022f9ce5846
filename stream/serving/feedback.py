"""The endpoint's feedback and item routes: ``POST /ratings``, ``GET /similar``, and the titles
of ``--items`` on the answers that name items.

``POST /ratings`` takes JSON, one rating object or a list (``user``, ``item``, ``rating``,
optional ``timestamp``), read by the topic's own rules (``stream.feedback.read_posted``). The
service's feedback route takes the good ones (``LearningService.feedback``: produced to the topic
a ``consume`` service reads, or learned at once by a ``replay --serve`` one; a service built
without one learns directly, a read-only one refuses with the capability table's line). A batch
with bad records answers 422 naming each (index and reason, one line each) while its good records
are taken all the same; every bad one is counted in /stats ``skipped``. A credential is needed
wherever the per-user routes need one (every privacy mode, an address that is not loopback): the
token of every rating's user, or the backend (admin) token; in a privacy mode served without
per-user tokens, the backend token only.

``GET /similar?item=&k=`` ranks the catalogue's items by the cosine of their factors with the
item's (``model.similar``). Item factors are the model's cells: in a central-DP mode they are the
noised release (the ``recommendations`` surface of ``privacy.mode``), so the answer is released as
/recommend's scores are; there an item the catalogue does not hold is answered from its (noised)
cells too, so the route says nothing about whether anyone rated it. Non-private, such an item is
a 404.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sketchrec.stream.serving.ids import json_id
from sketchrec.privacy.access import UserTokens
from sketchrec.privacy.release import service_mode
from sketchrec.stream.feedback import (MAX_BODY, MAX_POSTED, DirectFeedback, FeedbackRefused,
                                       Refusal, read_posted)
from sketchrec.stream.serving.fastpath import MAX_ID, MAX_K


def feedback_of(service):
    """How ``service`` (a ``ServingSource``) takes posted ratings: the route it declares
    (``feedback``; a reader process declares its refusal); else a learning service learns them
    directly, and a read-only one refuses them."""
    if service.feedback is not None:
        return service.feedback
    if service.read_only:
        return Refusal("read-only")
    service.feedback = DirectFeedback(service)
    return service.feedback


def titled(titles, items: list[tuple[object, float]]) -> list[dict]:
    """(item, score) pairs as answered, with each item's title when ``titles`` names it."""
    if titles is None:
        return [{"item": json_id(i), "score": s} for i, s in items]
    return [{"item": json_id(i), "score": s, **({"title": t} if (t := titles.get(i)) else {})}
            for i, s in items]


def add_feedback_routes(app: FastAPI, tokens: UserTokens | None, is_admin: Callable[[str | None], bool],
                        bearer: Callable[[str | None], str]) -> None:
    """Add ``POST /ratings`` and ``GET /similar`` to ``app`` (its ``state.service`` answers)."""
    cred = dict(default=None, max_length=MAX_ID, description="the user's token (or use Authorization)")

    @app.post("/ratings", summary="Send ratings (one JSON object or a list): learned, or produced "
              "to the topic the service consumes")
    async def post_ratings(request: Request, token: str | None = Query(**cred),
                           authorization: str | None = Header(default=None)) -> JSONResponse:
        svc = app.state.service
        sink = feedback_of(svc)
        if isinstance(sink, Refusal):
            sink.take([])   # raises the table's line
        given = token or bearer(authorization)
        admin = is_admin(authorization)
        guarded = tokens is not None or service_mode(svc).private
        if guarded and not (given or admin):
            raise HTTPException(401, "sending ratings needs each user's token or the backend token",
                                {"WWW-Authenticate": "Bearer"})
        body = await request.body()
        if len(body) > MAX_BODY:
            raise HTTPException(413, f"at most {MAX_BODY} bytes per request; send the ratings in batches")
        relay = getattr(sink, "relay", None)
        if relay is not None:   # a reader process: the learner's route takes the request as it came
            status, answer = await run_in_threadpool(relay, body, token, authorization)
            return JSONResponse(answer, status_code=status)
        parsed = read_posted(body, sink.rating_range)
        if len(parsed.ratings) + len(parsed.rejected) > MAX_POSTED:
            raise HTTPException(413, f"at most {MAX_POSTED} ratings per request; send them in batches")
        if guarded and not admin and not all(tokens is not None and tokens.verify(r[0], given)
                                             for r in parsed.ratings):
            raise HTTPException(403, "the token does not grant access to every user of these ratings")
        if parsed.rejected:
            svc.record_skipped(Counter(reason for _, reason, _ in parsed.rejected))
        taken = await run_in_threadpool(sink.take, parsed.ratings) if parsed.ratings else {}
        answer = {"accepted": len(parsed.ratings), **taken,
                  "rejected": [{"index": n, "reason": reason} for n, reason, _ in parsed.rejected]}
        if not parsed.rejected:
            return JSONResponse(answer)
        answer["detail"] = (f"{len(parsed.rejected)} rejected, {len(parsed.ratings)} accepted: "
                            + "; ".join(f"#{n}: {reason}" for n, reason, _ in parsed.rejected[:20]))
        return JSONResponse(answer, status_code=422)

    @app.get("/similar", summary="The k items whose factors are closest to the item's (cosine)")
    def similar(item: str = Query(..., min_length=1, max_length=MAX_ID, pattern=r"\S"),
                k: int = Query(10, ge=1, le=MAX_K)) -> dict:
        svc = app.state.service
        if not svc.health.ready:
            raise HTTPException(503, "model not ready (warming up); retry shortly", {"Retry-After": "1"})
        recommender = svc.recommender
        model = recommender.model
        if not hasattr(model, "similar"):
            raise HTTPException(409, f"{type(model).__name__} has no item factors to compare; "
                                "serve a factor model (sketch, mix, dense)")
        snap = recommender.item_snapshot(wait=False)
        key = recommender.id_keys.key_of(item)
        held = bool(np.any(snap.keys == np.uint64(key)))
        if not held and not service_mode(svc).central:
            raise HTTPException(404, "no rating of this item was learned (it is not in the catalogue)")
        rows = [n for n, k2 in enumerate(snap.keys.tolist()) if k2 != key]
        try:
            ranked = model.similar(item, k, items=[snap.ids[n] for n in rows])
        except ValueError as exc:
            raise HTTPException(409, str(exc).splitlines()[0]) from None
        return {"item": json_id(item), **({"title": t} if (t := _title(app, item)) else {}),
                "items": titled(getattr(app.state, "titles", None), ranked)}

    @app.exception_handler(FeedbackRefused)
    async def refused(request: Request, exc: FeedbackRefused) -> JSONResponse:
        return JSONResponse({"detail": exc.line}, status_code=exc.status)


def _title(app: FastAPI, item) -> str | None:
    titles = getattr(app.state, "titles", None)
    return titles.get(item) if titles is not None else None
