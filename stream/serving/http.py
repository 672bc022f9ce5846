"""The live query endpoint (FastAPI): predictions, recommendations, privacy figures, stats and
Prometheus metrics, served while the model learns.

Read endpoints need no token. Admin endpoints (POST /checkpoint, /pause, /resume) need
``Authorization: Bearer <token>`` with the token given at start-up; without one they are disabled.
Ids are opaque text: they are hashed, never parsed or evaluated ('5' and 5 are the same id).
"""

from __future__ import annotations

import secrets
import time
from typing import Callable

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel

from sketchrec.stream.serving.dashboard import dashboard_router
from sketchrec.stream.serving.service import LearningService

MAX_ID = 256
MAX_K = 1000
PRIVACY_FIELDS = ("epsilon", "delta", "privacy_unit", "mode", "proven_bound", "kld",
                  "audit_epsilon_lower_bound")


class Prediction(BaseModel):
    user: str
    item: str
    rating: float


class ScoredItem(BaseModel):
    item: str | int
    score: float


class Recommendations(BaseModel):
    user: str
    items: list[ScoredItem]
    source: str


class _ServiceCollector:
    """Exports the service's counters at scrape time (no second copy of the figures to keep)."""

    def __init__(self, service_ref: Callable[[], LearningService]):
        self.service_ref = service_ref

    def collect(self):
        stats = self.service_ref().stats()
        learned = CounterMetricFamily("sketchrec_ratings_learned", "Ratings learned by the model")
        learned.add_metric([], stats["ratings_learned"])
        yield learned
        skipped = CounterMetricFamily("sketchrec_ratings_skipped", "Ratings set aside", labels=["reason"])
        for reason, count in stats["skipped"].items():
            skipped.add_metric([reason], count)
        yield skipped
        privacy = self.service_ref().privacy()
        for name, doc in (("kld", "Windowed KLD of seen vs unseen errors (eq. 4.15; heuristic)"),
                          ("kld_cumulative", "Cumulative KLD of seen vs unseen errors")):
            if privacy.get(name) is not None:
                gauge = GaugeMetricFamily(f"sketchrec_privacy_{name}", doc)
                gauge.add_metric([], privacy[name])
                yield gauge
        for name, key, doc in (("model_bytes", "model_bytes", "Bytes of model state"),
                               ("catalogue_items", "catalogue_items", "Items seen so far"),
                               ("uptime_seconds", "uptime_s", "Seconds since start")):
            gauge = GaugeMetricFamily(f"sketchrec_{name}", doc)
            gauge.add_metric([], stats[key])
            yield gauge


def create_app(service: LearningService, admin_token: str | None = None,
               privacy: Callable[[], dict] | None = None) -> FastAPI:
    """The endpoint over a service. ``privacy`` returns the monitor's figures (None: all null)."""
    app = FastAPI(title="sketchrec", version="0.1.0",
                  description="Live queries to a recommender that keeps learning from a stream.")
    app.state.service = service
    app.include_router(dashboard_router())  # the live page at / (polls /stats and /privacy)
    registry = CollectorRegistry()
    registry.register(_ServiceCollector(lambda: app.state.service))
    latency = Histogram("sketchrec_request_seconds", "Request latency", ["endpoint"], registry=registry,
                        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))

    @app.middleware("http")
    async def _time(request: Request, call_next):
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        latency.labels(getattr(route, "path", "unmatched")).observe(time.perf_counter() - t0)
        return response

    def require_admin(authorization: str | None = Header(default=None)) -> LearningService:
        if admin_token is None:
            raise HTTPException(403, "admin endpoints are disabled: no admin token was configured")
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not authorization or not secrets.compare_digest(given.encode(), admin_token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        if app.state.service.read_only:
            raise HTTPException(409, "this service is read-only (serving a checkpoint)")
        return app.state.service

    ids = dict(min_length=1, max_length=MAX_ID)

    @app.get("/predict", response_model=Prediction, summary="Predicted rating of one item by one user")
    def predict(user: str = Query(..., **ids), item: str = Query(..., **ids)) -> Prediction:
        return Prediction(user=user, item=item, rating=app.state.service.recommender.predict(user, item))

    @app.get("/recommend", response_model=Recommendations,
             summary="Top-k items the user has not rated, best first")
    def recommend(user: str = Query(..., **ids), k: int = Query(10, ge=1, le=MAX_K)) -> Recommendations:
        items, source = app.state.service.recommender.recommend(user, k)
        return Recommendations(user=user, source=source,
                               items=[ScoredItem(item=i, score=s) for i, s in items])

    @app.get("/privacy", summary="The privacy guarantee of the training mode and the monitor's figures")
    def privacy_figures() -> dict:
        figures = privacy() if privacy else app.state.service.privacy()
        return {field: figures.get(field) for field in PRIVACY_FIELDS} | figures

    @app.get("/stats", summary="Learning counters, throughput, memory, checkpoint and offsets")
    def stats() -> dict:
        return app.state.service.stats()

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/healthz", summary="Liveness")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/checkpoint", summary="Write a checkpoint now (admin)")
    def checkpoint(svc: LearningService = Depends(require_admin)) -> dict:
        if svc.checkpoints is None:
            raise HTTPException(409, "no checkpoint directory configured")
        return svc.checkpoint()

    @app.post("/pause", summary="Pause learning; queries go on (admin)")
    def pause(svc: LearningService = Depends(require_admin)) -> dict:
        svc.pause()
        return {"paused": True}

    @app.post("/resume", summary="Resume learning (admin)")
    def resume(svc: LearningService = Depends(require_admin)) -> dict:
        svc.resume()
        return {"paused": False}

    return app
