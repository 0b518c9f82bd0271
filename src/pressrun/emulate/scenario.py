"""Emulation scenarios: TOML in, a validated `EmulationScenario` out.

A scenario names the issue's size, the settings of the compose project (any
``PRESSRUN_*`` variable of docker-compose.yml, docs/emulation.md), the client access
links, when clients arrive and what breaks when::

    name = "flash-crowd"
    description = "..."
    issue_mb = 50
    unicast_twin = true        # also run it with swarm (and multicast) off; one report
    one_balancer_twin = false  # also run it against one balancer (balancer-2 scaled
                               # to 0, its faults left out): the report shows both
    timeout_s = 1200           # the clients' deadline, from the first arrival

    [env]                      # the compose project's settings
    PRESSRUN_ORIGIN_C_LINK_RATE = "100mbit"

    [[links]]                  # client access links, drawn in proportion to `share`
    name = "dsl"
    rate = "20mbit"            # both directions; up_rate / down_rate override
    loss_pct = 0.0
    profile = "desktop"        # pressrun get --profile
    share = 3

    [[arrivals]]               # the simulator's arrival tables (docs/simulator.md):
    kind = "waves"             # trickle (= rate), waves, burst
    count = 50
    every_s = 30
    waves = 3

    [[faults]]
    at_s = 40
    action = "cut-link"        # cut-link (the service keeps running), kill, or start
                               # (a service killed earlier, back)
    service = "origin-c"

    [browser_readers]          # the web reader in headless Chromium, one container a
    link = "mobile-6"          # phone (issue 26): a [[links]] name (default: the first
    seed_s = 60                # mobile one); how long the app stays open after its
                               # download at most (the reader's own leave rule first)
    [[browser_readers.arrivals]]  # the same tables as [[arrivals]]
    kind = "burst"
    count = 10
    at_s = 55
    spread_s = 60

    [embargo]                  # the release minute (issue 35): the issue published
    readers = 150              # encrypted for `readers` subscribers (one client each,
    window_s = 120             # registered by the run) with its release `window_s`
    prefetch_spread_s = 30     # after the first arrival; each reader starts ``get
    crowd_spread_s = 60        # --prefetch`` over the first `prefetch_spread_s` and
    open_within_s = 10         # opens it at the release; the twin (`twin`): the same
    twin = true                # readers, no embargo, arriving over `crowd_spread_s`
                               # (the release minute's flash crowd). No [[arrivals]]:
                               # they are the readers'; no browser or AMT readers

    [amt_readers]              # ``pressrun get`` on a network of their own with no
    link = "dsl-20"            # multicast route to the sender's (issue 34): unicast
                               # routed to the island, the carousel through an AMT
                               # relay the balancer names (`pressrun.emulate.amt`)
    [[amt_readers.arrivals]]
    kind = "burst"
    count = 5
    at_s = 60
    spread_s = 8

Built-in scenarios live in `pressrun/emulate/scenarios/*.toml`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pressrun.emulate.link import LinkConfigError, parse_rate_bps
from pressrun.sim import scenario_files
from pressrun.sim.scenario import ScenarioError, expand_arrivals

#: cut-link (the service keeps running), kill, start (a killed service back)
FAULT_ACTIONS = ("cut-link", "kill", "start")
PROFILES = ("desktop", "mobile")
#: services of docker-compose.yml a fault may name
SERVICES = (
    "origin-a",
    "origin-b",
    "origin-c",
    "tracker-1",
    "tracker-2",
    "supernode-1",
    "supernode-2",
    "multicast",
    "balancer",
    "balancer-2",
    "redis",
)


@dataclass(frozen=True, slots=True)
class ClientLink:
    """One kind of client access link."""

    name: str
    up_rate: str | None
    down_rate: str | None
    loss_pct: float
    profile: str
    share: float

    def env(self) -> dict[str, str]:
        """The ``PRESSRUN_LINK_*`` variables of a client container on this link."""
        env: dict[str, str] = {}
        if self.up_rate:
            env["PRESSRUN_LINK_UP_RATE"] = self.up_rate
        if self.down_rate:
            env["PRESSRUN_LINK_DOWN_RATE"] = self.down_rate
        if self.loss_pct > 0:
            env["PRESSRUN_LINK_LOSS_PCT"] = f"{self.loss_pct:g}"
        return env


@dataclass(frozen=True, slots=True)
class Fault:
    """Something that breaks at ``at_s`` after the first arrival."""

    at_s: float
    action: str
    service: str


#: a client's kind: ``pressrun get`` in a container, or the web reader in headless
#: Chromium in a container (`pressrun.emulate.browser_reader`)
DESKTOP = "desktop"
BROWSER = "browser"
#: ``pressrun get`` behind an AMT relay: a network without multicast routes (issue 34)
AMT = "amt"


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """One client of a run: when it starts (after the first arrival), its link and its
    kind (`DESKTOP` or `BROWSER`)."""

    number: int
    at_s: float
    link: ClientLink
    kind: str = DESKTOP


@dataclass(frozen=True, slots=True)
class BrowserReaders:
    """The scenario's fleet of browser readers (phones): their link, how long each
    keeps the app open after its download at most, and when they arrive."""

    link: ClientLink
    seed_s: float
    arrival_specs: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class AmtReaders:
    """The scenario's fleet of readers behind an AMT relay (issue 34): their link and
    when they arrive."""

    link: ClientLink
    arrival_specs: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Embargo:
    """The release minute (issue 35): how many readers (subscribers), when the release
    comes after the first arrival, how the readers arrive (prefetching from the start
    of the window; in the twin, without an embargo, over the release minute) and what
    counts as opened at the release."""

    readers: int
    window_s: float
    prefetch_spread_s: float
    crowd_spread_s: float
    open_within_s: float
    twin: bool

    def prefetch_arrivals(self) -> dict[str, Any]:
        """The readers' arrival table with the embargo: over the window's start."""
        return {"kind": "burst", "count": self.readers, "at_s": 0.0,
                "spread_s": self.prefetch_spread_s}  # fmt: skip

    def crowd_arrivals(self) -> dict[str, Any]:
        """The readers' arrival table without it: the release minute's crowd."""
        return {"kind": "burst", "count": self.readers, "at_s": 0.0,
                "spread_s": self.crowd_spread_s}  # fmt: skip


@dataclass(frozen=True, slots=True)
class EmulationScenario:
    """A validated emulation scenario."""

    name: str
    description: str
    issue_mb: float
    unicast_twin: bool
    timeout_s: float
    env: Mapping[str, str]
    links: tuple[ClientLink, ...]
    arrival_specs: tuple[Mapping[str, Any], ...]
    faults: tuple[Fault, ...]
    seed: int
    source: str
    #: also run the crowd against ``balancer`` alone (issue 30, `balancer_kill`)
    one_balancer_twin: bool = False
    #: browser readers beside the desktop clients (issue 26), or None
    browsers: BrowserReaders | None = None
    #: readers on a network without multicast routes, behind an AMT relay (issue 34)
    amt: AmtReaders | None = None
    #: the release minute (issue 35): an encrypted issue under an embargo, or None
    embargo: Embargo | None = None

    def release_crowd(self) -> list[ClientPlan]:
        """The embargo's twin: the same readers (numbers and links) arriving over the
        release minute (`Embargo.crowd_arrivals`), without an embargo."""
        assert self.embargo is not None
        rng = random.Random(self.seed + 3)
        spec = self.embargo.crowd_arrivals()
        times = sorted(a.at_s for a in expand_arrivals(spec, rng, "embargo", self.source))
        return [
            dataclasses.replace(plan, at_s=t) for plan, t in zip(self.clients(), times, strict=True)
        ]

    def clients(self) -> list[ClientPlan]:
        """Every client in start order, each with a link drawn by share (seeded); the
        browser readers after the desktop clients, then the AMT readers, each numbered
        on from those before (so a scenario's desktop fleet is the same with or
        without them)."""
        rng = random.Random(self.seed)
        times: list[float] = []
        for i, spec in enumerate(self.arrival_specs):
            times += [a.at_s for a in expand_arrivals(spec, rng, f"arrivals[{i}]", self.source)]
        times.sort()
        weights = [link.share for link in self.links]
        picks = rng.choices(self.links, weights=weights, k=len(times))
        plans = [
            ClientPlan(n + 1, t, link) for n, (t, link) in enumerate(zip(times, picks, strict=True))
        ]
        if self.browsers is not None:
            plans += self._fleet(self.browsers, "browser_readers", BROWSER, 1, len(plans) + 1)
        if self.amt is not None:
            plans += self._fleet(self.amt, "amt_readers", AMT, 2, len(plans) + 1)
        return plans

    def _fleet(
        self,
        fleet: BrowserReaders | AmtReaders,
        table: str,
        kind: str,
        seed_offset: int,
        first: int,
    ) -> list[ClientPlan]:
        """A fleet's clients on its link, numbered from ``first`` in arrival order (its
        own random stream, so the desktop fleet is the same with or without it)."""
        rng = random.Random(self.seed + seed_offset)
        times: list[float] = []
        for i, spec in enumerate(fleet.arrival_specs):
            where = f"{table}.arrivals[{i}]"
            times += [a.at_s for a in expand_arrivals(spec, rng, where, self.source)]
        return [ClientPlan(first + n, t, fleet.link, kind) for n, t in enumerate(sorted(times))]

    def last_arrival_s(self) -> float:
        """When the last client (desktop or browser) arrives."""
        return max(p.at_s for p in self.clients())


def builtin_names() -> list[str]:
    """The built-in emulation scenarios (pressrun/emulate/scenarios/*.toml)."""
    return scenario_files.builtin_names("pressrun.emulate", "scenarios")


def load_scenario(name_or_path: str) -> EmulationScenario:
    """A built-in scenario by name, or a TOML file by path."""
    text, source = scenario_files.read_scenario_text(
        name_or_path,
        package="pressrun.emulate",
        folder="scenarios",
        kind="emulation",
        error=ScenarioError,
    )
    return parse_scenario(text, source=source)


_TOP = {
    "name", "description", "issue_mb", "unicast_twin", "timeout_s", "seed", "env", "links",
    "arrivals", "faults", "one_balancer_twin", "browser_readers", "amt_readers", "embargo",
}  # fmt: skip
_EMBARGO = {"readers", "window_s", "prefetch_spread_s", "crowd_spread_s", "open_within_s",
            "twin"}  # fmt: skip
_BROWSERS = {"link", "seed_s", "arrivals"}
_AMT = {"link", "arrivals"}
_LINK = {"name", "rate", "up_rate", "down_rate", "loss_pct", "profile", "share"}
_FAULT = {"at_s", "action", "service"}


def _err(source: str, where: str, message: str) -> ScenarioError:
    return ScenarioError(f"{source}: {where}: {message}")


def _unknown(table: Mapping[str, Any], allowed: set[str], source: str, where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise _err(source, where, f"unknown key(s) {', '.join(extra)}; allowed: "
                   f"{', '.join(sorted(allowed))}")  # fmt: skip


def _number(table: Mapping[str, Any], key: str, default: float | None, source: str,
            where: str, *, minimum: float = 0.0) -> float:  # fmt: skip
    value = table.get(key, default)
    if value is None:
        raise _err(source, f"{where}.{key}", "is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _err(source, f"{where}.{key}", f"must be a number, got {value!r}")
    if value < minimum:
        raise _err(source, f"{where}.{key}", f"must be at least {minimum:g}, got {value!r}")
    return float(value)


def parse_scenario(text: str, *, source: str = "<string>") -> EmulationScenario:
    """Parse and validate scenario TOML text; `ScenarioError` says what to fix."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{source}: not valid TOML: {err}") from None
    _unknown(doc, _TOP, source, "top level")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise _err(source, "name", "must be a non-empty string")
    env_table = doc.get("env", {})
    if not isinstance(env_table, dict):
        raise _err(source, "env", 'must be a table of PRESSRUN_* = "value"')
    env: dict[str, str] = {}
    for key, value in env_table.items():
        if not key.startswith("PRESSRUN_") or not isinstance(value, str | int | float):
            raise _err(source, f"env.{key}", "must be a PRESSRUN_* variable with a string value")
        env[key] = str(value)
    links: list[ClientLink] = []
    for i, table in enumerate(doc.get("links", [])):
        where = f"links[{i}]"
        _unknown(table, _LINK, source, where)
        both = table.get("rate")
        up = table.get("up_rate", both)
        down = table.get("down_rate", both)
        for key, value in (("up_rate", up), ("down_rate", down)):
            if value is not None:
                try:
                    parse_rate_bps(str(value), key)
                except LinkConfigError as err:
                    raise _err(source, where, str(err)) from None
        profile = table.get("profile", "desktop")
        if profile not in PROFILES:
            raise _err(source, f"{where}.profile", f"must be one of {', '.join(PROFILES)}")
        loss = _number(table, "loss_pct", 0.0, source, where)
        if loss > 100:
            raise _err(source, f"{where}.loss_pct", "must be 0 to 100")
        links.append(
            ClientLink(
                name=str(table.get("name", f"link-{i + 1}")),
                up_rate=None if up is None else str(up),
                down_rate=None if down is None else str(down),
                loss_pct=loss,
                profile=profile,
                share=_number(table, "share", 1.0, source, where),
            )
        )
    if not links:
        links.append(ClientLink("unshaped", None, None, 0.0, "desktop", 1.0))
    if sum(link.share for link in links) <= 0:
        raise _err(source, "links", "the shares add up to 0")
    specs = _arrival_specs(doc.get("arrivals", []), source, "arrivals")
    embargo = _embargo(doc.get("embargo"), source)
    if embargo is not None:
        for key in ("arrivals", "browser_readers", "amt_readers"):
            if key in doc:
                raise _err(source, key, "not with [embargo] (its readers are the clients)")
        specs = [embargo.prefetch_arrivals()]
    if not specs:
        raise _err(source, "arrivals", "at least one [[arrivals]] table is needed")
    browsers = _browser_readers(doc.get("browser_readers"), links, source)
    amt = _amt_readers(doc.get("amt_readers"), links, source)
    if amt is not None:
        _check_ssm(env, source)
    faults: list[Fault] = []
    for i, table in enumerate(doc.get("faults", [])):
        where = f"faults[{i}]"
        _unknown(table, _FAULT, source, where)
        action = table.get("action")
        if action not in FAULT_ACTIONS:
            raise _err(source, f"{where}.action", f"must be one of {', '.join(FAULT_ACTIONS)}")
        service = table.get("service")
        if service not in SERVICES:
            raise _err(source, f"{where}.service", f"must be one of {', '.join(SERVICES)}")
        faults.append(Fault(_number(table, "at_s", None, source, where), action, service))
    scenario = EmulationScenario(
        name=name,
        description=str(doc.get("description", "")),
        issue_mb=_number(doc, "issue_mb", 50.0, source, "top level", minimum=0.01),
        unicast_twin=bool(doc.get("unicast_twin", False)),
        timeout_s=_number(doc, "timeout_s", 900.0, source, "top level", minimum=1.0),
        env=env,
        links=tuple(links),
        arrival_specs=tuple(specs),
        faults=tuple(sorted(faults, key=lambda f: f.at_s)),
        seed=int(_number(doc, "seed", 2026, source, "top level")),
        source=source,
        one_balancer_twin=bool(doc.get("one_balancer_twin", False)),
        browsers=browsers,
        amt=amt,
        embargo=embargo,
    )
    if not scenario.clients():
        raise _err(source, "arrivals", "no client arrives")
    return scenario


def _arrival_specs(tables: Any, source: str, where: str) -> list[Mapping[str, Any]]:
    """Validated arrival tables (``kind = "trickle"`` is the simulator's ``rate``)."""
    if not isinstance(tables, list):
        raise _err(source, where, "must be an array of tables ([[...]])")
    specs: list[Mapping[str, Any]] = []
    for i, spec in enumerate(tables):
        if not isinstance(spec, dict):
            raise _err(source, f"{where}[{i}]", "must be a table")
        spec = dict(spec)
        if spec.get("kind") == "trickle":
            spec["kind"] = "rate"  # the simulator's name for a steady trickle
        expand_arrivals(spec, random.Random(0), f"{where}[{i}]", source)  # validates
        specs.append(spec)
    return specs


def _fleet_link(table: Mapping[str, Any], links: Sequence[ClientLink], source: str,
                where: str, default: ClientLink) -> ClientLink:  # fmt: skip
    """A reader fleet's ``link``: a [[links]] name, or ``default`` when not named."""
    name = table.get("link")
    if name is None:
        return default
    found = [lk for lk in links if lk.name == name]
    if not found:
        names = ", ".join(lk.name for lk in links)
        raise _err(source, f"{where}.link", f"no [[links]] named {name!r} (there are {names})")
    return found[0]


def _amt_readers(table: Any, links: Sequence[ClientLink], source: str) -> AmtReaders | None:
    """The ``[amt_readers]`` table: a link by name (default: the first), and its own
    arrival tables."""
    if table is None:
        return None
    where = "amt_readers"
    if not isinstance(table, dict):
        raise _err(source, where, "must be a table")
    _unknown(table, _AMT, source, where)
    link = _fleet_link(table, links, source, where, links[0])
    specs = _arrival_specs(table.get("arrivals", []), source, f"{where}.arrivals")
    if not specs:
        raise _err(source, f"{where}.arrivals", "at least one arrivals table is needed")
    return AmtReaders(link=link, arrival_specs=tuple(specs))


def _embargo(table: Any, source: str) -> Embargo | None:
    """The ``[embargo]`` table (the release minute, issue 35)."""
    if table is None:
        return None
    where = "embargo"
    if not isinstance(table, dict):
        raise _err(source, where, "must be a table")
    _unknown(table, _EMBARGO, source, where)
    readers = _number(table, "readers", 150, source, where, minimum=1)
    if readers != int(readers):
        raise _err(source, f"{where}.readers", f"must be a whole number, got {readers:g}")
    embargo = Embargo(
        readers=int(readers),
        window_s=_number(table, "window_s", 120.0, source, where, minimum=1.0),
        prefetch_spread_s=_number(table, "prefetch_spread_s", 30.0, source, where),
        crowd_spread_s=_number(table, "crowd_spread_s", 60.0, source, where),
        open_within_s=_number(table, "open_within_s", 10.0, source, where, minimum=0.1),
        twin=bool(table.get("twin", True)),
    )
    if embargo.prefetch_spread_s >= embargo.window_s:
        raise _err(source, f"{where}.prefetch_spread_s", "must end before the release (window_s)")
    return embargo


def with_readers(scenario: EmulationScenario, readers: int) -> EmulationScenario:
    """The embargo scenario with ``readers`` readers (``pressrun emulate --readers``:
    what this host carries); ScenarioError for any other scenario."""
    if scenario.embargo is None:
        raise ScenarioError(f"{scenario.source}: --readers is for a scenario with [embargo]")
    if readers < 1:
        raise ScenarioError("--readers must be at least 1")
    embargo = dataclasses.replace(scenario.embargo, readers=readers)
    return dataclasses.replace(
        scenario, embargo=embargo, arrival_specs=(embargo.prefetch_arrivals(),)
    )


def _check_ssm(env: Mapping[str, str], source: str) -> None:
    """A relay carries source-specific channels only (docs/multicast.md): with AMT
    readers, a control group or channel base the scenario sets must be in 232/8 (unset,
    the run picks 232/8 ones, `pressrun.emulate.amt`)."""
    for key in ("PRESSRUN_MULTICAST_CONTROL_GROUP", "PRESSRUN_MULTICAST_GROUP_BASE"):
        value = env.get(key)
        if value is not None and not value.startswith("232."):
            why = "an AMT relay carries source-specific channels only"
            raise _err(source, f"env.{key}", f"must be in 232.0.0.0/8 with [amt_readers] "
                       f"({why}), got {value!r}")  # fmt: skip


def _browser_readers(table: Any, links: Sequence[ClientLink], source: str) -> BrowserReaders | None:
    """The ``[browser_readers]`` table: a link by name (default: the first mobile
    one, else the first), the most seconds a phone keeps the app open after its
    download, and its own arrival tables."""
    if table is None:
        return None
    where = "browser_readers"
    if not isinstance(table, dict):
        raise _err(source, where, "must be a table")
    _unknown(table, _BROWSERS, source, where)
    mobile = next((lk for lk in links if lk.profile == "mobile"), links[0])
    link = _fleet_link(table, links, source, where, mobile)
    specs = _arrival_specs(table.get("arrivals", []), source, f"{where}.arrivals")
    if not specs:
        raise _err(source, f"{where}.arrivals", "at least one arrivals table is needed")
    seed_s = _number(table, "seed_s", 60.0, source, where)
    return BrowserReaders(link=link, seed_s=seed_s, arrival_specs=tuple(specs))
