"""CORS for the public HTTP services (balancer, origins), so the web reader can use them.

The reader (`pressrun serve reader`, docs/reader.md) is a web app served from its own
origin; the browser lets it read the balancer's directives and the origins' Range
responses only when they answer with CORS headers (the Fetch standard, "CORS
protocol"). Everything these services serve is public (issue bundles are signed, and
encrypted for subscribers), and no request carries cookies or credentials, so the
answer is ``Access-Control-Allow-Origin: *`` for every path.

- Every response (errors and 304s too) gets ``Access-Control-Allow-Origin: *`` and
  ``Access-Control-Expose-Headers`` naming the headers a client reads (Content-Range,
  ETag, Retry-After, ...); without the latter a script cannot see them.
- A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered 204 with
  the allowed methods and request headers (``Range``, ``If-None-Match``, ``If-Range``
  are not CORS-safelisted in every browser), cached by the browser for a day.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

__all__ = ["ALLOWED_HEADERS", "EXPOSED_HEADERS", "enable_cors"]

#: request headers a cross-origin script may send
ALLOWED_HEADERS = "Range, If-None-Match, If-Range, If-Modified-Since, Content-Type"
#: response headers a cross-origin script may read (beyond the CORS-safelisted ones)
EXPOSED_HEADERS = "Content-Range, Content-Length, Accept-Ranges, ETag, Retry-After, Last-Modified"
#: how long a browser may cache a preflight answer (s)
PREFLIGHT_MAX_AGE_S = 86400

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _answer_preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    if (
        request.method == hdrs.METH_OPTIONS
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
    ):
        return web.Response(
            status=204,
            headers={
                hdrs.ACCESS_CONTROL_ALLOW_METHODS: "GET, HEAD, OPTIONS",
                hdrs.ACCESS_CONTROL_ALLOW_HEADERS: ALLOWED_HEADERS,
                hdrs.ACCESS_CONTROL_MAX_AGE: str(PREFLIGHT_MAX_AGE_S),
            },
        )
    return await handler(request)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare runs just before the headers go out, for every answer:
    # streamed bodies (the origin's sendfile transfers) and raised HTTP errors too
    response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = "*"
    response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED_HEADERS


def enable_cors(app: web.Application) -> None:
    """Make ``app`` answer cross-origin requests as the module docstring says.

    Call before the app starts (it adds the outermost middleware and a response hook).
    """
    app.middlewares.insert(0, _answer_preflight)
    app.on_response_prepare.append(_add_headers)
