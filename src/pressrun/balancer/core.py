"""The balancer's decision core: origin rotation, polling schedule, directives.

State per origin: UNKNOWN (never answered), UP (its latest status is in the
algorithm's view) or DOWN (a poll failed, or no good status for `stale_after_s`).
Transitions::

    UNKNOWN --status--> UP --poll failed / stale--> DOWN --status--> UP

An origin is out of rotation unless UP (ARCHITECTURE.md: "an origin that does not
answer is taken out until it answers again"; MistServer takes up to 25 s to notice,
we notice at the first failed poll, or at the `fall`-th in a row with a
`HealthConfig`: `pressrun.balancer.health`, HAProxy's rise/fall/slowstart).

Each origin is polled every `poll_interval_s`: the core says when with
`next_deadline()`, and `handle_timer(now)` returns the `PollOrigin` effects due. The
adapter performs them and feeds back `StatusReceived` or `PollFailed`.

A directive request is answered by ranking the origins that hold the issue with the
configured scoring algorithm, leaving out those the client reports as failed (the
WSDM retry rule of 003_fb4a16d3be88866e.txt: re-select excluding the failed path),
and telling the algorithm which origin was picked (for Algorithm 2 this is where the
bandwidth inflation grows). A `ModePolicy` may turn an origin directive into a swarm or
multicast one; by default every directive is `origin`.

Request classes (`RequestClass`, `pressrun.balancer.request_classes`): a request
names its class (``class=``), or the core classifies it (``crowd``; ``catalogue`` for
an issue some origin in rotation does not hold, with `catalogue_by_holders`). Each
class is placed by its policy (`BalancerConfig.class_policies`): ``algorithm`` is the
path above (the scoring algorithm ranks, is told the pick, and the mode policy may
turn the directive into swarm or multicast); ``gwrr`` and ``least-loaded`` place the
request among the class's group of holders without the algorithm (its picks and
admission stay the crowd's) and in origin mode.

Bounded state (docs/security.md): an issue id no origin in rotation holds is refused
before the algorithm, the ranked cache or the mode policy see it, so made-up ids cost
nothing and leave nothing behind. The core keeps which origins in rotation hold each
issue (`_holders`); when no origin holds an issue any more, its per-issue state is
evicted everywhere (`forget_issue` on the algorithm and the mode policy).

One client's picks on their way (issue 25's class): a request from an address (an IPv6
/64) names its client to the algorithm (`handle_client_asks`, `handle_pick_for`), so
that one address asking again and again holds one pick on its way per issue, not one
per request; loopback and requests without an address add one each
(`count_every_pick_from`, as demand counts requests).

Pure: no clock, no I/O; every entry point takes `now`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from pressrun.balancer.algorithms import ScoringAlgorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import (
    DeliveryMode,
    Directive,
    DirectiveRequested,
    Effect,
    MulticastInfo,
    NoDirective,
    OriginCameBack,
    OriginSpec,
    OriginStatus,
    OriginWentDown,
    PollFailed,
    PollOrigin,
    RankedOrigin,
    Refusal,
    RequestClass,
    StatusReceived,
    SwarmInfo,
)
from pressrun.balancer.health import HealthChecks, HealthConfig
from pressrun.balancer.request_classes import ClassDispatch
from pressrun.tracker.websocket_urls import webtorrent_tracker_url


class LocalProtocolError(Exception):
    """The caller misused the core (e.g. a status for an origin it does not know)."""


class OriginState(Enum):
    """Where an origin stands in the rotation."""

    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


@dataclass(slots=True)
class OriginRecord:
    """The core's view of one origin."""

    spec: OriginSpec
    state: OriginState = OriginState.UNKNOWN
    status: OriginStatus | None = None
    last_status_at: float | None = None
    next_poll_at: float = 0.0
    polling: bool = False
    down_reason: str = "not polled yet"
    picks: int = 0


@dataclass(frozen=True, slots=True)
class ModeDecision:
    """What a mode policy says for one request."""

    mode: DeliveryMode
    swarm: SwarmInfo | None = None
    multicast: MulticastInfo | None = None


class ModePolicy(Protocol):
    """Chooses the delivery mode of each directive (e.g. from demand per issue)."""

    def decide(self, issue_id: str, *, now: float, address: str | None = None) -> ModeDecision:
        """The mode for a client asking now from ``address`` (None: unknown); called
        once per directive request.

        A policy that keeps state per issue also has ``forget_issue(issue_id)``: the
        core calls it when no origin in rotation holds the issue any more."""
        ...


