"""What the host reads from the running services over HTTP: the balancer ready, the
origins' egress, the sender's bytes and the directives by mode once a second, and each
tracker instance's view of the swarm and of its Chord ring; and, beside them, the
host's CPU (`pressrun.emulate.cpu_use`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from pressrun.emulate.engine import DockerCommandError
from pressrun.emulate.project import (
    ORIGINS,
    SUPERNODE_PORT,
    SUPERNODES,
    TRACKERS,
    ComposeProject,
    EmulationError,
)

SAMPLE_INTERVAL_S = 1.0


async def _poll(
    url: str,
    ready: Callable[[aiohttp.ClientResponse], Awaitable[str | None]],
    timeout_s: float,
    what: str,
) -> None:
    """GET ``url`` every 0.5 s until ``ready`` (the answer's check: None when ready,
    else what is still missing) passes, or `EmulationError` naming ``what`` and the
    last answer after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while loop.time() < deadline:
            try:
                async with http.get(url) as resp:
                    missing = await ready(resp)
                if missing is None:
                    return
                last = missing
            except (aiohttp.ClientError, OSError, ValueError, KeyError) as err:
                last = str(err) or type(err).__name__
            await asyncio.sleep(0.5)
    raise EmulationError(f"{what} in {timeout_s:g} s ({last})")


async def wait_healthy(url: str, timeout_s: float) -> None:
    """Until ``url`` (a service's /healthz) answers 200, or `EmulationError`."""

    async def ok(resp: aiohttp.ClientResponse) -> str | None:
        return None if resp.status == 200 else f"HTTP {resp.status}"

    await _poll(url, ok, timeout_s, f"{url} did not answer")


async def wait_balancer_ready(url: str, issue_id: str, timeout_s: float) -> None:
    """Until every origin the balancer at ``url`` lists is up and holds ``issue_id``."""

    async def all_up(resp: aiohttp.ClientResponse) -> str | None:
        doc = await resp.json()
        held = [
            o for o in doc["origins"]
            if o.get("state") == "up"
            and issue_id in (o.get("status") or {}).get("issues", [])
        ]  # fmt: skip
        if len(held) == len(doc["origins"]):
            return None
        return f"{len(held)} of {len(doc['origins'])} origins up with {issue_id}"

    await _poll(f"{url}/v1/origins", all_up, timeout_s, "the balancer was not ready")


async def _metric_totals(
    http: aiohttp.ClientSession, url: str, family_name: str, label: str | None = None
) -> dict[str, int]:
    """The ``_total`` samples of one counter family of a service's /metrics, summed
    by ``label``'s value (everything under "" without a label)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    totals: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.labels.get(label, "?") if label is not None else ""
                totals[key] = totals.get(key, 0) + int(sample.value)
    return totals


async def sample_egress(
    addresses: Mapping[str, str],
    series: dict[str, list[tuple[float, int]]],
    t0: float,
    sender_url: str | None = None,
    sender: list[tuple[float, int]] | None = None,
    balancer_url: str | None = None,
    directives: list[tuple[float, dict[str, int]]] | None = None,
) -> None:
    """Every second, each origin's ``bytes_sent_total``, the sender's bytes and the
    balancer's directives by mode (until cancelled)."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while True:
            if sender_url is not None and sender is not None:
                with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, TimeoutError):
                    totals = await _metric_totals(http, sender_url, "pressrun_multicast_bytes_sent")
                    sender.append((loop.time() - t0, sum(totals.values())))
            if balancer_url is not None and directives is not None:
                with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, TimeoutError):
                    counts = await _metric_totals(
                        http, balancer_url, "pressrun_balancer_directives", label="mode"
                    )
                    directives.append((loop.time() - t0, counts))
            for name, ip in addresses.items():
                try:
                    async with http.get(f"http://{ip}:{ORIGINS[name]}/stats") as resp:
                        doc = await resp.json()
                    series[name].append((loop.time() - t0, int(doc["bytes_sent_total"])))
                except (aiohttp.ClientError, OSError, ValueError, KeyError, TimeoutError):
                    pass  # a cut or dead origin: its series just stops growing
            await asyncio.sleep(SAMPLE_INTERVAL_S)


