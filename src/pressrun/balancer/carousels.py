"""The balancer's client of the multicast sender: keeps the carousels the demand
policy wants running (``pressrun serve multicast``'s control API, docs/multicast.md).

Every ``interval_s`` it lets the policy re-evaluate demand (`DemandPolicy.review`,
so an issue nobody asks for any more leaves multicast), then starts the carousels
wanted and not running (``POST /v1/carousels``) and stops those running and no longer
wanted (``DELETE /v1/carousels/<issue>``). An issue enters ``carousels`` (and the
policy answers ``multicast`` for it) only once the sender has confirmed its carousel;
a carousel that fails to start is retried at the next round, and until then the
issue is answered in swarm or origin mode.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import MulticastInfo

log = logging.getLogger("pressrun.balancer.carousels")


class SenderError(Exception):
    """The multicast sender refused or did not answer."""


@dataclass
class CarouselClient:
    """Start and stop carousels on a multicast sender's token-protected API."""

    http: aiohttp.ClientSession
    url: str
    token: str
    timeout_s: float = 30.0  # starting a carousel encodes the issue first

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def start(self, issue_id: str) -> None:
        """Start (or keep) the issue's carousel."""
        try:
            async with self.http.post(
                f"{self.url}/v1/carousels",
                json={"issue_id": issue_id},
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                if resp.status not in (200, 201):
                    raise SenderError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        except (aiohttp.ClientError, TimeoutError) as err:
            raise SenderError(str(err) or type(err).__name__) from None

    async def stop(self, issue_id: str) -> None:
        """Stop the issue's carousel (one that is not running counts as stopped)."""
        try:
            async with self.http.delete(
                f"{self.url}/v1/carousels/{issue_id}",
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                if resp.status not in (200, 404):
                    raise SenderError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        except (aiohttp.ClientError, TimeoutError) as err:
            raise SenderError(str(err) or type(err).__name__) from None


async def keep_carousels(
    policy: DemandPolicy,
    carousels: dict[str, MulticastInfo],
    client: CarouselClient,
    info: MulticastInfo,
    *,
    interval_s: float,
    now: Callable[[], float],
) -> None:
    """Forever: review demand, start wanted carousels, stop unwanted ones."""
    while True:
        policy.review(now=now())
        wanted = policy.carousels_wanted()
        for issue_id in sorted(wanted - carousels.keys()):
            try:
                await client.start(issue_id)
            except SenderError as err:
                log.warning("the multicast sender did not start %s: %s", issue_id, err)
                continue
            carousels[issue_id] = info
            log.info("peak demand: %s moves to multicast (carousel started)", issue_id)
        for issue_id in sorted(carousels.keys() - wanted):
            # clients are told swarm/origin from now on, whether the stop succeeds or not
            del carousels[issue_id]
            try:
                await client.stop(issue_id)
                log.info("demand fell: the carousel of %s is stopped", issue_id)
            except SenderError as err:
                log.warning("the multicast sender did not stop %s: %s", issue_id, err)
        await asyncio.sleep(interval_s)
