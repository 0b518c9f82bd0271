"""The link shape from a container's environment, and the commands that make it."""

from __future__ import annotations

import pytest

from pressrun.emulate.link import (
    IFB_DEVICE,
    LinkConfigError,
    LinkShape,
    cut_commands,
    link_from_env,
    parse_rate_bps,
    shaping_commands,
)


def test_rates_parse_in_tc_units() -> None:
    assert parse_rate_bps("100mbit", "X") == 100_000_000
    assert parse_rate_bps("1.5Mbit", "X") == 1_500_000
    assert parse_rate_bps("512kbit", "X") == 512_000
    assert parse_rate_bps("1gbit", "X") == 1_000_000_000


@pytest.mark.parametrize("text", ["100", "fast", "10 MB", "-3mbit", "1kbit"])
def test_bad_rates_name_the_variable(text: str) -> None:
    with pytest.raises(LinkConfigError, match="PRESSRUN_LINK_RATE"):
        link_from_env({"PRESSRUN_LINK_RATE": text})


def test_unset_and_empty_variables_leave_the_link_alone() -> None:
    assert link_from_env({}) == LinkShape()
    shape = link_from_env({"PRESSRUN_LINK_RATE": "", "PRESSRUN_LINK_LOSS_PCT": " "})
    assert not shape.shaped
    assert shaping_commands(shape) == []
    assert shape.describe() == "unshaped"


def test_one_direction_overrides_both() -> None:
    shape = link_from_env({"PRESSRUN_LINK_RATE": "20mbit", "PRESSRUN_LINK_UP_RATE": "2mbit"})
    assert shape == LinkShape(up_bps=2_000_000, down_bps=20_000_000)
    assert shape.describe() == "up 2 Mbit/s, down 20 Mbit/s"


def test_loss_must_be_a_percentage() -> None:
    assert link_from_env({"PRESSRUN_LINK_LOSS_PCT": "2.5"}).loss_pct == 2.5
    with pytest.raises(LinkConfigError, match="0 to 100"):
        link_from_env({"PRESSRUN_LINK_LOSS_PCT": "120"})
    with pytest.raises(LinkConfigError, match="not a number"):
        link_from_env({"PRESSRUN_LINK_LOSS_PCT": "lots"})


def test_commands_shape_up_with_tbf_down_through_ifb_loss_with_nft() -> None:
    commands = shaping_commands(LinkShape(up_bps=8_000_000, down_bps=100_000_000, loss_pct=1.5))
    text = [" ".join(c) for c in commands]
    assert text[0].startswith("tc qdisc replace dev eth0 root tbf rate 8000000bit")
    assert f"ip link add {IFB_DEVICE} type ifb" in text
    assert any("mirred egress redirect dev " + IFB_DEVICE in t for t in text)
    assert any(t.startswith(f"tc qdisc replace dev {IFB_DEVICE} root tbf rate 100000000bit")
               for t in text)  # fmt: skip
    # 1.5% of packets in: 150 of every 10,000
    assert text[-1].endswith("numgen random mod 10000 < 150 drop")
    # the bucket holds 10 ms at the rate, at least 32 KiB
    burst = commands[0][commands[0].index("burst") + 1]
    assert int(burst) == 32 * 1024


def test_cut_drops_everything_but_the_loopback() -> None:
    text = [" ".join(c) for c in cut_commands()]
    assert "nft insert rule inet pressrun_link input iifname != lo drop" in text
    assert "nft insert rule inet pressrun_link output oifname != lo drop" in text
