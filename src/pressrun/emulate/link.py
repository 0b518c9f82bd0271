"""A container's link shape, from its environment: rate up, rate down, loss.

Every pressrun container starts through `pressrun.emulate.entrypoint`, which reads
these variables and shapes the container's own ``eth0`` before it runs the service
(FIELD-NOTES.md, "Network namespaces" and "Docker": this kernel has no netem, so rate
is a token bucket and loss is nftables):

- ``PRESSRUN_LINK_RATE``: both directions, e.g. ``100mbit``, ``8mbit``, ``512kbit``;
- ``PRESSRUN_LINK_UP_RATE`` / ``PRESSRUN_LINK_DOWN_RATE``: one direction, overriding
  ``PRESSRUN_LINK_RATE``;
- ``PRESSRUN_LINK_LOSS_PCT``: per cent of the packets arriving at the container that are
  dropped (0 to 100, two decimals), e.g. ``2`` for a lossy access link.

Up (egress) is a ``tbf`` on ``eth0``; down (ingress) is redirected to an ``ifb`` device
with a ``tbf`` of its own (ingress policing is not in this kernel); loss is an nftables
``numgen random`` rule on the input hook. Unset or empty variables leave the link as it
is: a real deployment sets none of them. This module only computes the commands; the
entrypoint runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

LINK_ENV = (
    "PRESSRUN_LINK_RATE",
    "PRESSRUN_LINK_UP_RATE",
    "PRESSRUN_LINK_DOWN_RATE",
    "PRESSRUN_LINK_LOSS_PCT",
)

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
_UNIT_BPS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
#: the nftables table the loss rule lives in (`cut` adds its drop-all rule there too)
NFT_TABLE = "pressrun_link"
#: the ifb device that carries the container's ingress for shaping
IFB_DEVICE = "ifb-down"


class LinkConfigError(ValueError):
    """A link variable does not parse; the message names the variable and the fix."""


@dataclass(frozen=True, slots=True)
class LinkShape:
    """What a container's link is shaped to; None: that part is left alone."""

    up_bps: int | None = None
    down_bps: int | None = None
    loss_pct: float = 0.0

    @property
    def shaped(self) -> bool:
        """Whether anything is to be changed."""
        return self.up_bps is not None or self.down_bps is not None or self.loss_pct > 0

    def describe(self) -> str:
        """One line for the container's log, e.g. ``up 100 Mbit/s, down 100 Mbit/s``."""
        parts = []
        if self.up_bps is not None:
            parts.append(f"up {self.up_bps / 1e6:g} Mbit/s")
        if self.down_bps is not None:
            parts.append(f"down {self.down_bps / 1e6:g} Mbit/s")
        if self.loss_pct > 0:
            parts.append(f"{self.loss_pct:g}% loss in")
        return ", ".join(parts) or "unshaped"


def parse_rate_bps(text: str, variable: str) -> int:
    """``100mbit`` -> 100_000_000 (bits per second); `LinkConfigError` when malformed."""
    m = _RATE_RE.match(text)
    if m is None:
        raise LinkConfigError(
            f"{variable}={text!r} is not a rate: write a number and bit, kbit, mbit or gbit "
            "(e.g. 100mbit)"
        )
    bps = int(float(m.group(1)) * _UNIT_BPS[m.group(2).lower()])
    if bps < 8_000:
        raise LinkConfigError(f"{variable}={text!r} is below 8 kbit/s, too slow to shape")
    return bps


def link_from_env(env: Mapping[str, str]) -> LinkShape:
    """The shape the ``PRESSRUN_LINK_*`` variables ask for (empty values are unset)."""

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    def rate(name: str) -> int | None:
        own = get(name)
        if own is not None:
            return parse_rate_bps(own, name)
        both = get("PRESSRUN_LINK_RATE")
        return None if both is None else parse_rate_bps(both, "PRESSRUN_LINK_RATE")

    up = rate("PRESSRUN_LINK_UP_RATE")
    down = rate("PRESSRUN_LINK_DOWN_RATE")
    loss = 0.0
    loss_text = get("PRESSRUN_LINK_LOSS_PCT")
    if loss_text is not None:
        try:
            loss = float(loss_text)
        except ValueError:
            raise LinkConfigError(
                f"PRESSRUN_LINK_LOSS_PCT={loss_text!r} is not a number (per cent, e.g. 2)"
            ) from None
        if not 0.0 <= loss <= 100.0:
            raise LinkConfigError(f"PRESSRUN_LINK_LOSS_PCT={loss_text!r} must be 0 to 100")
    return LinkShape(up, down, loss)


def _tbf(device: str, bps: int) -> list[str]:
    # a bucket of 10 ms at the rate (at least 32 KiB, so one TSO burst fits) and a queue
    # of at most 100 ms: a plain access link, not a bufferbloated one
    burst = max(32 * 1024, bps // 8 // 100)
    return [
        "tc", "qdisc", "replace", "dev", device, "root", "tbf",
        "rate", f"{bps}bit", "burst", str(burst), "latency", "100ms",
    ]  # fmt: skip


def shaping_commands(shape: LinkShape, device: str = "eth0") -> list[list[str]]:
    """The ``tc``/``ip``/``nft`` commands that give ``device`` the shape, in order."""
    commands: list[list[str]] = []
    if shape.up_bps is not None:
        commands.append(_tbf(device, shape.up_bps))
    if shape.down_bps is not None:
        commands += [
            ["ip", "link", "add", IFB_DEVICE, "type", "ifb"],
            ["ip", "link", "set", IFB_DEVICE, "up"],
            ["tc", "qdisc", "add", "dev", device, "handle", "ffff:", "ingress"],
            [
                "tc",
                "filter",
                "add",
                "dev",
                device,
                "parent",
                "ffff:",
                "protocol",
                "all",
                "u32",
                "match",
                "u32",
                "0",
                "0",
                "action",
                "mirred",
                "egress",
                "redirect",
                "dev",
                IFB_DEVICE,
            ],
            _tbf(IFB_DEVICE, shape.down_bps),
        ]
    if shape.loss_pct > 0:
        commands += _nft_chains()
        # numgen over 10,000 so a loss of 0.01% is expressible
        threshold = round(shape.loss_pct * 100)
        commands.append(
            [
                "nft",
                "add",
                "rule",
                "inet",
                NFT_TABLE,
                "input",
                "numgen",
                "random",
                "mod",
                "10000",
                "<",
                str(threshold),
                "drop",
            ]
        )
    return commands


def _nft_chains() -> list[list[str]]:
    # "add" is idempotent: the table and chains are made once, whoever asks first
    return [
        ["nft", "add", "table", "inet", NFT_TABLE],
        ["nft", "add", "chain", "inet", NFT_TABLE, "input",
         "{ type filter hook input priority 0; policy accept; }"],
        ["nft", "add", "chain", "inet", NFT_TABLE, "output",
         "{ type filter hook output priority 0; policy accept; }"],
    ]  # fmt: skip


def cut_commands() -> list[list[str]]:
    """Commands that cut the container's link: every packet in and out dropped but on
    the loopback (the service keeps running; its peers see a dead link)."""
    return [
        *_nft_chains(),
        ["nft", "insert", "rule", "inet", NFT_TABLE, "input", "iifname", "!=", "lo", "drop"],
        ["nft", "insert", "rule", "inet", NFT_TABLE, "output", "oifname", "!=", "lo", "drop"],
    ]
