"""The live dashboard at ``/``: one static page that polls ``/stats`` and ``/privacy`` about once
a second and draws their history with uPlot (vendored from npm into ``static/``, MIT licence
beside it), so the server stays stateless and nothing is fetched from a CDN at run time.

The page keeps the history in the browser; reloading it starts a new history. Fields that are
missing (a learner without a monitor, /privacy moved behind a token) show as "n/a".

>>> sorted(route.path for route in dashboard_router().routes)
['/', '/dashboard/{name}']
>>> b"uPlot" in (STATIC / "uPlot.iife.min.js").read_bytes()[:100]   # shipped with the package
True
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

STATIC = files("sketchrec.stream.serving") / "static"
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
# only the page's own files are served: a fixed list, never a path taken from the request
ASSETS = ("uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css")


def _asset(name: str) -> Response:
    suffix = name[name.rfind("."):]
    return Response((STATIC / name).read_bytes(), media_type=f"{TYPES[suffix]}; charset=utf-8",
                    headers={"Cache-Control": "no-cache"})


def dashboard_router() -> APIRouter:
    """``GET /`` (the page) and ``GET /dashboard/NAME`` (its scripts and styles), out of the
    OpenAPI schema: they are a view of /stats and /privacy, not an API."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def page() -> Response:
        return _asset("dashboard.html")

    @router.get("/dashboard/{name}")
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, "no such dashboard file")
        return _asset(name)

    return router
