"""Small HTTP servers for tests, on ephemeral ports of 127.0.0.1.

``served(app)`` runs an aiohttp application for the block and gives its base URL.
A front for a real balancer: the directive requests pass through it.

``directive_front(real_url, on_request)`` serves ``/v1/issues/{issue}/directive`` on an
ephemeral port of 127.0.0.1 and forwards each request, query and all, to the real
balancer at ``real_url``. ``on_request`` sees each request first: it may record it, and
a response it returns is answered instead of the balancer's (a 503 to test retries).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """``app`` on an ephemeral port of 127.0.0.1 while the block runs: its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def directive_front(
    real_url: str, on_request: Callable[[web.Request], web.Response | None]
) -> AsyncIterator[str]:
    """The front's base URL while the block runs; the front is closed after it."""

    async def directive(request: web.Request) -> web.Response:
        answer = on_request(request)
        if answer is not None:
            return answer
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{real_url}{request.path_qs}") as resp,
        ):
            return web.Response(
                body=await resp.read(), status=resp.status, content_type="application/json"
            )

    app = web.Application()
    app.router.add_get("/v1/issues/{issue}/directive", directive)
    async with served(app) as url:
        yield url
