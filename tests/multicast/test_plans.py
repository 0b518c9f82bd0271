"""Where an issue's carousel goes (`pressrun.multicast.plans`): pure, with a state file."""

from __future__ import annotations

import errno
import json
import socket
from pathlib import Path

import pytest

from pressrun.multicast.net import receiver_socket
from pressrun.multicast.plans import (
    DERIVED_PORT_BASE,
    DERIVED_PORT_SPAN,
    ChannelPlanner,
    derived_tsi,
    issue_toi,
)


def test_derived_plans_are_stable_inside_the_range_and_never_share_a_group() -> None:
    planner = ChannelPlanner(group_base="239.255.10.0", group_count=8)
    a = planner.plan("weekly-a", 2, tsi=None, taken=())
    assert a == ChannelPlanner(group_base="239.255.10.0", group_count=8).plan(
        "weekly-a", 2, tsi=None, taken=()
    )
    assert all(g.startswith("239.255.10.") and int(g.rsplit(".", 1)[1]) < 8 for g in a.groups)
    assert a.tsi == derived_tsi("weekly-a") and 0 < a.tsi < 2**31
    assert all(DERIVED_PORT_BASE <= p < DERIVED_PORT_BASE + DERIVED_PORT_SPAN + 2 for p in a.ports)
    # under every host's ephemeral ports (Linux from 32768, IANA from 49152), which any
    # socket of the receiver's host may hold without SO_REUSEADDR, even with 16 channels
    assert DERIVED_PORT_BASE >= 1024 and DERIVED_PORT_BASE + DERIVED_PORT_SPAN + 15 < 32768
    b = planner.plan("weekly-b", 3, tsi=7, taken=a.groups)
    assert set(b.groups).isdisjoint(a.groups) and b.tsi == 7
    with pytest.raises(ValueError, match="no 4 free groups"):
        planner.plan("weekly-c", 4, tsi=None, taken=a.groups + b.groups)
    based = ChannelPlanner(group_base="239.255.10.0", group_count=8, channel_port_base=5000)
    assert based.plan("weekly-a", 2, tsi=None, taken=()).ports == (5000, 5001)
    with pytest.raises(ValueError, match="not all multicast"):
        ChannelPlanner(group_base="239.255.255.250", group_count=16)
    assert issue_toi("ab" * 32) != issue_toi("cd" * 32) and issue_toi("0" * 64) == 1


def test_the_state_file_keeps_plans_and_a_damaged_one_costs_only_them(tmp_path: Path) -> None:
    state = tmp_path / "carousels.json"
    planner = ChannelPlanner(group_base="239.255.10.0", group_count=8, state_file=state)
    moved = planner.plan("weekly-a", 1, tsi=99, taken=("239.255.10.0", "239.255.10.1"))
    planner.remember("weekly-a", moved, now_unix=1.0)
    again = ChannelPlanner(group_base="239.255.10.0", group_count=8, state_file=state)
    assert again.tsi_for("weekly-a") == 99
    assert again.plan("weekly-a", 1, tsi=None, taken=()) == moved
    # another channel count, or a group outside a new range: planned afresh
    assert len(again.plan("weekly-a", 2, tsi=None, taken=()).groups) == 2
    state.write_text("{not json")
    damaged = ChannelPlanner(group_base="239.255.10.0", group_count=8, state_file=state)
    assert damaged.tsi_for("weekly-a") == derived_tsi("weekly-a")
    damaged.remember("weekly-b", moved, now_unix=2.0)
    assert set(json.loads(state.read_text())["carousels"]) == {"weekly-b"}


def test_the_sender_range_defaults_to_what_is_left_below_239_255_255_255() -> None:
    import nacl.signing

    from pressrun.multicast.sender import SenderServiceConfig

    def config(**kw: object) -> SenderServiceConfig:
        return SenderServiceConfig(
            Path("."), ("239.1.1.1", 5400), nacl.signing.SigningKey.generate(), "t" * 16, **kw
        )  # type: ignore[arg-type]

    assert config().groups() == 1024
    assert config(group_base="239.255.255.200").groups() == 56
    with pytest.raises(ValueError, match="leaves the multicast range"):
        config(group_base="239.255.255.200", group_count=100)


def test_issue_toi_fits_sixteen_bits() -> None:
    """The TOI is 16 bits (never 0): with a TSI up to 65,535 every LCT field is 16 or
    32 bits, which rt-libflute reads right (docs/multicast.md, third-party receivers)."""
    tois = {issue_toi(f"{n:064x}"[::-1]) for n in range(1, 2000)}
    assert all(1 <= toi <= 0xFFFF for toi in tois)
    assert issue_toi("f" * 64) == 0xFFFF


def test_a_derived_port_is_never_one_the_receivers_host_may_hold_already() -> None:
    """A socket bound to an ephemeral port without SO_REUSEADDR (what a host's own
    outgoing sockets are) refuses a receiver's bind of that port: derived ports stay
    under the host's ephemeral range (before: 40000-60015, inside Linux's)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        holder.bind(("0.0.0.0", 0))
        port = holder.getsockname()[1]
        with pytest.raises(OSError) as refused:
            receiver_socket("239.255.10.1", port, "127.0.0.1").close()
        assert refused.value.errno == errno.EADDRINUSE
    finally:
        holder.close()
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    assert port >= low
    planner = ChannelPlanner(group_base="239.255.0.0", group_count=4096)
    for k in range(200):
        ports = planner.plan(f"issue-{k}", 16, tsi=None, taken=()).ports
        assert max(ports) < low, (k, ports)
