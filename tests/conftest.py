"""Settings every test shares.

Hypothesis: the suite runs on shared, sometimes heavily loaded CI machines, so the
time a property test's examples take to generate or run is not what it checks
(performance is measured in bench/, not in timed tests). The properties and the
number of examples are unchanged; only the wall-clock health check and the
per-example deadline are off.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "pressrun",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("pressrun")


# Parallel runs (pytest-xdist, `make test` runs `-n 3 --dist loadgroup`): most of the
# suite waits on sockets, processes and browsers, not on the CPU, so three workers on two
# cores take about half the wall time. A test file runs whole on one worker (its module
# fixtures are made once), and the tests that share something a test cannot make
# private run on one worker one after another: the docker engine and compose stacks,
# network namespaces, real multicast on the host's interfaces, and the timing of origins
# held to an egress cap (an origin's pacing measured while other processes take the CPU).
SERIAL_GROUPS: dict[str, tuple[str, ...]] = {
    "docker": ("tests/emulate/", "tests/test_compose.py", "tests/test_prometheus_live.py"),
    "multicast": (
        "tests/multicast/",
        "tests/balancer/test_carousels.py",
        "tests/balancer/test_multicast_demand.py",
        "tests/test_uptime_smoke.py",
    ),
    "timing": (
        "tests/origin/",
        "tests/integration/test_egress.py",
        "tests/balancer/test_shared_demand.py",
        "tests/balancer/test_shared_carousel_steady.py",
    ),
}


def _group_of(relpath: str) -> str:
    for group, prefixes in SERIAL_GROUPS.items():
        if any(relpath.startswith(p) for p in prefixes):
            return group
    return relpath  # the file is its own group


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's xdist group: its serial group, else its file (see SERIAL_GROUPS)."""
    root = Path(str(config.rootpath))
    for item in items:
        rel = Path(str(item.path)).relative_to(root).as_posix()
        item.add_marker(pytest.mark.xdist_group(_group_of(rel)))