async def wait_prepared(sender_url: str, issue_id: str, timeout_s: float) -> None:
    """Until the multicast sender has encoded the issue for its carousel (its
    ``/healthz`` lists it in ``prepared``): the sender does it as soon as the issue is
    published, so a carousel start at the peak costs no encoding."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, TimeoutError):
                async with http.get(f"{sender_url}/healthz") as resp:
                    if issue_id in (await resp.json()).get("prepared", []):
                        return
            if loop.time() > deadline:
                raise EmulationError(
                    f"the multicast sender did not prepare {issue_id} within {timeout_s:g} s"
                )
            await asyncio.sleep(0.5)


async def tracker_views(project: ComposeProject, info_hash_hex: str) -> dict[str, Any]:
    """What each tracker instance says about the issue's swarm (shared Redis state) and
    its Chord ring (``ring``: the supernodes registered, or why none)."""
    views: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        for name, port in TRACKERS.items():
            try:
                ip = await asyncio.to_thread(project.address, name)
                url = f"http://{ip}:{port}/v1/swarms/{info_hash_hex}"
                token = project.env.get("PRESSRUN_OPERATOR_TOKEN", "")
                headers = {"Authorization": f"Bearer {token}"}
                async with http.get(url, headers=headers) as resp:
                    views[name] = (
                        await resp.json() if resp.status == 200 else {"http_status": resp.status}
                    )
                views[name]["ring"] = await _ring_view(http, f"http://{ip}:{port}", info_hash_hex)
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError,
                    EmulationError, DockerCommandError) as err:  # fmt: skip
                views[name] = {"unreachable": str(err) or type(err).__name__}
    return views


async def _ring_view(http: aiohttp.ClientSession, tracker: str, info_hash_hex: str) -> Any:
    """The tracker's Chord ring of the issue: its supernodes, or the HTTP status."""
    async with http.get(f"{tracker}/v1/ring/{info_hash_hex}") as resp:
        if resp.status != 200:
            return {"http_status": resp.status}
        doc = await resp.json()
    return {"supernodes": doc.get("supernodes", [])}


async def wait_ring(
    project: ComposeProject, info_hash_hex: str, expected: int, timeout_s: float
) -> dict[str, Any]:
    """Until every tracker instance's ring of the issue lists the same ``expected``
    supernodes (they register with tracker-1 only: tracker-2 knows them from the
    store the instances share); tracker-1's view, and each instance's in ``by_tracker``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    ips = {name: await asyncio.to_thread(project.address, name) for name in TRACKERS}
    views: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, TimeoutError):
                for name, port in TRACKERS.items():
                    tracker = f"http://{ips[name]}:{port}"
                    views[name] = await _ring_view(http, tracker, info_hash_hex)
                rings = [_ring_members(v) for v in views.values()]
                if len(rings[0]) >= expected and all(r == rings[0] for r in rings):
                    return {**views["tracker-1"], "by_tracker": views}
            await asyncio.sleep(1.0)
    raise EmulationError(
        f"the supernodes were not on every tracker instance's ring in {timeout_s:g} s "
        f"(their rings: {views})"
    )


async def supernode_states(project: ComposeProject) -> dict[str, Any]:
    """Each supernode's ``/chord/v1/state``: its phase and ring neighbours, the piece
    keys it answers for, ``uploader_answers`` (the uploaders it chose for peers) and
    ``nodes_failed`` (ring nodes it found dead and routed around); a dead or cut one
    as ``unreachable``."""
    states: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        for name in SUPERNODES:
            try:
                ip = await asyncio.to_thread(project.address, name)
                async with http.get(f"http://{ip}:{SUPERNODE_PORT}/chord/v1/state") as resp:
                    states[name] = await resp.json()
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError,
                    EmulationError, DockerCommandError) as err:  # fmt: skip
                states[name] = {"unreachable": str(err) or type(err).__name__}
    return states


async def wait_supernodes_on_ring(project: ComposeProject, timeout_s: float) -> dict[str, Any]:
    """Each supernode's state once every one of them has joined the Chord ring
    (phase ``on_ring``; registered with the tracker is not yet joined), or as it is
    after ``timeout_s`` (the caller reports a supernode still joining)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        states = await supernode_states(project)
        if all(s.get("phase") == "on_ring" for s in states.values()) or loop.time() > deadline:
            return states
        await asyncio.sleep(1.0)


def _ring_members(view: Any) -> list[tuple[str, str]]:
    """A ring view's supernodes as sorted (id, address) pairs (to compare two views)."""
    nodes = view.get("supernodes", []) if isinstance(view, dict) else []
    return sorted((str(n.get("id")), str(n.get("address"))) for n in nodes)


def trackers_agree(views: dict[str, Any]) -> dict[str, bool]:
    """Whether the tracker instances list the same swarm (peers, completed) and the
    same ring of supernodes: the state they share through the one store."""
    answered = [v for v in views.values() if "unreachable" not in v and "http_status" not in v]
    if len(answered) < 2:
        return {"instances": False, "swarm": False, "ring": False}
    swarms = [
        (v.get("completed"), sorted(json.dumps(p, sort_keys=True) for p in v.get("peers", [])))
        for v in answered
    ]
    rings = [_ring_members(v.get("ring")) for v in answered]
    return {
        "instances": True,
        "swarm": all(s == swarms[0] for s in swarms),
        "ring": bool(rings[0]) and all(r == rings[0] for r in rings),
    }
