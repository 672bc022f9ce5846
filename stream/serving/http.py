"""The live query endpoint (FastAPI): predictions, recommendations, privacy figures, stats and
Prometheus metrics, served while the model learns.

Admin endpoints (POST /checkpoint, /pause, /resume, GET /admin/privacy) need
``Authorization: Bearer <token>`` with the token given at start-up; without one they are disabled.
With access control on (``access``; by default in every privacy mode) /predict and /recommend
about user U answer only a caller holding U's token (``privacy.access.UserTokens.mint(U)``, sent as
``Authorization: Bearer <token>`` or ``?token=``) or the admin (backend) token: 401 without a
credential, 403 with a wrong one; and the answer's ``source`` is "ranked" for every user, so it
does not tell whether U is in the training data. In the central-DP modes /privacy and /stats show
no exact data statistic; the admin route serves them, labelled not covered (docs/privacy/surfaces.md).
Ids are opaque text: they are hashed, never parsed or evaluated ('5' and 5 are the same id); an
id must hold a non-blank character. /healthz answers 503 with its reasons while the model warms
up, while the broker has been unreachable too long, or when the last poll is too old
(``serving.health.Health``); /predict and /recommend answer 503 at once until the model is ready.
A service listening on an address that is not loopback turns access control on by default (the
admin token or user tokens are then needed for /predict and /recommend; ``--open`` turns it off),
and an unknown user's /recommend is the public ranking (positions, never the rating counts).
Every answer carries a Content-Security-Policy, X-Frame-Options DENY and Referrer-Policy
no-referrer (``fastpath.secured``); a path with a trailing slash is a JSON 404, not a redirect.
Every error is JSON, a 422 shows at most ``MAX_ECHO`` characters of a rejected input, and /stats
names the last checkpoint (name, seq, age), never its filesystem path.
"""

from __future__ import annotations

import secrets
from typing import Callable

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel

from sketchrec.privacy.access import UserTokens
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.privacy.release import access_control_default, release, service_mode
from sketchrec.privacy.report import operator_figures
from sketchrec.stream.serving.ids import json_id
from sketchrec.stream.serving.dashboard import dashboard_router
from sketchrec.stream.serving.fastpath import MAX_ID, MAX_K, FastQueries, ServingApp, public_ranking
from sketchrec.stream.serving.feedback import add_feedback_routes, titled
from sketchrec.stream.serving.source import ServingSource, require_source

MAX_ECHO = 80   # characters of a rejected input a 422 shows (never a 100 KB input back)
PRIVACY_FIELDS = ("epsilon", "delta", "privacy_unit", "mode", "proven_bound", "kld",
                  "audit_epsilon_lower_bound")


class Prediction(BaseModel):   # ids as stream.serving.ids.json_id gives them
    user: int | str
    item: int | str
    rating: float


class ScoredItem(BaseModel):
    item: str | int
    score: float
    title: str | None = None   # with --items: the item's title (left out when none)


class Recommendations(BaseModel):
    user: int | str
    items: list[ScoredItem]
    source: str


class _ServiceCollector:
    """Exports the service's counters at scrape time (no second copy of the figures to keep)."""

    def __init__(self, service_ref: Callable[[], ServingSource]):
        self.service_ref = service_ref

    def collect(self):
        service = self.service_ref()
        mode = service_mode(service)
        stats = release(mode, service.stats())   # the one release boundary (privacy.release)
        if "ratings_learned" in stats:
            learned = CounterMetricFamily("sketchrec_ratings_learned", "Ratings learned by the model")
            learned.add_metric([], stats["ratings_learned"])
            yield learned
            skipped = CounterMetricFamily("sketchrec_ratings_skipped", "Ratings set aside", labels=["reason"])
            for reason, count in stats["skipped"].items():
                skipped.add_metric([reason], count)
            yield skipped
        privacy = release(mode, service.privacy())
        for name, doc in (("kld", "Windowed KLD of seen vs unseen errors (eq. 4.15; heuristic)"),
                          ("kld_cumulative", "Cumulative KLD of seen vs unseen errors")):
            if privacy.get(name) is not None:
                gauge = GaugeMetricFamily(f"sketchrec_privacy_{name}", doc)
                gauge.add_metric([], privacy[name])
                yield gauge
        for name, key, doc in (("model_bytes", "model_bytes", "Bytes of model state"),
                               ("catalogue_items", "catalogue_items", "Items seen so far"),
                               ("uptime_seconds", "uptime_s", "Seconds since start")):
            if key not in stats:   # withheld in this privacy mode
                continue
            gauge = GaugeMetricFamily(f"sketchrec_{name}", doc)
            gauge.add_metric([], stats[key])
            yield gauge


