"""Scenario files: TOML in, a validated `Scenario` out, with errors that say what to fix.

A scenario names its servers, assets, arrival patterns, failures, the balancer's
polling and the client model. docs/simulator.md documents every field with an example;
the built-in scenarios live in `pressrun/sim/scenarios/*.toml`. The arrival patterns
are `pressrun.sim.arrivals`, the checks of each field `pressrun.sim.scenario_checks`.
"""

from __future__ import annotations

import random
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pressrun.sim.arrivals import Arrival, _expand_arrivals, expand_arrivals
from pressrun.sim.model import AssetSpec, ServerSpec
from pressrun.sim.scenario_checks import (
    REQUEST_CLASSES,
    ScenarioError,
    _array,
    _check_keys,
    _err,
    _flag,
    _number,
    _request_class,
    _table,
)

# Where they were before the split (the emulation and the tests import them here).
__all__ = [
    "REQUEST_CLASSES",
    "Arrival",
    "BalancerSetup",
    "ClientModel",
    "Failure",
    "Scenario",
    "ScenarioError",
    "builtin_names",
    "expand_arrivals",
    "load_scenario",
    "parse_scenario",
]


@dataclass(frozen=True, slots=True)
class BalancerSetup:
    """How the simulated balancer polls (passed to `BalancerConfig`) and its algorithm params."""

    poll_interval_s: float = 1.0
    stale_after_s: float = 3.5
    status_delay_s: float = 0.01
    poll_timeout_s: float = 1.0
    retry_after_s: float = 2.0
    params: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    tell_needs: bool = True
    #: the balancer and the origins know each request's class (the asset's
    #: `request_class`): the balancer places it by `class_policies`
    #: (`BalancerConfig.class_policies`), an origin serves small objects first;
    #: False: no class is told, every request goes through the algorithm and shares
    #: the origins' links alike
    classes: bool = False
    class_policies: Mapping[str, str] = field(default_factory=dict)
    #: HAProxy's health counts (`pressrun.balancer.health.HealthConfig`); the
    #: default, 1/1/0, is one poll decides (the rule before issue 30)
    rise: int = 1
    fall: int = 1
    slowstart_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClientModel:
    """How clients behave.

    stall_tolerance_s: total stall after which a play-through counts as failed.
    failover_stall_s: 0 is the paper's harness (a client stays where it was sent);
        > 0 is pressrun's client: after this much stall on one origin, or when the
        origin drops it, it asks again naming that origin (`failed=`, WSDM of 003).
    max_wait_s: a client refused ("full") retries after the balancer's Retry-After
        until this long after its first request, then gives up.
    rtt_s: client <-> balancer and client <-> server round trip.
    first_chunk_bytes: what must arrive before the first byte counts as delivered
        for the time-to-first-byte metric (a player's first segment).
    max_failovers: a client gives up after failing over this many times (pressrun's
        client stops after 8 failures without progress: `max_attempts_without_progress`).
    access_bytes_per_s: a download client's access link, one of these rates ...
    access_weights: ... drawn with these weights (default: equal).
    tells_balancer: a download client names in each directive request the bytes it
        already has (it resumes), the file's size and its link's rate (``have=``,
        ``size=``, ``rate=``: `ClientHint`), as pressrun's client does; False: only the
        issue and ``failed=``.
    """

    stall_tolerance_s: float = 10.0
    failover_stall_s: float = 0.0
    max_wait_s: float = 60.0
    rtt_s: float = 0.002
    first_chunk_bytes: float = 65536.0
    max_failovers: int = 8
    access_bytes_per_s: tuple[float, ...] = (12.5e6,)
    access_weights: tuple[float, ...] = (1.0,)
    tells_balancer: bool = True


