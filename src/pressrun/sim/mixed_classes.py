"""A mixed workload with request classes (issue 33): the crowd, the back catalogue and
the small objects every client fetches, on origins they share.

`mixed_workload()` builds it (built-in scenario ``mixed-classes``; ``mixed-classes-
nocrowd`` is the same without the crowd, the baseline its small objects are compared
with):

- five origins: two of 1 Gbit/s, two of 500 Mbit/s, one of 200 Mbit/s (400 MB/s);
- the new issue (``new``, 120 MB due in 600 s, class ``crowd``) on every origin: 3,000
  clients, half in a burst over 30 s from 10 s, the rest over the next five minutes
  (about 1.2x what the origins can carry in that window; issue 33's access links);
- 200 back issues (``back-001`` .. ``back-200``, 20 to 150 MB due in 900 s, Zipf
  popularity, class ``catalogue``), each held by one to three of the origins (drawn
  from a fixed seed): a trickle of one request every two seconds from 10 s to 700 s
  (the last can finish before the run ends at 1000 s, even at 6 Mbit/s);
- small objects (class ``small``): a manifest (20 kB), a torrent (60 kB), a cover
  (250 kB) and a subscription wrap (2 kB), on every origin, due in 10 s: four per crowd
  client, two per back-catalogue one, at the same pace as they come.

With `classes` the balancer places each class by its policy (`BalancerConfig.
class_policies`: small on the least loaded holder, the crowd by `headroom`, the back
catalogue by grouped weighted round robin over its holders) and the origins send
small objects ahead of bulk; without, every request goes through the algorithm and
shares the links alike. `pressrun sim balancer --scenario mixed-classes [--classes
off]` prints the table per class (docs/simulator.md, "Request classes").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pressrun.sim.generate_crowd import CROWD_ACCESS_BYTES_PER_S, CROWD_ACCESS_WEIGHTS
from pressrun.sim.model import AssetSpec, ServerSpec
from pressrun.sim.scenario import BalancerSetup, ClientModel, Scenario

MBIT = 125_000.0
SMALL_OBJECTS = (("manifest", 20e3), ("torrent", 60e3), ("cover", 250e3), ("wrap", 2e3))
SMALL_DEADLINE_S = 10.0
BACK_ISSUES = 200


def mixed_workload(*, classes: bool = True, crowd: bool = True, scale: float = 1.0) -> Scenario:
    """The mixed workload (module docstring); `scale` multiplies the clients and the
    origins' links alike (a test runs a tenth of it)."""
    rng = random.Random("pressrun-mixed-classes")
    links = (1000, 1000, 500, 500, 200)
    names = [f"o{k}" for k in range(1, len(links) + 1)]
    back = [
        AssetSpec(
            f"back-{k:03d}",
            popularity=1.0 / k,
            download_bytes=rng.uniform(20e6, 150e6),
            deadline_s=900.0,
            request_class="catalogue",
        )
        for k in range(1, BACK_ISSUES + 1)
    ]
    holders: dict[str, list[str]] = {n: [] for n in names}
    for a in back:
        for n in rng.sample(names, rng.randint(1, 3)):
            holders[n].append(a.name)
    small = [
        AssetSpec(
            name,
            download_bytes=size,
            deadline_s=SMALL_DEADLINE_S,
            request_class="small",
        )
        for name, size in SMALL_OBJECTS
    ]
    new = AssetSpec("new", download_bytes=120e6, deadline_s=600.0, request_class="crowd")
    every_origin = [new.name] + [a.name for a in small]
    servers = tuple(
        ServerSpec(
            name,
            cores=32.0,
            cpu_per_client_cores=0.0005,
            link_bytes_per_s=mbit * MBIT * scale,
            ram_bytes=64 * 2**30,
            assets=tuple(every_origin + holders[name]),
        )
        for name, mbit in zip(names, links, strict=True)
    )
    burst = round(1500 * scale)
    tail_per_s = 5.0 * scale
    back_per_s = 0.5 * scale
    arrivals: list[dict[str, Any]] = []
    if crowd:
        arrivals += [
            {"kind": "burst", "count": burst, "at_s": 10.0, "spread_s": 30.0, "asset": "new"},
            {
                "kind": "rate",
                "rate_per_s": tail_per_s,
                "start_s": 40.0,
                "end_s": 340.0,
                "poisson": True,
                "asset": "new",
            },
            # four small objects per crowd client, as they come
            {"kind": "burst", "count": 4 * burst, "at_s": 10.0, "spread_s": 30.0, "class": "small"},
            {
                "kind": "rate",
                "rate_per_s": 4 * tail_per_s,
                "start_s": 40.0,
                "end_s": 340.0,
                "poisson": True,
                "class": "small",
            },
        ]
    arrivals += [
        {
            "kind": "rate",
            "rate_per_s": back_per_s,
            "start_s": 10.0,
            "end_s": 700.0,
            "poisson": True,
            "class": "catalogue",
        },
        {
            "kind": "rate",
            "rate_per_s": 2 * back_per_s,
            "start_s": 10.0,
            "end_s": 700.0,
            "poisson": True,
            "class": "small",
        },
    ]
    name = "mixed-classes" if crowd else "mixed-classes-nocrowd"
    return Scenario(
        name=name,
        description=(
            "issue 33's mixed workload: a crowd on the new issue, a trickle on 200 back "
            "issues held by some origins, small objects from every client"
            + ("" if crowd else " (without the crowd)")
        ),
        duration_s=1000.0,
        tick_s=5.0,
        servers=servers,
        assets=(new, *back, *small),
        arrival_specs=tuple(arrivals),
        failures=(),
        balancer=BalancerSetup(classes=classes),
        clients=ClientModel(
            failover_stall_s=2.0,
            max_wait_s=16.0,
            access_bytes_per_s=CROWD_ACCESS_BYTES_PER_S,
            access_weights=CROWD_ACCESS_WEIGHTS,
        ),
        source=f"built-in {name}",
    )


#: the built-in scenarios built in Python (`scenario.load_scenario` looks here first)
BUILDERS: dict[str, Callable[[], Scenario]] = {
    "mixed-classes": lambda: mixed_workload(),
    "mixed-classes-nocrowd": lambda: mixed_workload(crowd=False),
}
