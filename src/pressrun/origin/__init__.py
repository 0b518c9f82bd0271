"""The origin: an HTTP file server for issue bundles, a status agent and a web seed.

Programmatic use (tests, the demo)::

    from pressrun.origin import OriginConfig, start_origin

    origin = await start_origin(OriginConfig(content_dir=Path("content"), port=0))
    origin.port, origin.url        # the bound port, "http://127.0.0.1:<port>"
    origin.name                    # "origin-<port>" unless OriginConfig.name is set
    await origin.stop()            # stop listening, grace period, cut the rest

``async def start_origin(config: OriginConfig) -> RunningOrigin`` returns once the
origin accepts connections, on the running event loop. `OriginConfig` (a frozen
dataclass, :mod:`pressrun.origin.config`) documents every setting and default; the only
required one is ``content_dir``. ``RunningOrigin.service.stats_document()`` is the
``/stats`` JSON without an HTTP round trip.

Modules: :mod:`core` (pure: names, ranges, validators, `TokenBucket`, `TrafficMeter`),
:mod:`config`, :mod:`aio` (the aiohttp service), :mod:`shared` (what the workers of one
origin share: the cap, their figures), :mod:`workers` (the supervisor of ``--workers``),
:mod:`cli` (``pressrun serve origin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pressrun.origin.config import OriginConfig

if TYPE_CHECKING:
    from pressrun.origin.aio import RunningOrigin, start_origin

__all__ = ["OriginConfig", "RunningOrigin", "start_origin"]


def __getattr__(name: str) -> Any:
    # aiohttp, psutil and prometheus_client load only when the service is used.
    if name in ("RunningOrigin", "start_origin"):
        from pressrun.origin import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'pressrun.origin' has no attribute {name!r}")
