"""The multicast sender's bytes over a demo run, read from its ``/metrics`` during it.

The sender counts its UDP payload bytes per carousel channel
(``pressrun_multicast_bytes_sent{issue, channel}``) and removes a carousel's series when
the carousel stops: a stopped carousel's children would otherwise pile up over weeks of
uptime (tests/multicast/test_uptime.py). The demo's balancer stops the carousel once
the crowd's demand has faded, before the demo ends, so one read at the end found no
series and the report's sender row showed 0.0 MB beside hundreds of MB the clients took
from the carousel. `SenderBytes` sums what each series grew by between reads
(a series that comes back lower, a carousel started again, counts from zero), and
`watch_sender_bytes` reads every ``interval_s`` while the demo runs; what the last
interval before a stop sent is the part it can miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("pressrun.demo")

#: the sender's counter of UDP payload bytes, per (issue, channel)
BYTES_SENT = "pressrun_multicast_bytes_sent"

Series = tuple[tuple[str, str], ...]


class SenderBytes:
    """Bytes sent, summed over counter series that may vanish and come back (pure)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._last: dict[Series, float] = {}

    def observe(self, series: Mapping[Series, float]) -> None:
        """One read of the counters: labels -> value."""
        for labels, value in series.items():
            last = self._last.get(labels, 0.0)
            # a counter only grows; lower means a new series under the same labels
            self.total += value - last if value >= last else value
            self._last[labels] = value


def parse_bytes_sent(text: str) -> dict[Series, float]:
    """The ``pressrun_multicast_bytes_sent`` series of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        tuple(sorted(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == BYTES_SENT
        for sample in family.samples
        if sample.name.endswith("_total")
    }


async def read_sender_bytes(http: Any, url: str, into: SenderBytes) -> None:
    """Read the sender's ``/metrics`` once into ``into``."""
    async with http.get(f"{url}/metrics") as resp:
        into.observe(parse_bytes_sent(await resp.text()))


async def watch_sender_bytes(url: str, into: SenderBytes, interval_s: float = 0.25) -> None:
    """Read the sender at ``url`` every ``interval_s`` until cancelled; a failed read
    (the sender busy) is logged and the next one goes on."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        while True:
            try:
                await read_sender_bytes(http, url, into)
            except (aiohttp.ClientError, OSError, ValueError) as err:
                log.debug("the sender's /metrics: %s", err)
            await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def sender_bytes_watched(url: str, interval_s: float = 0.25) -> Any:
    """``async with sender_bytes_watched(url) as sent:`` reads the sender during the
    block and once more at its end; ``sent.total`` is the bytes it sent meanwhile."""
    import aiohttp

    sent = SenderBytes()
    task = asyncio.create_task(watch_sender_bytes(url, sent, interval_s))
    try:
        yield sent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
            async with aiohttp.ClientSession() as http:
                await read_sender_bytes(http, url, sent)