def resolve_access(service: ServingSource, access) -> UserTokens | None:
    """``access``: "auto" (on in every privacy mode), True/False, or a ``UserTokens`` to use.
    A joint-DP model refuses False/None: its guarantee holds only with access control."""
    if service_mode(service) in (PrivacyMode.JOINT_RATING, PrivacyMode.JOINT_USER) and not access:
        raise ValueError("a joint-DP model is served with per-user access control only")
    if isinstance(access, UserTokens) or access is None or access is False:
        return access or None
    on = access is True or (access == "auto" and access_control_default(
        service.recommender.model, bool(service.origin.get("perturbed_on_device"))))
    return UserTokens.from_env() if on else None


def loopback(host: str | None) -> bool:
    """Whether ``host`` (an address to listen on) is reachable from this machine only.

    >>> [loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "localhost", "0.0.0.0", "", "10.0.0.5", "::")]
    [True, True, True, True, False, False, False, False]
    """
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False   # a name: it may resolve to any interface


def access_for(access, host: str | None):
    """``access`` as a listener on ``host`` needs it: "auto" becomes True (per-user routes need
    a credential) on an address that is not loopback; an explicit choice stays.

    >>> access_for("auto", "127.0.0.1"), access_for("auto", "0.0.0.0"), access_for(False, "0.0.0.0")
    ('auto', True, False)
    """
    return True if access == "auto" and host is not None and not loopback(host) else access


