"""CORS for the public HTTP services (balancer, origins), so the web reader can use them.

The reader (`pressrun serve reader`, docs/reader.md) is a web app served from its own
origin; the browser lets it read the balancer's directives and the origins' Range
responses only when they answer with CORS headers (the Fetch standard, "CORS
protocol"). Everything these services serve is public (issue bundles are signed, and
encrypted for subscribers), and no request carries cookies or credentials, so any
origin may read every route (aiohttp-cors answers ``Access-Control-Allow-Origin``
with the request's own origin).

aiohttp-cors does the work (as for the subscription service): a request with an
``Origin`` header gets the allow-origin header and ``Access-Control-Expose-Headers``
naming the headers a client reads (Content-Range, ETag, Retry-After, ...; without it a
script cannot see them); a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered for ``GET``/``HEAD`` with the request
headers ``Range``, ``If-None-Match`` and ``If-Range`` (not CORS-safelisted in every
browser), cached by the browser for a day.
"""

from __future__ import annotations

import aiohttp_cors
from aiohttp import web

__all__ = ["ALLOWED_HEADERS", "EXPOSED_HEADERS", "enable_cors"]

#: request headers a cross-origin script may send (Cache-Control and User-Agent: the
#: reader's webtorrent web seeds send both with each Range request, issue 26)
ALLOWED_HEADERS = (
    "Range",
    "If-None-Match",
    "If-Range",
    "If-Modified-Since",
    "Cache-Control",
    "User-Agent",
)
#: response headers a cross-origin script may read (beyond the CORS-safelisted ones)
EXPOSED_HEADERS = (
    "Content-Range",
    "Content-Length",
    "Accept-Ranges",
    "ETag",
    "Retry-After",
    "Last-Modified",
)
#: how long a browser may cache a preflight answer (s)
PREFLIGHT_MAX_AGE_S = 86400


def enable_cors(app: web.Application) -> None:
    """Let any origin read every route of ``app`` (see the module docstring).

    Call after the routes are added and before the app starts.
    """
    options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]
        allow_credentials=False,
        allow_headers=ALLOWED_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        allow_methods=("GET", "HEAD"),
        max_age=PREFLIGHT_MAX_AGE_S,
    )
    cors = aiohttp_cors.setup(app, defaults={"*": options})
    for route in list(app.router.routes()):
        cors.add(route)
