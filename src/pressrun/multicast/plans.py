"""Where each issue's carousel goes: its groups, ports and TSI, the same across
restarts of the carousel and of the sender.

A receiver configured by hand (a third-party FLUTE receiver, a firewall rule, an IGMP
snooping table) names a group, a port and a TSI; a carousel that came back elsewhere
after a restart was lost to it. So each issue's carousel gets:

- **TSI**: the one set through the control API (``"tsi"``), else the one it had
  before, else one derived from the issue id (`derived_tsi`: 31 bits of its SHA-256,
  never 0), so the same issue has the same TSI on every sender and after every restart.
- **Groups**: ``channels`` consecutive groups of the configured range
  (``group_base`` .. ``group_base + group_count - 1``, wrapping inside it), starting at
  the offset the issue id hashes to, or at the next offset whose groups no other
  running carousel uses (two carousels never share a group).
- **Ports**: ``channel_port_base + channel`` when a base is configured, else
  ``DERIVED_PORT_BASE + (hash of the issue id) mod DERIVED_PORT_SPAN + channel``.

What a carousel got is kept (`ChannelPlanner.remember`) and, with a state file, written
to it atomically (``--state-file``: JSON, at most `MAX_REMEMBERED` issues, the least
recently started forgotten first), so a plan that had to move off a taken group, or a
TSI set by hand, survives a restart of the sender too. A remembered plan is used again
while it fits the configuration (same channel count, groups inside the range, the
configured port base) and collides with no running carousel.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pressrun.durable import write_atomic

log = logging.getLogger("pressrun.multicast.sender")

#: ports derived from the issue id (without ``--channel-port-base``) are in
#: ``DERIVED_PORT_BASE .. DERIVED_PORT_BASE + DERIVED_PORT_SPAN + 15``: under the
#: ports a host hands out for its own outgoing sockets (Linux's ephemeral range
#: 32768-60999, IANA's and Windows' 49152-65535). A receiver binds the channel's port
#: with SO_REUSEADDR, and any socket already bound to that port without it (a DNS
#: query's, a BitTorrent client's UDP socket: ephemeral) refuses the bind with
#: EADDRINUSE; with 40000-60015 a carousel reader could not join its channel on such
#: a host (the suite's fresh-clone run of 29 Nov 13:35: "Address already in use" on
#: port 52019 while other tests ran beside it)
DERIVED_PORT_BASE = 10000
DERIVED_PORT_SPAN = 20000
#: the plans a state file keeps at most (the least recently started go first)
MAX_REMEMBERED = 4096
#: the largest TSI the control API takes (LCT carries 16, 32 or 48 bits)
MAX_TSI = (1 << 48) - 1


def _digest(issue_id: str) -> int:
    return int.from_bytes(hashlib.sha256(issue_id.encode()).digest()[:8], "big")


def derived_tsi(issue_id: str) -> int:
    """The TSI of an issue's carousel when none was set: 31 bits of the SHA-256 of
    its id (never 0), the same on every sender."""
    return (_digest(issue_id) & 0x7FFFFFFF) or 1


def issue_toi(manifest_sha256: str) -> int:
    """The TOI of an issue's object: from the SHA-256 of its manifest (16 bits, never
    0), so a republished issue is another object and a receiver never mixes the
    symbols of two versions in one decoder (two versions share a TOI once in 65,535;
    a receiver also takes only the carousel naming the manifest it verified).

    16 bits because the crate sizes the LCT fields to their values and sets the
    half-word flag H for the FDT's TOI 0: with a 16-bit TOI and a TSI up to 65,535
    every field of every packet is 16 or 32 bits, which 5G-MAG's rt-libflute 0.12.3
    reads right; it reads the 48-bit fields that H with a 32-bit TOI or TSI makes
    with their halves swapped (it found no file of a 28-bit TOI)."""
    return (int(manifest_sha256[:4], 16) or 1) if manifest_sha256 else 1


@dataclass(frozen=True, slots=True)
class ChannelAddresses:
    """Where a carousel's channels go, and its TSI."""

    groups: tuple[str, ...]
    ports: tuple[int, ...]
    tsi: int

    def to_json(self, started_at: float) -> dict[str, Any]:
        """The state file's entry."""
        return {
            "groups": list(self.groups),
            "ports": list(self.ports),
            "tsi": self.tsi,
            "started_at": started_at,
        }