def bearer(authorization: str | None) -> str:
    """The credential of an ``Authorization: Bearer <token>`` header ('' for any other form).

    >>> bearer("Bearer abc"), bearer("bearer  abc "), bearer("abc"), bearer("Bearer   "), bearer(None)
    ('abc', 'abc', '', '', '')
    """
    scheme, _, value = (authorization or "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _short(value):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(text)} characters)"


async def _unprocessable(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, with each rejected input cut to ``MAX_ECHO`` characters."""
    errors = [{**err, "input": _short(err["input"])} if "input" in err else err for err in exc.errors()]
    errors = [{k: v for k, v in err.items() if k != "ctx"} | (
        {"ctx": {k: _short(v) for k, v in err["ctx"].items()}} if "ctx" in err else {}) for err in errors]
    return JSONResponse({"detail": errors}, status_code=422)


def create_app(service: ServingSource, admin_token: str | None = None, access="auto") -> FastAPI:
    """The endpoint over a service; admin endpoints need ``admin_token`` (None, empty or blank:
    disabled), sent as ``Authorization: Bearer <token>``, and ``access`` turns per-user access
    control on (see ``resolve_access``)."""
    require_source(service)   # what the app reads of it, and nothing else (stream.serving.source)
    admin_token = (admin_token or "").strip() or None  # an empty token must never match
    tokens = resolve_access(service, access)
    app = ServingApp(title="sketchrec", version="0.1.0", redirect_slashes=False,
                     description="Live queries to a recommender that keeps learning from a stream.")
    app.state.service = service
    app.state.user_tokens = tokens   # None: no per-user access control
    app.include_router(dashboard_router())  # the live page at / (polls /stats and /privacy)
    app.state.admin = admin_token is not None
    app.add_exception_handler(RequestValidationError, _unprocessable)
    registry = CollectorRegistry()
    registry.register(_ServiceCollector(lambda: app.state.service))
    latency = Histogram("sketchrec_request_seconds", "Request latency", ["endpoint"], registry=registry,
                        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))

    def is_admin(authorization: str | None) -> bool:
        given = bearer(authorization)
        return admin_token is not None and bool(given) and secrets.compare_digest(
            given.encode(), admin_token.encode())

    def require_admin_read(authorization: str | None = Header(default=None)) -> ServingSource:
        if admin_token is None:
            raise HTTPException(403, "admin endpoints are disabled: no admin token was configured")
        if not is_admin(authorization):
            raise HTTPException(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        return app.state.service

    def require_admin(authorization: str | None = Header(default=None)) -> ServingSource:
        svc = require_admin_read(authorization)
        if svc.read_only:
            raise HTTPException(409, "this service is read-only (a checkpoint, or a model trained in one batch)")
        return svc

    def allowed(user: str, authorization: str | None, token: str | None) -> bool:
        """Access control: U's token or the backend (admin) token."""
        if tokens is None or is_admin(authorization):
            return True
        given = token or bearer(authorization)
        return bool(given) and tokens.verify(user, given)

    def authorise(user: str, authorization: str | None, token: str | None) -> None:
        """Access control, else 401 / 403; 503 until the model is ready."""
        if not app.state.service.health.ready:  # answer now, not after the kernels compile
            raise HTTPException(503, "model not ready (warming up); retry shortly", {"Retry-After": "1"})
        if allowed(user, authorization, token):
            return
        if not (token or bearer(authorization)):
            raise HTTPException(401, "this endpoint needs the user's token or the backend token",
                                {"WWW-Authenticate": "Bearer"})
        raise HTTPException(403, "the token does not grant access to this user")

    # the hot paths, answered before the framework when they certainly succeed (serving.fastpath)
    app.fast = FastQueries(lambda: app.state.service, allowed, tokens is not None)
    app.latency = latency
    app.state.titles = getattr(service, "titles", None)   # --items: titles on the answers
    app.fast.titled = app.state.titles is not None
    add_feedback_routes(app, tokens, is_admin, bearer)   # POST /ratings, GET /similar

    # an id must hold a non-blank character, as in the stream (pattern: a search, not a full match)
    ids = dict(min_length=1, max_length=MAX_ID, pattern=r"\S")
    cred = dict(default=None, max_length=MAX_ID, description="the user's token (or use Authorization)")

    @app.get("/predict", response_model=Prediction, summary="Predicted rating of one item by one user")
    def predict(user: str = Query(..., **ids), item: str = Query(..., **ids),
                token: str | None = Query(**cred),
                authorization: str | None = Header(default=None)) -> Prediction:
        authorise(user, authorization, token)
        return Prediction(user=json_id(user), item=json_id(item),
                          rating=app.state.service.recommender.predict(user, item))

    @app.get("/recommend", response_model=Recommendations, response_model_exclude_none=True,
             summary="Top-k items the user has not rated, best first")
    def recommend(user: str = Query(..., **ids), k: int = Query(10, ge=1, le=MAX_K),
                  token: str | None = Query(**cred),
                  authorization: str | None = Header(default=None)) -> Recommendations:
        authorise(user, authorization, token)
        items, source = app.state.service.recommender.recommend(user, k)
        if source == "popular":   # a user the model has not seen: positions, not counts
            items = public_ranking(items)
        return Recommendations(user=json_id(user), source="ranked" if tokens else source,
                               items=[ScoredItem(**entry) for entry in titled(app.state.titles, items)])

    @app.get("/privacy", summary="The privacy guarantee of the training mode and the monitor's figures")
    def privacy_figures() -> dict:
        figures = app.state.service.privacy()
        figures = release(service_mode(app.state.service), figures)   # no exact figure released
        return {field: figures.get(field) for field in PRIVACY_FIELDS} | figures

    @app.get("/stats", summary="Learning counters, throughput, memory, checkpoint and offsets")
    def stats() -> dict:
        svc = app.state.service
        return release(service_mode(svc), svc.stats())

    @app.get("/admin/privacy", summary="Operator state: the monitor's exact figures and counters "
             "(admin; NOT covered by any privacy guarantee)")
    def admin_privacy(svc: ServingSource = Depends(require_admin_read)) -> dict:
        monitor = getattr(svc.recommender, "monitor", None)
        return operator_figures(monitor, svc.stats())

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/healthz", summary="Health: 503 with the reasons while the model is not ready, the "
             "broker has been unreachable too long or the last poll is too old")
    async def healthz() -> JSONResponse:
        problems = app.state.service.health.problems()
        if problems:
            return JSONResponse({"status": "unavailable", "reasons": problems}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.post("/checkpoint", summary="Write a checkpoint now (admin)")
    def checkpoint(svc: ServingSource = Depends(require_admin)) -> dict:
        if svc.checkpoints is None:
            raise HTTPException(409, "no checkpoint directory configured")
        try:
            written = svc.checkpoint()
        except OSError as exc:  # full disk, read-only: the previous checkpoint stays in force
            svc.health.checkpoint_error = f"{type(exc).__name__}: {exc.strerror or exc}"   # on /healthz
            raise HTTPException(507, f"checkpoint not written: {exc.strerror or exc}") from None
        svc.health.checkpoint_error = None
        return written

    @app.post("/pause", summary="Pause learning; queries go on (admin)")
    def pause(svc: ServingSource = Depends(require_admin)) -> dict:
        svc.pause()
        return {"paused": True}

    @app.post("/resume", summary="Resume learning (admin)")
    def resume(svc: ServingSource = Depends(require_admin)) -> dict:
        svc.resume()
        return {"paused": False}

    return app