_ORIGIN_MODE = ModeDecision(DeliveryMode.ORIGIN)


def browser_decision(
    decision: ModeDecision, issue_id: str, origins: tuple[RankedOrigin, ...]
) -> ModeDecision:
    """The mode for a browser reader (``peer=webrtc``, docs/protocols.md).

    A browser cannot join a multicast group: where the policy says multicast it is
    sent to the swarm, as at swarm-level demand. Its swarm names the tracker's
    WebSocket route (``ws://``/``wss://``, from the announce URL) and the directive's
    origins as web seeds (``<origin>/content/<issue>/<file>``), so a piece no peer has
    still comes. Without a WebSocket route or the file name it stays on the origins."""
    swarm = decision.swarm
    if decision.mode is DeliveryMode.ORIGIN:
        return _ORIGIN_MODE  # the swarm an origin copy seeds: the web reader does not
    if swarm is None:
        return decision
    ws = webtorrent_tracker_url(swarm.tracker_url)
    if ws is None or swarm.file_name is None:
        return _ORIGIN_MODE
    seeds = tuple(f"{o.url.rstrip('/')}/content/{issue_id}/{swarm.file_name}" for o in origins)
    return ModeDecision(DeliveryMode.SWARM, replace(swarm, webtorrent_url=ws, web_seeds=seeds))


class OriginOnly:
    """The default mode policy: always the origin path."""

    def decide(self, issue_id: str, *, now: float, address: str | None = None) -> ModeDecision:
        """Always `origin`."""
        return _ORIGIN_MODE