class ChannelPlanner:
    """Chooses and remembers each issue's `ChannelAddresses` (module docstring)."""

    def __init__(
        self,
        *,
        group_base: str,
        group_count: int,
        channel_port_base: int = 0,
        state_file: Path | None = None,
    ) -> None:
        base = ipaddress.IPv4Address(group_base)
        last = ipaddress.IPv4Address(int(base) + group_count - 1)
        if group_count < 1 or not (base.is_multicast and last.is_multicast):
            raise ValueError(
                f"the carousel groups {base} .. {last} ({group_count}) are not all multicast"
            )
        self.group_base = int(base)
        self.group_count = group_count
        self.channel_port_base = channel_port_base
        self.state_file = state_file
        #: issue id -> (its addresses, when last started: the state file's order)
        self._remembered: dict[str, tuple[ChannelAddresses, float]] = {}
        if state_file is not None:
            self._load(state_file)

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_bytes())
            entries = doc["carousels"]
            for issue_id, entry in entries.items():
                addresses = ChannelAddresses(
                    tuple(str(g) for g in entry["groups"]),
                    tuple(int(p) for p in entry["ports"]),
                    int(entry["tsi"]),
                )
                self._remembered[str(issue_id)] = (addresses, float(entry["started_at"]))
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            # a damaged state file costs the remembered plans, never the sender
            log.warning(
                "the carousel state file %s is unreadable (%s); plans are derived afresh",
                path,
                err,
            )
            self._remembered.clear()

    def tsi_for(self, issue_id: str) -> int:
        """The TSI the issue's carousel has (remembered, else derived)."""
        remembered = self._remembered.get(issue_id)
        return remembered[0].tsi if remembered is not None else derived_tsi(issue_id)

    def _group(self, offset: int) -> str:
        return str(ipaddress.IPv4Address(self.group_base + offset % self.group_count))

    def _ports(self, issue_id: str, channels: int) -> tuple[int, ...]:
        if self.channel_port_base:
            return tuple(self.channel_port_base + c for c in range(channels))
        first = DERIVED_PORT_BASE + _digest(issue_id) // 7 % DERIVED_PORT_SPAN
        return tuple(first + c for c in range(channels))

    def _fits(self, addresses: ChannelAddresses, channels: int, taken: Collection[str]) -> bool:
        if len(addresses.groups) != channels or len(addresses.ports) != channels:
            return False
        if self.channel_port_base and addresses.ports != self._ports("", channels):
            return False
        for group in addresses.groups:
            offset = int(ipaddress.IPv4Address(group)) - self.group_base
            if not 0 <= offset < self.group_count or group in taken:
                return False
        return True

    def plan(
        self, issue_id: str, channels: int, *, tsi: int | None, taken: Collection[str]
    ) -> ChannelAddresses:
        """The addresses of the issue's carousel of ``channels`` channels; ``taken``:
        the groups of the other running carousels. ValueError when the range has no
        ``channels`` free groups."""
        if tsi is not None and not 1 <= tsi <= MAX_TSI:
            raise ValueError(f"a TSI is 1 .. {MAX_TSI}, not {tsi}")
        chosen_tsi = tsi if tsi is not None else self.tsi_for(issue_id)
        remembered = self._remembered.get(issue_id)
        if remembered is not None and self._fits(remembered[0], channels, taken):
            return ChannelAddresses(remembered[0].groups, remembered[0].ports, chosen_tsi)
        if channels > self.group_count:
            raise ValueError(f"{channels} channels need more groups than the {self.group_count}")
        start = _digest(issue_id) % self.group_count
        for step in range(self.group_count):
            groups = tuple(self._group(start + step + c) for c in range(channels))
            if not any(g in taken for g in groups):
                return ChannelAddresses(groups, self._ports(issue_id, channels), chosen_tsi)
        raise ValueError(
            f"no {channels} free groups left in the {self.group_count} of the carousel range: "
            "stop a carousel or configure more groups (--group-count)"
        )

    def remember(self, issue_id: str, addresses: ChannelAddresses, *, now_unix: float) -> None:
        """Keep what the issue's carousel got (and write the state file)."""
        self._remembered.pop(issue_id, None)
        self._remembered[issue_id] = (addresses, now_unix)
        while len(self._remembered) > MAX_REMEMBERED:
            oldest = min(self._remembered, key=lambda i: self._remembered[i][1])
            del self._remembered[oldest]
        if self.state_file is None:
            return
        doc = {
            "format": 1,
            "carousels": {
                issue: addresses.to_json(at) for issue, (addresses, at) in self._remembered.items()
            },
        }
        try:
            write_atomic(self.state_file, json.dumps(doc, sort_keys=True).encode(), sync=True)
        except OSError as err:
            # the carousel runs all the same; only a restart may move it
            log.warning("the carousel state file %s could not be written: %s", self.state_file, err)