@dataclass(frozen=True, slots=True)
class Failure:
    """A server down at `down_at_s` (dropping its clients), back at `up_at_s`.

    With `flap_every` (N >= 2) the server does not go down: from `down_at_s` to
    `up_at_s` (or the end) every N-th poll of its /stats fails while it keeps serving
    (a flapping origin, for the balancer's rise/fall)."""

    server: str
    down_at_s: float
    up_at_s: float | None
    flap_every: int | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A complete, validated scenario."""

    name: str
    description: str
    duration_s: float
    tick_s: float
    servers: tuple[ServerSpec, ...]
    assets: tuple[AssetSpec, ...]
    arrival_specs: tuple[Mapping[str, Any], ...]
    failures: tuple[Failure, ...]
    balancer: BalancerSetup
    clients: ClientModel
    source: str

    def arrivals(self, rng: random.Random) -> list[Arrival]:
        """Every request of the scenario, in time order (random parts drawn from `rng`)."""
        out: list[Arrival] = []
        for i, spec in enumerate(self.arrival_specs):
            out.extend(_expand_arrivals(spec, rng, f"arrivals[{i}]", self.source))
        out.sort(key=lambda a: a.at_s)
        return out

    def with_classes(self, classes: bool | None) -> Scenario:
        """This scenario with request classes told (True) or not (False; None:
        unchanged): `--classes on|off`."""
        if classes is None:
            return self
        return replace(self, balancer=replace(self.balancer, classes=classes))

    def with_failover_stall(self, stall_s: float | None) -> Scenario:
        """This scenario with its clients' `failover_stall_s` replaced (None: unchanged;
        0 is the paper's harness, > 0 pressrun's client: `--failover-stall-s`)."""
        if stall_s is None:
            return self
        return replace(self, clients=replace(self.clients, failover_stall_s=stall_s))


# --- loading ------------------------------------------------------------------


def builtin_names() -> list[str]:
    """The built-in scenario names (files in pressrun/sim/scenarios)."""
    root = resources.files("pressrun.sim") / "scenarios"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a TOML file by path."""
    from pressrun.sim.mixed_classes import BUILDERS

    builder = BUILDERS.get(name_or_path)
    if builder is not None:
        return builder()
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ScenarioError(f"scenario file {name_or_path} does not exist")
        text = path.read_text(encoding="utf-8")
        source = str(path)
    else:
        res = resources.files("pressrun.sim") / "scenarios" / f"{name_or_path}.toml"
        if not res.is_file():
            choices = ", ".join(builtin_names() + sorted(BUILDERS))
            raise ScenarioError(
                f"no built-in scenario {name_or_path!r} and no such file; "
                f"built-in scenarios: {choices}"
            )
        text = res.read_text(encoding="utf-8")
        source = f"built-in {name_or_path}"
    base = path.parent if path.exists() else Path.cwd()
    return parse_scenario(text, source=source, base_dir=base)


def parse_scenario(
    text: str, *, source: str = "<string>", base_dir: Path | None = None
) -> Scenario:
    """Parse and validate scenario TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    return _build(doc, source, base_dir or Path.cwd())


_TOP_KEYS = {
    "name",
    "description",
    "duration_s",
    "tick_s",
    "balancer",
    "clients",
    "servers",
    "assets",
    "arrivals",
    "failures",
    "popularity",
}


def _expand(
    items: list[Mapping[str, Any]], source: str, what: str
) -> list[tuple[str, dict[str, Any]]]:
    """Entries with `count = N` become N entries named name-1 .. name-N."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(items):
        where = f"{what}[{i}]"
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise _err(source, where, "needs a non-empty string 'name'")
        body = dict(item)
        body.pop("name")
        count = body.pop("count", None)
        if count is None:
            out.append((name, body))
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _err(source, f"{where}.count", f"must be a positive integer, got {count!r}")
        for k in range(1, count + 1):
            out.append((f"{name}-{k}", body))
    return out