class BalancerCore:
    """Origin rotation, polling and directive decisions, driven with explicit `now`."""

    def __init__(
        self,
        config: BalancerConfig,
        origins: Sequence[OriginSpec],
        algorithm: ScoringAlgorithm,
        mode_policy: ModePolicy | None = None,
        *,
        now: float = 0.0,
        health: HealthConfig | None = None,
        count_every_pick_from: Sequence[str] | None = None,
    ) -> None:
        """`count_every_pick_from`: networks (CIDR) whose every request adds a pick on
        its way (None: the demand policy's default, loopback; the balancer service
        passes ``--demand-count-every-request-from``); from any other address one
        client's picks on their way for an issue count once (`_client_key`)."""
        # Imported here: pressrun.balancer.demand imports this module (ModeDecision).
        from pressrun.balancer.demand import DemandConfig, client_key

        if not origins:
            raise LocalProtocolError("the balancer needs at least one origin")
        names = [o.name for o in origins]
        if len(set(names)) != len(names):
            raise LocalProtocolError(f"origin names must be unique: {names}")
        self.config = config
        self.algorithm = algorithm
        self.mode_policy: ModePolicy = mode_policy or OriginOnly()
        self.origins: dict[str, OriginRecord] = {
            o.name: OriginRecord(spec=o, next_poll_at=now) for o in origins
        }
        self.directives_answered = 0
        self._ranked_cache: dict[str, dict[str, RankedOrigin]] = {}
        # issue id -> the origins in rotation (UP) whose latest status holds it
        self._holders: dict[str, set[str]] = {}
        self.refusals: dict[Refusal, int] = dict.fromkeys(Refusal, 0)
        self.classes = ClassDispatch(origins, config.class_groups)
        self.directives_by_class: dict[RequestClass, int] = dict.fromkeys(RequestClass, 0)
        # rise/fall/slowstart (pressrun.balancer.health); default: one poll decides
        self.health = HealthChecks(health or HealthConfig.immediate(), origins)
        # Who one client is, as demand counts it (an IPv4 address, an IPv6 /64).
        every = (
            DemandConfig().count_every_request_from
            if count_every_pick_from is None
            else tuple(count_every_pick_from)
        )
        self._every_pick_from = tuple(ipaddress.ip_network(n, strict=False) for n in every)
        self._client_key_of = client_key

    # --- timers -------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `handle_timer` must next run: the next poll or staleness check."""
        deadlines: list[float] = []
        for rec in self.origins.values():
            if not rec.polling:
                deadlines.append(rec.next_poll_at)
            if rec.state is OriginState.UP and rec.last_status_at is not None:
                deadlines.append(rec.last_status_at + self.config.stale_after_s)
        return min(deadlines) if deadlines else None

    def handle_timer(self, *, now: float) -> list[Effect]:
        """Polls that are due, and origins that went stale, as effects."""
        effects: list[Effect] = []
        for rec in self.origins.values():
            if (
                rec.state is OriginState.UP
                and rec.last_status_at is not None
                and now >= rec.last_status_at + self.config.stale_after_s
            ):
                age = now - rec.last_status_at
                effects.extend(self._take_down(rec, f"no status for {age:.1f} s", now=now))
            if not rec.polling and now >= rec.next_poll_at:
                rec.polling = True
                effects.append(PollOrigin(rec.spec.name, rec.spec.url))
        return effects

    # --- inputs -------------------------------------------------------------

    def _record(self, name: str) -> OriginRecord:
        try:
            return self.origins[name]
        except KeyError:
            raise LocalProtocolError(f"unknown origin {name!r}") from None

    def handle_status_received(self, msg: StatusReceived, *, now: float) -> list[Effect]:
        """An origin's status arrived: it is in rotation with these numbers."""
        rec = self._record(msg.status.name)
        rec.polling = False
        rec.next_poll_at = now + self.config.poll_interval_s
        if not self.health.status_ok(rec.spec.name, rec.state.value, now=now):
            rec.down_reason = "rising: fewer good polls in a row than rise"
            return []
        held_before = (
            rec.status.issues
            if rec.state is OriginState.UP and rec.status is not None
            else frozenset()
        )
        self._update_holders(rec.spec.name, held_before, msg.status.issues)
        rec.status = msg.status
        rec.last_status_at = now
        came_back = rec.state is not OriginState.UP
        rec.state = OriginState.UP
        self.algorithm.handle_status(msg.status, now=now)
        self.classes.handle_status(rec.spec.name)
        return [OriginCameBack(rec.spec.name)] if came_back else []

    def handle_poll_failed(self, msg: PollFailed, *, now: float) -> list[Effect]:
        """A poll failed: the origin is out of rotation until it answers again."""
        rec = self._record(msg.name)
        rec.polling = False
        rec.next_poll_at = now + self.config.poll_interval_s
        if not self.health.poll_failed(rec.spec.name, rec.state.value):
            return []  # in rotation until `fall` failed polls in a row
        return self._take_down(rec, msg.reason, now=now)

    def _take_down(self, rec: OriginRecord, reason: str, *, now: float) -> list[Effect]:
        rec.down_reason = reason
        self.health.went_down(rec.spec.name)
        if rec.state is OriginState.DOWN:
            return []
        was_up = rec.state is OriginState.UP
        if was_up and rec.status is not None:
            self._update_holders(rec.spec.name, rec.status.issues, frozenset())
        rec.state = OriginState.DOWN
        self.algorithm.handle_origin_down(rec.spec.name, now=now)
        return [OriginWentDown(rec.spec.name, reason)] if was_up else []

    def _update_holders(self, name: str, before: frozenset[str], after: frozenset[str]) -> None:
        if before == after:
            return
        for issue in after - before:
            self._holders.setdefault(issue, set()).add(name)
        for issue in before - after:
            holders = self._holders.get(issue)
            if holders is None:
                continue
            holders.discard(name)
            if not holders:
                # Nobody in rotation holds it: evict its per-issue state everywhere.
                del self._holders[issue]
                self._ranked_cache.pop(issue, None)
                self.algorithm.forget_issue(issue)
                forget = getattr(self.mode_policy, "forget_issue", None)
                if forget is not None:
                    forget(issue)

    def held_issues(self) -> int:
        """How many issues some origin in rotation holds (the bound on per-issue state)."""
        return len(self._holders)

    def handle_directive_requested(
        self, msg: DirectiveRequested, *, now: float
    ) -> Directive | NoDirective:
        """Answer a client: a directive with origins in preference order, or a refusal."""
        issue = msg.issue_id
        if issue not in self._holders:
            # Unknown here (made up, or no holder in rotation): nothing is created.
            return self._refuse(issue, msg.failed)
        klass = msg.request_class or self.classify(issue)
        policy = self.config.class_policy(klass.value)
        if policy != "algorithm":
            return self._place_by_class(msg, klass, policy, now=now)
        client = self._client_key(msg.address)
        if client is not None:
            # Its pick still on its way (an earlier request) is replaced by this one.
            self.algorithm.handle_client_asks(issue, client, now=now)
        ranked: list[tuple[str, float]] | None = None
        if msg.reservation is not None:
            # It comes back with a reserved start: its origin, or still too early.
            claimed = self.algorithm.claim_reservation(
                issue, msg.reservation, exclude=msg.failed, now=now
            )
            if isinstance(claimed, float):
                return self._come_back(issue, msg.reservation, claimed, now=now)
            ranked = claimed
        if ranked is None:
            ranked = self.algorithm.rank_for(
                issue, msg.client, exclude=msg.failed, k=self.config.directive_origins, now=now
            )
        ranked = self.health.admit(ranked, now=now)  # slow starts
        if not ranked:
            beyond = self._past_full_origins(msg, klass, now=now)
            if beyond is not None:
                return beyond
            reserved = self.algorithm.reserved_start(now=now)
            if reserved is not None:
                return self._come_back(issue, reserved[0], reserved[1], now=now)
            return self._refuse(issue, msg.failed)
        picked = ranked[0][0]
        origins = self.origins
        self.algorithm.handle_pick_for(picked, issue, msg.client, now=now, client_key=client)
        origins[picked].picks += 1
        self.directives_answered += 1
        self.directives_by_class[klass] += 1
        decision = self.mode_policy.decide(issue, now=now, address=msg.address)
        ranked_origins = self._ranked_origins(issue, ranked)
        if msg.webrtc:
            decision = browser_decision(decision, issue, ranked_origins)
        if decision.mode is not DeliveryMode.ORIGIN:
            # the client goes to the swarm or the carousel first, not to the origin
            self.algorithm.handle_pick_not_sent(picked, issue, now=now)
        return self._directive(issue, decision, ranked_origins, klass)

    def _past_full_origins(
        self, msg: DirectiveRequested, klass: RequestClass, *, now: float
    ) -> Directive | None:
        """No origin has room for one more transfer, but the issue's mode is the swarm or
        the carousel: those take no origin's room (the origins stay its web seeds and
        last fallback), so the client is sent there, not refused. Before, the mode was
        asked only once an origin had room, and `headroom` refused every swarm-bound
        reader while the origins were full (30 of 30 browser readers in the core with
        two origins at capacity; `alg2`, which ranks full origins too, sent all 30).
        None: the mode is `origin` (the refusal stands) or no holder is usable."""
        issue = msg.issue_id
        holders = [
            (name, 0.0)
            for name in sorted(self._holders[issue])
            if name not in msg.failed and self.origins[name].state is OriginState.UP
        ]
        if not holders:
            return None
        decision = self.mode_policy.decide(issue, now=now, address=msg.address)
        ranked_origins = self._ranked_origins(issue, holders[: self.config.directive_origins])
        if msg.webrtc:
            decision = browser_decision(decision, issue, ranked_origins)
        if decision.mode is DeliveryMode.ORIGIN:
            return None
        self.directives_answered += 1
        self.directives_by_class[klass] += 1
        return self._directive(issue, decision, ranked_origins, klass)

    def _directive(
        self,
        issue: str,
        decision: ModeDecision,
        ranked_origins: tuple[RankedOrigin, ...],
        klass: RequestClass,
    ) -> Directive:
        """The directive for `decision`: a client sent to the swarm or the carousel
        falls back to the swarm (from the carousel) and then to the origins."""
        fallbacks: tuple[DeliveryMode, ...] = (
            (DeliveryMode.ORIGIN,) if decision.mode is not DeliveryMode.ORIGIN else ()
        )
        if decision.mode is DeliveryMode.MULTICAST and decision.swarm is not None:
            fallbacks = (DeliveryMode.SWARM, DeliveryMode.ORIGIN)
        return Directive(
            issue,
            decision.mode,
            ranked_origins,
            decision.swarm,
            fallbacks,
            self.config.expires_in_s,
            self.algorithm.name,
            decision.multicast,
            klass,
        )

    def _client_key(self, address: str | None) -> str | None:
        """Who asks, for counting its picks on their way once (issue 25's class: one
        address asking again and again made origins "full" for everyone): its address
        (an IPv6 /64), or None where every pick counts: no address (the simulator), or
        one in `count_every_pick_from` (loopback by default, as for demand: the demo's
        clients all come from 127.0.0.1)."""
        if address is None:
            return None
        if self._every_pick_from:
            try:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
            except ValueError:
                ip = None
            if ip is not None and any(ip in net for net in self._every_pick_from):
                return None
        return self._client_key_of(address)

    def classify(self, issue: str) -> RequestClass:
        """The class of a request that names none: ``crowd``, or with
        `catalogue_by_holders` ``catalogue`` when some origin in rotation does not hold
        the issue (the back catalogue lives on some origins only)."""
        if self.config.catalogue_by_holders:
            holders = self._holders.get(issue, set())
            up = sum(1 for rec in self.origins.values() if rec.state is OriginState.UP)
            if len(holders) < up:
                return RequestClass.CATALOGUE
        return RequestClass.CROWD

    def _place_by_class(
        self, msg: DirectiveRequested, klass: RequestClass, policy: str, *, now: float
    ) -> Directive | NoDirective:
        """A request placed by its class's own policy (``gwrr``, ``least-loaded``),
        among the holders in rotation: the algorithm is not asked nor told (the
        crowd's placement stays its own), the directive is `origin`."""
        issue = msg.issue_id
        holders = self._holders[issue]
        origins = self.origins
        ranked = self.classes.rank(
            policy,
            klass,
            holders,
            lambda name: origins[name].status,
            exclude=msg.failed,
            k=self.config.directive_origins,
        )
        ranked = self.health.admit(ranked, now=now)  # slow starts
        if not ranked:
            return self._refuse(issue, msg.failed)
        picked = ranked[0][0]
        self.classes.handle_pick(policy, klass, picked, holders, msg.failed)
        self.origins[picked].picks += 1
        self.directives_answered += 1
        self.directives_by_class[klass] += 1
        return Directive(
            issue,
            DeliveryMode.ORIGIN,
            tuple(RankedOrigin(n, self.origins[n].spec.url, s) for n, s in ranked),
            None,
            (),
            self.config.expires_in_s,
            policy,
            None,
            klass,
        )

    def _ranked_origins(
        self, issue: str, ranked: list[tuple[str, float]]
    ) -> tuple[RankedOrigin, ...]:
        # Hot path: between two requests for an issue only the picked origin's score
        # moves, so the other entries are the same frozen objects as last time
        # (building a frozen dataclass costs more than looking one up).
        cache = self._ranked_cache.get(issue)
        if cache is None:
            cache = self._ranked_cache[issue] = {}
        out = []
        for name, score in ranked:
            entry = cache.get(name)
            if entry is None or entry.score != score:
                entry = cache[name] = RankedOrigin(name, self.origins[name].spec.url, score)
            out.append(entry)
        return tuple(out)

    def _come_back(self, issue: str, token: str, start: float, *, now: float) -> NoDirective:
        """No room now, a start reserved at `start`: the client is to come back then and
        name `token` (docs/balancer.md, "Reserved starts")."""
        wait = max(start - now, 0.0)
        self.refusals[Refusal.RESERVED] += 1
        message = (
            f"every origin holding {issue!r} is busy; a start is reserved for you in "
            f"{wait:.0f} s: ask again then with reservation={token}"
        )
        return NoDirective(issue, Refusal.RESERVED, message, wait, token)

    def _refuse(self, issue: str, failed: frozenset[str]) -> NoDirective:
        # Only a refusal looks at every origin: a directive must not cost O(origins).
        holders_known = any(
            rec.status is not None and issue in rec.status.issues for rec in self.origins.values()
        )
        up_holders = [
            name
            for name, rec in self.origins.items()
            if rec.state is OriginState.UP and rec.status is not None and issue in rec.status.issues
        ]
        retry = self.config.retry_after_s
        if not holders_known:
            if any(rec.state is OriginState.UP for rec in self.origins.values()):
                reason, message = Refusal.UNKNOWN_ISSUE, f"no origin holds issue {issue!r}"
            else:
                reason = Refusal.NO_ORIGIN_UP
                message = "no origin is answering; retry shortly"
        elif up_holders and not set(up_holders) <= failed:
            reason = Refusal.ALL_FULL
            message = f"every origin holding {issue!r} is full; retry in {retry:g} s"
        else:
            reason = Refusal.NO_ORIGIN_UP
            tried = f" (the client could not use: {', '.join(sorted(failed))})" if failed else ""
            message = f"no origin holding {issue!r} is available{tried}; retry in {retry:g} s"
        self.refusals[reason] += 1
        return NoDirective(issue, reason, message, retry)

    # --- views --------------------------------------------------------------

    def origin_states(self) -> dict[str, OriginState]:
        """Each origin's state in the rotation."""
        return {name: rec.state for name, rec in self.origins.items()}
