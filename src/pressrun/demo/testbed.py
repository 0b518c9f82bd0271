"""The test bed: origins shaped like machines A, B and C, the services' command
lines, and `Testbed`, the in-process or child-process set-up of the integration tests.

The origins are shaped like the machines of 000_9aae53f3113e9bd8.txt (section 5):

- **A** a dedicated, powerful server: gigabit stated, no cap;
- **B** a shared server with background tasks: gigabit stated, and a real CPU burner
  process (`pressrun.demo.processes.start_cpu_burner`) beside it;
- **C** an underpowered remote machine with a small link: a real token-bucket egress
  cap of 24 Mbit/s (3 MB/s) on all its transfers, stated correctly to the balancer (as
  in the paper's waves-2 / burst-2 re-runs).

`origin_args`, `tracker_args` and `balancer_args` are the ``pressrun serve ...``
arguments of each service, so the demo, `Testbed` and the compose emulation start the
same topology.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pressrun.demo.processes import ServiceProcess

if TYPE_CHECKING:
    from pressrun.balancer.aio import RunningBalancer
    from pressrun.content.publish import SubscriberDirectory
    from pressrun.origin.aio import RunningOrigin

DEMO_ISSUE = "weekly-2026-47"

#: the balancer's swarm thresholds in the demo (estimated concurrent downloaders, from
#: directive requests: each adds tau/typical = 3 with the defaults); low, so that the
#: first wave's requests push the issue into swarm mode and later waves get it
DEMO_SWARM_ENTER = 24.0
DEMO_SWARM_LEAVE = 4.0
#: the multicast level (docs/multicast.md): above the swarm's, so the later clients of
#: the demo, arriving while the first waves' requests still count, go to the carousel
DEMO_MULTICAST_ENTER = 30.0
DEMO_MULTICAST_LEAVE = 12.0
DEMO_MIN_DWELL_S = 3.0
#: the sender's channels in the demo: two of 40 Mbit/s
DEMO_MULTICAST_CHANNELS = 2
DEMO_MULTICAST_RATE_MBPS = 40.0


@dataclass(frozen=True)
class OriginShape:
    """One origin of a test bed: its name, stated capacity, real cap, content."""

    name: str
    capacity_mbps: float = 1000.0
    egress_cap_mbps: float | None = None
    content_dir: Path | None = None  # None: the test bed's shared folder
    description: str = ""
    #: worker processes (`serve origin --workers`): one, so that an origin is one
    #: process, as the test bed's machines share one host's cores and its tests freeze
    #: (SIGSTOP) or kill an origin by its process (`serve origin` alone takes one per CPU)
    workers: int = 1


#: Machines A, B and C of 000_9aae53f3113e9bd8.txt.
DEMO_SHAPES = (
    OriginShape("origin-a", 1000.0, None, description="A: dedicated, gigabit"),
    OriginShape("origin-b", 1000.0, None, description="B: shared, CPU burner beside it"),
    OriginShape("origin-c", 24.0, 24.0, description="C: small link, 3 MB/s cap"),
)


def origin_args(shape: OriginShape, content: Path, stats_interval_s: float) -> list[str]:
    """``pressrun serve`` arguments of one origin shaped like ``shape``, on port 0."""
    args = [
        "origin",
        "--content",
        str(content),
        "--port",
        "0",
        "--name",
        shape.name,
        "--capacity-mbps",
        f"{shape.capacity_mbps:g}",
        "--stats-interval-s",
        f"{stats_interval_s:g}",
        "--shutdown-grace-s",
        "0",
        "--workers",
        str(shape.workers),
    ]
    if shape.egress_cap_mbps is not None:
        args += ["--egress-cap-mbps", f"{shape.egress_cap_mbps:g}"]
    return args


def tracker_args(db: Path, content: Path, publisher_key: Path) -> list[str]:
    """``pressrun serve`` arguments of the demo's tracker, on port 0; it serves only
    the issues published (signed with ``publisher_key``) in ``content``."""
    return [
        "tracker",
        "--port",
        "0",
        "--db",
        str(db),
        "--interval-s",
        "2",
        "--min-interval-s",
        "1",
        "--content",
        str(content),
        "--publisher-key",
        str(publisher_key),
    ]


def multicast_args(content: Path, key: Path, control_group: str, group_base: str) -> list[str]:
    """``pressrun serve`` arguments of the demo's multicast sender (API on port 0; its
    token in ``PRESSRUN_MULTICAST_TOKEN``), sending on 127.0.0.1."""
    return [
        "multicast",
        "--content",
        str(content),
        "--key",
        str(key),
        "--control-group",
        control_group,
        "--group-base",
        group_base,
        "--interface",
        "127.0.0.1",
        "--channels",
        str(DEMO_MULTICAST_CHANNELS),
        "--rate-mbps",
        f"{DEMO_MULTICAST_RATE_MBPS:g}",
    ]


def balancer_args(
    origins: dict[str, str],
    tracker_url: str | None,
    multicast: tuple[str, str] | None = None,
    *,
    algorithm: str | None = None,
) -> list[str]:
    """``pressrun serve`` arguments of the demo's balancer (port 0) over ``origins``
    (name -> URL) with ``algorithm`` (default: the service's default, what an operator
    gets); with a tracker URL, swarm mode at the demo's thresholds;
    with ``multicast`` (the sender's API URL and control group), the multicast level
    (the sender's token in ``PRESSRUN_MULTICAST_TOKEN``)."""
    swarm_args: list[str] = []
    if tracker_url is not None:
        swarm_args = [
            "--tracker",
            f"{tracker_url}/announce",
            "--swarm-enter-downloaders",
            f"{DEMO_SWARM_ENTER:g}",
            "--swarm-leave-downloaders",
            f"{DEMO_SWARM_LEAVE:g}",
        ]
    if multicast is not None:
        sender_url, control_group = multicast
        swarm_args += [
            # a mode is kept 3 s (not 30): the demo's crowd peaks within seconds
            "--swarm-min-dwell-s",
            f"{DEMO_MIN_DWELL_S:g}",
            "--multicast-sender",
            sender_url,
            "--multicast-control-group",
            control_group,
            "--multicast-interface",
            "127.0.0.1",
            "--multicast-enter-downloaders",
            f"{DEMO_MULTICAST_ENTER:g}",
            "--multicast-leave-downloaders",
            f"{DEMO_MULTICAST_LEAVE:g}",
        ]
    return [
        "balancer",
        *swarm_args,
        "--origins",
        ",".join(f"{name}={url}" for name, url in origins.items()),
        "--algorithm",
        algorithm or default_algorithm(),
        "--port",
        "0",
        "--poll-interval-s",
        "0.5",
        "--seed",
        "47",
    ]


def default_algorithm() -> str:
    """The balancer service's default algorithm (what an operator gets)."""
    from pressrun.balancer.config import BalancerConfig

    return BalancerConfig().algorithm


async def wait_for_directive(balancer_url: str, issue_id: str, timeout_s: float) -> None:
    """Until the balancer answers a directive for the issue (all origins polled)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            try:
                async with http.get(f"{balancer_url}/v1/origins") as resp:
                    doc = await resp.json()
                up = [o for o in doc["origins"] if o.get("state") == "up"]
                held = [o for o in up if issue_id in (o.get("status") or {}).get("issues", [])]
                if len(held) == len(doc["origins"]):
                    return
                last = f"{len(held)} of {len(doc['origins'])} origins up with the issue"
            except (aiohttp.ClientError, OSError, ValueError, KeyError) as err:
                last = str(err)
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the balancer did not see every origin in {timeout_s:g} s ({last})")


@dataclass
class Testbed:
    """Origins and a balancer on 127.0.0.1 for the demo and the integration tests.

    Use as ``async with Testbed(root, shapes) as bed:``; ``await bed.publish(...)`` a
    sample issue, ``await bed.start_balancer()``, then point clients at
    ``bed.balancer.url``. Everything started is stopped on exit. With
    ``processes=True`` each origin is a ``pressrun serve origin`` child process, so
    `kill_origin` is a real SIGKILL (connections reset mid-transfer); otherwise they
    run in this event loop through `start_origin`.
    """

    __test__ = False  # not a pytest test class

    root: Path
    shapes: tuple[OriginShape, ...]
    poll_interval_s: float = 0.5
    poll_timeout_s: float | None = None
    processes: bool = False
    origins: dict[str, RunningOrigin] = field(default_factory=dict)
    origin_processes: dict[str, ServiceProcess] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    balancer: RunningBalancer | None = None

    @property
    def content_dir(self) -> Path:
        """The shared content folder."""
        return self.root / "content"

    def content_of(self, name: str) -> Path:
        """The content folder an origin serves."""
        shape = next(s for s in self.shapes if s.name == name)
        return shape.content_dir or self.content_dir

    async def __aenter__(self) -> Testbed:
        self.content_dir.mkdir(parents=True, exist_ok=True)
        try:
            for shape in self.shapes:
                await self._start_origin(shape)
        except BaseException:
            await self.close()
            raise
        return self

    async def _start_origin(self, shape: OriginShape) -> None:
        from pressrun.origin import OriginConfig, start_origin

        content = shape.content_dir or self.content_dir
        content.mkdir(parents=True, exist_ok=True)
        if self.processes:
            proc = await ServiceProcess.start(
                shape.name, origin_args(shape, content, self.poll_interval_s)
            )
            self.origin_processes[shape.name] = proc
            self.urls[shape.name] = proc.url
            return
        running = await start_origin(
            OriginConfig(
                content_dir=content,
                name=shape.name,
                capacity_mbps=shape.capacity_mbps,
                egress_cap_mbps=shape.egress_cap_mbps,
                stats_interval_s=self.poll_interval_s,
                shutdown_grace_s=0.0,
            )
        )
        self.origins[shape.name] = running
        self.urls[shape.name] = running.url

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the balancer and every origin still running."""
        if self.balancer is not None:
            await self.balancer.stop()
            self.balancer = None
        for name in list(self.urls):
            await self.stop_origin(name)

    async def stop_origin(self, name: str) -> None:
        """Stop one origin cleanly (in-process: transfers are cut after no grace)."""
        self.urls.pop(name, None)
        origin = self.origins.pop(name, None)
        if origin is not None:
            await origin.stop()
        proc = self.origin_processes.pop(name, None)
        if proc is not None:
            await proc.stop()

    async def kill_origin(self, name: str) -> None:
        """SIGKILL an origin child process (``processes=True`` only)."""
        proc = self.origin_processes[name]
        with contextlib.suppress(ProcessLookupError):
            proc.proc.kill()
        await self.stop_origin(name)

    async def stats(self, name: str) -> dict[str, Any]:
        """An origin's ``/stats`` document, over HTTP."""
        import aiohttp

        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.urls[name]}/stats") as resp,
        ):
            doc: dict[str, Any] = await resp.json()
            return doc

    async def publish(
        self,
        data: bytes,
        *,
        issue_id: str,
        key_path: Path,
        file_name: str | None = None,
        piece_size: int | None = None,
        encrypt_for: SubscriberDirectory | None = None,
        release_at: str | None = None,
    ) -> Path:
        """Publish ``data`` as ``issue_id`` into the shared folder, then copy the
        bundle into every origin with a folder of its own; returns the bundle path.
        ``encrypt_for``: publish it encrypted for that directory's subscribers;
        ``piece_size``: the publisher's default unless given; ``release_at``: embargoed
        until then (UTC text, with ``encrypt_for``)."""
        from pressrun.content.publish import DEFAULT_PIECE_SIZE, publish

        source_dir = self.root / "source"
        source_dir.mkdir(exist_ok=True)
        source = source_dir / (file_name or f"{issue_id}.pdf")
        source.write_bytes(data)
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=issue_id,
            title=f"Sample issue {issue_id}",
            key_path=key_path,
            content_dir=self.content_dir,
            web_seeds=list(self.urls.values()),
            piece_size=piece_size or DEFAULT_PIECE_SIZE,
            encrypt_for=encrypt_for,
            force=encrypt_for is not None,
            release_at=release_at,
        )
        for shape in self.shapes:
            if shape.content_dir is not None and shape.content_dir != self.content_dir:
                await asyncio.to_thread(
                    shutil.copytree, bundle, shape.content_dir / issue_id, dirs_exist_ok=True
                )
        return bundle

    async def start_balancer(self, algorithm: str | None = None) -> RunningBalancer:
        """Start the balancer over the running origins and wait until all are up."""
        from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
        from pressrun.balancer.config import BalancerConfig
        from pressrun.balancer.events import OriginSpec

        self.balancer = await start_balancer(
            BalancerServiceConfig(
                origins=tuple(OriginSpec(n, url) for n, url in self.urls.items()),
                balancer=BalancerConfig(
                    poll_interval_s=self.poll_interval_s,
                    stale_after_s=3.5 * self.poll_interval_s,
                    algorithm=algorithm or default_algorithm(),
                ),
                seed=47,
                poll_timeout_s=self.poll_timeout_s,
            )
        )
        await self.balancer.wait_until_up(len(self.urls), timeout_s=10.0)
        # one more poll, so every origin's issue list includes what was just published
        await asyncio.sleep(2 * self.poll_interval_s)
        return self.balancer
