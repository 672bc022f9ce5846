"""The security headers every answer of the serving endpoint carries: the dashboard's page loads
only its own files, no page of this server may be framed, and no URL of it (which may hold a user
id) is sent to another site as a referrer.

Kept apart from the app so that the server's protocol (its own JSON 400s) adds the same headers
without importing the web framework.

>>> dict(SECURITY_HEADERS)[b"x-frame-options"], dict(SECURITY_HEADERS)[b"referrer-policy"]
(b'DENY', b'no-referrer')
"""

from __future__ import annotations

from typing import Callable

# uPlot sets inline styles; everything else comes from this server
CSP = (b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# FastAPI's /docs and /redoc pages load their scripts from a CDN and start them inline
DOCS_CSP = (b"default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
            b"style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
            b"font-src 'self' https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com "
            b"https://cdn.redoc.ly; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
            b"frame-ancestors 'none'")
DOCS_PATHS = ("/docs", "/redoc", "/docs/oauth2-redirect")
SECURITY = [(b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"),
            (b"x-content-type-options", b"nosniff")]
SECURITY_HEADERS = SECURITY + [(b"content-security-policy", CSP)]


def secured(scope: dict, send: Callable) -> Callable:
    """``send`` adding the security headers (``SECURITY_HEADERS``; /docs: its own CSP) to the
    start of the response, unless the app set one of them itself."""
    csp = DOCS_CSP if scope.get("path") in DOCS_PATHS else CSP

    async def send_secured(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {k.lower() for k, _ in headers}
            extra = [(k, v) for k, v in SECURITY + [(b"content-security-policy", csp)] if k not in names]
            message = {**message, "headers": headers + extra}
        await send(message)

    return send_secured