def _build(doc: Mapping[str, Any], source: str, base_dir: Path) -> Scenario:
    _check_keys(doc, _TOP_KEYS, source, "top level")
    name = doc.get("name", "unnamed")
    if not isinstance(name, str):
        raise _err(source, "name", "must be a string")
    description = str(doc.get("description", ""))
    duration = _number(doc, "duration_s", None, source, "top level", positive=True)
    tick = _number(doc, "tick_s", 1.0, source, "top level", positive=True)

    bal = _table(doc, "balancer", source)
    _check_keys(
        bal,
        {
            "poll_interval_s",
            "stale_after_s",
            "status_delay_s",
            "poll_timeout_s",
            "retry_after_s",
            "params",
            "tell_needs",
            "classes",
            "class_policies",
            "rise",
            "fall",
            "slowstart_s",
        },
        source,
        "balancer",
    )
    policies_doc = bal.get("class_policies", {})
    if not isinstance(policies_doc, dict) or not all(
        isinstance(v, str) for v in policies_doc.values()
    ):
        raise _err(source, "balancer.class_policies", "must be a table of policy names")
    params_doc = bal.get("params", {})
    if not isinstance(params_doc, dict):
        raise _err(source, "balancer.params", "must be a table of tables, one per algorithm")
    params: dict[str, dict[str, float]] = {}
    for alg, table in params_doc.items():
        if not isinstance(table, dict):
            raise _err(source, f"balancer.params.{alg}", "must be a table of numbers")
        params[alg] = {
            k: _number(table, k, None, source, f"balancer.params.{alg}", minimum=None)
            for k in table
        }
    poll = _number(bal, "poll_interval_s", 1.0, source, "balancer", positive=True)
    balancer = BalancerSetup(
        poll_interval_s=poll,
        stale_after_s=_number(
            bal, "stale_after_s", max(3.5, 3.5 * poll), source, "balancer", positive=True
        ),
        status_delay_s=_number(bal, "status_delay_s", 0.01, source, "balancer"),
        poll_timeout_s=_number(bal, "poll_timeout_s", 1.0, source, "balancer", positive=True),
        retry_after_s=_number(bal, "retry_after_s", 2.0, source, "balancer", positive=True),
        params=params,
        tell_needs=_flag(bal, "tell_needs", True, source, "balancer"),
        classes=_flag(bal, "classes", False, source, "balancer"),
        class_policies=dict(policies_doc),
        rise=int(_number(bal, "rise", 1.0, source, "balancer", minimum=1.0)),
        fall=int(_number(bal, "fall", 1.0, source, "balancer", minimum=1.0)),
        slowstart_s=_number(bal, "slowstart_s", 0.0, source, "balancer"),
    )
    if balancer.stale_after_s <= balancer.poll_interval_s:
        raise _err(source, "balancer.stale_after_s", "must be longer than poll_interval_s")

    cl = _table(doc, "clients", source)
    allowed_client = {f.name for f in fields(ClientModel)}
    _check_keys(cl, allowed_client, source, "clients")
    lists = ("access_bytes_per_s", "access_weights")
    client_kwargs: dict[str, Any] = {
        k: _number(cl, k, None, source, "clients")
        for k in cl
        if k not in lists and k != "tells_balancer"
    }
    if "tells_balancer" in cl:
        client_kwargs["tells_balancer"] = _flag(cl, "tells_balancer", True, source, "clients")
    if "max_failovers" in client_kwargs:
        client_kwargs["max_failovers"] = int(client_kwargs["max_failovers"])
    for key in lists:
        if key in cl:
            value = cl[key]
            if not isinstance(value, list):
                value = [value]
            client_kwargs[key] = tuple(
                _number({key: v}, key, None, source, "clients", positive=True) for v in value
            )
    if "access_bytes_per_s" in client_kwargs and "access_weights" not in client_kwargs:
        client_kwargs["access_weights"] = (1.0,) * len(client_kwargs["access_bytes_per_s"])
    clients = ClientModel(**client_kwargs)
    if len(clients.access_weights) != len(clients.access_bytes_per_s):
        raise _err(source, "clients.access_weights", "needs one weight per access_bytes_per_s rate")

    # assets
    asset_items = _expand(_array(doc, "assets", source), source, "assets")
    if not asset_items:
        raise _err(source, "assets", "at least one [[assets]] entry is needed")
    pop = _table(doc, "popularity", source)
    _check_keys(pop, {"law", "s"}, source, "popularity")
    law = pop.get("law", "weights")
    if law not in ("weights", "zipf", "uniform"):
        raise _err(source, "popularity.law", f"must be 'weights', 'zipf' or 'uniform', got {law!r}")
    zipf_s = _number(pop, "s", 1.0, source, "popularity")
    allowed_asset = {
        "bitrate_bytes_per_s",
        "duration_s",
        "popularity",
        "count",
        "size_bytes",
        "deadline_s",
        "request_class",
    }
    assets: list[AssetSpec] = []
    for rank, (aname, body) in enumerate(asset_items, start=1):
        where = f"assets.{aname}"
        _check_keys(body, allowed_asset, source, where)
        if law == "zipf":
            weight = 1.0 / rank**zipf_s
        elif law == "uniform":
            weight = 1.0
        else:
            weight = _number(body, "popularity", 1.0, source, where)
        assets.append(
            AssetSpec(
                aname,
                bitrate_bytes_per_s=_number(
                    body, "bitrate_bytes_per_s", 100_000.0, source, where, positive=True
                ),
                duration_s=_number(body, "duration_s", 600.0, source, where, positive=True),
                popularity=weight,
                download_bytes=(
                    _number(body, "size_bytes", None, source, where, positive=True)
                    if "size_bytes" in body
                    else None
                ),
                deadline_s=_number(body, "deadline_s", 600.0, source, where, positive=True),
                request_class=_request_class(body.get("request_class"), source, where),
            )
        )
    asset_names = {a.name for a in assets}
    if len(asset_names) != len(assets):
        raise _err(source, "assets", "asset names must be unique")
    if sum(a.popularity for a in assets) <= 0:
        raise _err(source, "assets", "popularities must not all be 0")

    # servers
    server_items = _expand(_array(doc, "servers", source), source, "servers")
    if not server_items:
        raise _err(source, "servers", "at least one [[servers]] entry is needed")
    numeric = {
        f.name
        for f in fields(ServerSpec)
        if f.name not in ("name", "assets", "cached", "told_bytes_per_s", "crash_ram_fraction")
    }
    servers: list[ServerSpec] = []
    for sname, body in server_items:
        where = f"servers.{sname}"
        _check_keys(
            body,
            numeric | {"assets", "cached", "told_bytes_per_s", "crash_ram_fraction", "count"},
            source,
            where,
        )
        kwargs: dict[str, Any] = {}
        for key in numeric:
            if key in body:
                kwargs[key] = _number(
                    body,
                    key,
                    None,
                    source,
                    where,
                    positive=key in ("cores", "ram_bytes", "link_bytes_per_s"),
                )
        for key in ("told_bytes_per_s", "crash_ram_fraction"):
            if key in body:
                kwargs[key] = _number(body, key, None, source, where, positive=True)
        for key in ("assets", "cached"):
            if key in body:
                value = body[key]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise _err(source, f"{where}.{key}", "must be a list of asset names")
                missing = sorted(set(value) - asset_names)
                if missing:
                    raise _err(source, f"{where}.{key}", f"unknown asset(s) {', '.join(missing)}")
                kwargs[key] = tuple(value)
        if kwargs.get("cpu_idle", 0.0) >= 1.0 or kwargs.get("ram_idle", 0.0) >= 1.0:
            raise _err(source, where, "cpu_idle and ram_idle are fractions and must be < 1")
        servers.append(ServerSpec(sname, **kwargs))
    if len({s.name for s in servers}) != len(servers):
        raise _err(source, "servers", "server names must be unique")
    held = set()
    for s in servers:
        held |= set(s.assets) if s.assets is not None else asset_names
    orphans = sorted(asset_names - held)
    if orphans:
        raise _err(source, "assets", f"no server holds {', '.join(orphans)}")

    # arrivals
    arrival_specs = _array(doc, "arrivals", source)
    if not arrival_specs:
        raise _err(source, "arrivals", "at least one [[arrivals]] entry is needed")
    checked: list[dict[str, Any]] = []
    for i, spec in enumerate(arrival_specs):
        item = dict(spec)
        where = f"arrivals[{i}]"
        asset = item.get("asset")
        if asset is not None and asset not in asset_names:
            raise _err(source, f"{where}.asset", f"unknown asset {asset!r}")
        if item.get("kind") == "log" and "path" in item:
            p = Path(str(item["path"]))
            item["path"] = str(p if p.is_absolute() else base_dir / p)
        _expand_arrivals(item, random.Random(0), where, source, validate_only=True)
        checked.append(item)

    # failures
    failures: list[Failure] = []
    server_names = {s.name for s in servers}
    for i, f in enumerate(_array(doc, "failures", source)):
        where = f"failures[{i}]"
        _check_keys(f, {"server", "down_at_s", "up_at_s", "flap_every"}, source, where)
        if f.get("server") not in server_names:
            raise _err(source, f"{where}.server", f"unknown server {f.get('server')!r}")
        down = _number(f, "down_at_s", None, source, where)
        up = _number(f, "up_at_s", -1.0, source, where, minimum=None)
        if up >= 0 and up <= down:
            raise _err(source, f"{where}.up_at_s", "must be after down_at_s")
        flap = _number(f, "flap_every", 0.0, source, where)
        if flap and (flap < 2 or flap != int(flap)):
            raise _err(source, f"{where}.flap_every", "must be a whole number, 2 or more")
        failures.append(Failure(str(f["server"]), down, up if up >= 0 else None, int(flap) or None))

    return Scenario(
        name=name,
        description=description,
        duration_s=duration,
        tick_s=tick,
        servers=tuple(servers),
        assets=tuple(assets),
        arrival_specs=tuple(checked),
        failures=tuple(failures),
        balancer=balancer,
        clients=clients,
        source=source,
    )
