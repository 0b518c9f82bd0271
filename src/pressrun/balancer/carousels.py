"""The balancer's client of the multicast sender: keeps the sender's carousels what the
demand policy wants (``pressrun serve multicast``'s control API, docs/multicast.md).

**Reconciliation.** The sender's own list is the truth, not a memory of what was
asked: a sender restarts and forgets its carousels, a balancer restarts and forgets
what it asked for, a DELETE is lost. So every ``interval_s`` (the poll interval) the
balancer

1. lets the policy re-evaluate demand (`DemandPolicy.review`, so an issue nobody asks
   for any more leaves multicast);
2. reads the sender's list (``GET /v1/carousels``); a carousel that runs for an issue
   whose total demand is at or above the leave threshold stays wanted
   (`DemandPolicy.adopt_carousels`: several balancers, one that never saw the total
   cross the enter threshold);
3. starts what is wanted and not running (``POST /v1/carousels``) and stops what runs
   and is not wanted (``DELETE /v1/carousels/<issue>``), an orphan of an earlier
   balancer included (one balancer owns a sender's carousels);
4. answers ``multicast`` (``carousels``) for exactly the wanted issues the sender runs,
   each with the carousel's plan as the sender's answer gave it (its list, or its
   answer to the start): the directive carries it (docs/protocols.md), so a reader
   joins the channels at once instead of waiting for the next announcement. The plan
   is the sender's own (``GET``/``POST /v1/carousels``) without its packet counters;
   a plan the balancer cannot read is left out (the reader then waits for the
   announcement, as before) and logged.

A balancer that does not hold the lease (several balancers) first lets an issue whose
carousel it answered and the sender no longer runs leave multicast
(`DemandPolicy.leave_stopped_carousels`): the holder stopped it.

A round comes every ``interval_s``, or sooner when the policy takes an issue to
multicast meanwhile (`DemandPolicy.multicast_entries`, looked at every
`WAKE_CHECK_S`): the start then follows the request that took D over the level within
about 50 ms, not up to a poll later (issue 28: in flash-crowd-50-desktops the carousel
came on air about a second after the crossing, 1 s polls).

A start or stop that fails is tried again at a later round, after a wait that doubles
from one interval up to ``max_retry_s`` (`CarouselReconciler`, pure); a sender that
does not answer its list leaves every issue answered in swarm or origin mode until it
does. The loop survives any error (logged) and goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import MulticastInfo
from pressrun.multicast.codec import AnnouncementFormatError, decode_carousel
from pressrun.multicast.events import CarouselPlan

log = logging.getLogger("pressrun.balancer.carousels")

#: how often the wait between two rounds looks whether an issue went to multicast
WAKE_CHECK_S = 0.05


class SenderError(Exception):
    """The multicast sender refused or did not answer."""


@dataclass(frozen=True, slots=True)
class CarouselOrders:
    """What one round of reconciliation asks the sender: carousels to start, to stop."""

    start: tuple[str, ...]
    stop: tuple[str, ...]


@dataclass
class CarouselReconciler:
    """Which carousels to start and stop from what is wanted and what the sender
    runs, with a doubling wait before an issue whose order failed is ordered again.
    Pure: every input takes ``now``; its state is bounded by the issues wanted or
    running (an issue in neither is forgotten)."""

    retry_s: float
    max_retry_s: float = 60.0
    #: issue -> (not before, the wait after the next failure)
    _backoff: dict[str, tuple[float, float]] = field(default_factory=dict)

    def orders(
        self, wanted: Collection[str], running: Collection[str], *, now: float
    ) -> CarouselOrders:
        """The orders of this round (an issue still waiting after a failure is left
        for a later one)."""
        wanted_set, running_set = set(wanted), set(running)
        for issue in list(self._backoff):
            if issue not in wanted_set and issue not in running_set:
                del self._backoff[issue]
        due = [i for i in sorted(wanted_set ^ running_set) if self._due(i, now)]
        return CarouselOrders(
            start=tuple(i for i in due if i in wanted_set),
            stop=tuple(i for i in due if i in running_set),
        )

    def _due(self, issue: str, now: float) -> bool:
        backoff = self._backoff.get(issue)
        return backoff is None or now >= backoff[0]

    def handle_done(self, issue: str) -> None:
        """The sender did what it was asked for the issue."""
        self._backoff.pop(issue, None)

    def handle_failed(self, issue: str, *, now: float) -> float:
        """The sender refused or did not answer an order for the issue: the seconds
        until it is ordered again."""
        wait = self._backoff.get(issue, (0.0, self.retry_s))[1]
        self._backoff[issue] = (now + wait, min(self.max_retry_s, 2 * wait))
        return wait


@dataclass
class CarouselClient:
    """Start, stop and list carousels on a multicast sender's token-protected API.
    ``plans``: each carousel's plan from the sender's last answer that gave it (its
    list, or a start), without packet counters; bounded by the carousels listed."""

    http: aiohttp.ClientSession
    url: str
    token: str
    timeout_s: float = 30.0  # starting a carousel encodes the issue first
    plans: dict[str, CarouselPlan] = field(default_factory=dict)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def running(self) -> set[str]:
        """The issues whose carousels the sender runs."""
        try:
            async with self.http.get(
                f"{self.url}/v1/carousels",
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                if resp.status != 200:
                    raise SenderError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                doc = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise SenderError(str(err) or type(err).__name__) from None
        carousels = doc.get("carousels") if isinstance(doc, dict) else None
        if not isinstance(carousels, list):
            raise SenderError("the sender's list has no carousels")
        running = {
            c["issue_id"]
            for c in carousels
            if isinstance(c, dict) and isinstance(c.get("issue_id"), str)
        }
        self.plans = {}
        for c in carousels:
            self._note_plan(c)
        return running

    def _note_plan(self, doc: Any) -> None:
        """Keep the plan of one carousel the sender showed (the announcement's form,
        `decode_carousel`); one it cannot read is logged and left out."""
        if not isinstance(doc, dict) or not isinstance(doc.get("issue_id"), str):
            return
        try:
            plan = decode_carousel(doc)
        except AnnouncementFormatError as err:
            self.plans.pop(doc["issue_id"], None)
            log.warning(
                "the multicast sender's plan of %s is not readable (%s); directives "
                "name only its control group",
                doc["issue_id"][:128],
                err,
            )
            return
        self.plans[plan.issue_id] = replace(plan, sent_packets=())

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
                try:
                    doc = await resp.json()
                except ValueError:
                    doc = None  # started; its plan comes with the next list
        except (aiohttp.ClientError, TimeoutError) as err:
            raise SenderError(str(err) or type(err).__name__) from None
        self._note_plan(doc)

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
        self.plans.pop(issue_id, None)


async def reconcile_carousels(
    policy: DemandPolicy,
    carousels: MutableMapping[str, MulticastInfo],
    client: CarouselClient,
    info: MulticastInfo,
    reconciler: CarouselReconciler,
    *,
    now: Callable[[], float],
    is_leader: Callable[[], bool] | None = None,
) -> None:
    """One round (module docstring): review demand, read the sender's list, order
    what differs, and leave in ``carousels`` the wanted issues the sender runs.
    With ``is_leader`` (several balancers, `pressrun.balancer.shared`), only while it
    answers True are orders sent: one balancer starts and stops the carousels."""
    policy.review(now=now())
    wanted = policy.carousels_wanted()
    try:
        running = await client.running()
    except SenderError as err:
        if carousels:
            log.warning(
                "the multicast sender did not list its carousels (%s); %d issue(s) are "
                "answered in swarm or origin mode until it does",
                err,
                len(carousels),
            )
        carousels.clear()
        return
    ordering = is_leader is None or is_leader()
    if not ordering:
        # a carousel answered last round that the sender no longer runs was stopped
        # by the balancer that orders them: leave multicast with it
        policy.leave_stopped_carousels(tuple(carousels), running, now=now())
    # a carousel running for a demand still above the leave threshold stays wanted,
    # whichever balancer saw the total cross the enter threshold (several balancers)
    policy.adopt_carousels(running, now=now())
    wanted = policy.carousels_wanted()
    orders = reconciler.orders(wanted, running, now=now())
    if not ordering:
        orders = CarouselOrders((), ())  # another balancer orders
    for issue_id in orders.start:
        if await _order(client.start, "start", issue_id, reconciler, now):
            running.add(issue_id)
            log.info("peak demand: %s moves to multicast (carousel started)", issue_id)
    for issue_id in orders.stop:
        # clients are told swarm/origin from now on, whether the stop succeeds or not
        running.discard(issue_id)
        if await _order(client.stop, "stop", issue_id, reconciler, now):
            log.info("the carousel of %s is stopped (not wanted)", issue_id)
    confirmed = wanted & running
    for issue_id in list(carousels):
        if issue_id not in confirmed:
            del carousels[issue_id]
    for issue_id in confirmed:
        carousels[issue_id] = replace(info, plan=client.plans.get(issue_id))


async def _order(
    send: Callable[[str], Awaitable[None]],
    verb: str,
    issue_id: str,
    reconciler: CarouselReconciler,
    now: Callable[[], float],
) -> bool:
    """Send one order for the issue; whether the sender did it (a failure is logged
    and left to the reconciler's wait)."""
    try:
        await send(issue_id)
    except SenderError as err:
        wait = reconciler.handle_failed(issue_id, now=now())
        log.warning(
            "the multicast sender did not %s %s: %s (tried again in %.0f s)",
            verb,
            issue_id,
            err,
            wait,
        )
        return False
    reconciler.handle_done(issue_id)
    return True


async def keep_carousels(
    policy: DemandPolicy,
    carousels: MutableMapping[str, MulticastInfo],
    client: CarouselClient,
    info: MulticastInfo,
    *,
    interval_s: float,
    now: Callable[[], float],
    max_retry_s: float = 60.0,
    is_leader: Callable[[], bool] | None = None,
) -> None:
    """Forever, every ``interval_s``: one `reconcile_carousels` round; any error of a
    round is logged and the next round comes."""
    reconciler = CarouselReconciler(retry_s=interval_s, max_retry_s=max_retry_s)
    while True:
        try:
            await reconcile_carousels(
                policy, carousels, client, info, reconciler, now=now, is_leader=is_leader
            )
        except Exception:  # the carousels of every issue depend on this loop
            log.exception("a round of carousel reconciliation failed; the next one is due")
        await _until_next_round(policy, interval_s)


async def _until_next_round(policy: DemandPolicy, interval_s: float) -> None:
    """Wait ``interval_s``, or until the policy has taken an issue to multicast since
    (a request took its D over the level)."""
    seen = policy.multicast_entries
    steps = max(1, math.ceil(interval_s / WAKE_CHECK_S))
    for _ in range(steps):
        await asyncio.sleep(interval_s / steps)
        if policy.multicast_entries != seen:
            return
