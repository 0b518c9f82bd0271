"""Settings of the multicast sender's carousels and of a receiver's channel joining."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

FEC_SCHEMES = ("raptorq", "none")
#: source blocks an object may be split into at most, per FEC scheme: the crate
#: ``flute`` gives RaptorQ an 8-bit source block number (255 blocks, RFC 6330's Z) and
#: Compact No-Code a 16-bit one
MAX_SOURCE_BLOCKS = {"raptorq": 255, "none": 65535}
#: the largest source block the schemes take (RFC 6330's K'max for RaptorQ; the
#: 16-bit field of Compact No-Code)
MAX_BLOCK_SYMBOLS = {"raptorq": 56403, "none": 65535}
#: the largest encoding symbol ID of a RaptorQ block (RFC 6330 section 3.2: 24 bits):
#: its source and repair symbols together are at most this plus one
MAX_ESI = (1 << 24) - 1
#: the environment variable the sender (and the balancer) read its API token from
TOKEN_ENV = "PRESSRUN_MULTICAST_TOKEN"


#: source-specific multicast groups (RFC 4607): joined by (source, group)
SSM_RANGE = ipaddress.IPv4Network("232.0.0.0/8")


def is_ssm(group: str) -> bool:
    """Whether ``group`` is a source-specific multicast group (232.0.0.0/8), which a
    receiver joins by source and group, as AMT relays and SSM networks expect."""
    try:
        return ipaddress.IPv4Address(group) in SSM_RANGE
    except ipaddress.AddressValueError:
        return False


#: the share of the slowest link a channel takes at most: one channel must fit the
#: slowest link with room for the reader's own other traffic (5 of 6 Mbit/s, the plan
#: measured in docs/results/2026-11-28-multicast-mixed-links.md)
CHANNEL_LINK_SHARE = 5 / 6
#: the most channels a carousel has (`CarouselConfig.channels`)
MAX_CHANNELS = 16


def mixed_link_plan(slowest_down_bps: float, fastest_down_bps: float) -> tuple[int, float]:
    """The channel plan (channels, each channel's bits/s) for readers whose links run
    from ``slowest_down_bps`` to ``fastest_down_bps`` (docs/multicast.md, "A plan for
    mixed links"): each channel takes at most `CHANNEL_LINK_SHARE` of the slowest link,
    in whole Mbit/s where that leaves at least 1 (a reader cannot leave its last
    channel, so a channel above its link congests it for the whole download), and
    there are as many channels as the fastest link carries (up to `MAX_CHANNELS`): a
    reader on the carousel is then held back by its link and the channels' grain, not
    by the plan, whatever share of the origins it would have had unicast. 6 and 50
    Mbit/s: 10 x 5 Mbit/s."""
    if not (0 < slowest_down_bps <= fastest_down_bps and math.isfinite(fastest_down_bps)):
        raise ValueError("need 0 < slowest_down_bps <= fastest_down_bps")
    rate = slowest_down_bps * CHANNEL_LINK_SHARE
    if rate >= 1e6:
        rate = math.floor(rate / 1e6 + 1e-9) * 1e6
    channels = min(MAX_CHANNELS, max(1, math.floor(fastest_down_bps / rate + 1e-9)))
    return channels, rate


@dataclass(frozen=True, slots=True)
class CarouselConfig:
    """How one issue is carouselled.

    fec: ``raptorq`` (RFC 6330: every channel carries different encoding symbols, so k
        channels deliver about k times faster) or ``none`` (RFC 6726 no-code FEC, for
        standard receivers: every channel carries the whole file, phase-shifted).
    channels: number of channels (group, port, TSI each). 10: `mixed_link_plan` for
        links of 6 to 50 Mbit/s, so a 50 Mbit/s reader takes its link's rate (4 held
        it to 20 Mbit/s, slower than the origins at a crowd's peak). The price: the
        sender's pass is channels x (1 + overhead) x the issue in memory (675 MB for
        50 MB) and it sends channels x rate whoever listens.
    rate_bps: each channel's rate on the wire, bits/s of UDP payload. 5 Mbit/s: the
        slowest link to serve (6 Mbit/s) carries one channel, faster links join more
        (receiver-driven layering); 2 x 40 Mbit/s congested every link slower than 40
        Mbit/s. Finer channels fill a 6 Mbit/s link but cost every faster one the
        longer climb (flash-crowd-50-desktops on 16 x 2 Mbit/s: mobile-6 readers 8.5 s
        sooner, fibre-50 about 4 s and dsl-20 about 1 s later; docs/multicast.md, "A
        plan for mixed links").
    symbol_bytes: encoding symbol length (one symbol per packet). 1320: with the LCT
        and FEC headers (36 bytes) and IP/UDP (28) a packet is 1384 bytes, 1414 inside
        an AMT tunnel (RFC 7450: outer IP, UDP and its 2-byte header), which leaves 86
        bytes of a 1500-byte path for another encapsulation (IPsec, VXLAN). 1400
        filled a 1500-byte frame on a LAN but not a tunnel.
    max_source_block_symbols: source symbols per block at most (RFC 6330's K), up to
        the scheme's largest (`MAX_BLOCK_SYMBOLS`). 1024: blocks of 1.35 MB. An object
        completes with its last block and every block gets symbols at the same rate,
        so the pieces a reader held from the swarm count only as far as the block it
        holds least of: with a third held, 0.92 of the packets of a reader holding
        nothing in blocks of 1024, 0.69 in one block of up to 56,403 symbols (74 MB;
        bench/multicast_blocks.py). One block was measured in flash-crowd-50-desktops
        and made the carousel readers slower there (33.7 s against 30.5 s at the
        commit before, the twin 25.4 and 27.1 s): its decode, about 8 x the block in
        fresh memory and the block's write all come at the end of the receive, 0.4
        CPU-seconds more a reader when the crowd's readers finish on a host with 2
        cores busy, and the readers that began in the swarm held 0-13% of the issue
        (docs/multicast.md, "Source blocks"). An issue too large for 255 blocks of
        this size gets larger blocks (`source_block_symbols`).
    cycle_overhead: with RaptorQ, each channel's cycle carries K x (1 + this) distinct
        symbols, so a receiver on one channel with loss p completes in one cycle while
        p < overhead / (1 + overhead) (0.35: up to 25% loss). 0.35.
    fdt_every_packets: the FDT is repeated on each channel after this many packets, so
        a receiver joining at any moment learns the object within that many. 500.
    """

    fec: str = "raptorq"
    channels: int = 10
    rate_bps: float = 5e6
    symbol_bytes: int = 1320
    max_source_block_symbols: int = 1024
    cycle_overhead: float = 0.35
    fdt_every_packets: int = 500

    def __post_init__(self) -> None:
        if self.fec not in FEC_SCHEMES:
            raise ValueError(f"fec must be one of {', '.join(FEC_SCHEMES)}, not {self.fec!r}")
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise ValueError(f"channels must be 1..{MAX_CHANNELS}, not {self.channels}")
        if not (self.rate_bps > 0 and math.isfinite(self.rate_bps)):
            raise ValueError("rate_bps must be a positive number")
        if not 64 <= self.symbol_bytes <= 8192 or self.symbol_bytes % 4:
            raise ValueError("symbol_bytes must be a multiple of 4 in 64..8192")
        if not 4 <= self.max_source_block_symbols <= MAX_BLOCK_SYMBOLS[self.fec]:
            raise ValueError(
                f"max_source_block_symbols must be 4..{MAX_BLOCK_SYMBOLS[self.fec]} "
                f"with fec {self.fec}"
            )
        if not 0 <= self.cycle_overhead <= 2:
            raise ValueError("cycle_overhead must be 0..2")
        if self.fdt_every_packets < 10:
            raise ValueError("fdt_every_packets must be at least 10")

    def source_block_symbols(self, size_bytes: int) -> int:
        """The largest source block (symbols) an object of ``size_bytes`` is split
        into: ``max_source_block_symbols``, or more when the FEC scheme's block count
        (`MAX_SOURCE_BLOCKS`) would not hold the object in blocks of that size.
        ValueError (saying by how much) when no block size of the scheme can."""
        kt = max(1, math.ceil(size_bytes / self.symbol_bytes))
        needed = math.ceil(kt / MAX_SOURCE_BLOCKS[self.fec])
        largest = MAX_BLOCK_SYMBOLS[self.fec]
        if needed > largest:
            limit = largest * MAX_SOURCE_BLOCKS[self.fec] * self.symbol_bytes
            raise ValueError(
                f"{size_bytes} bytes is more than fec {self.fec} carries with "
                f"{self.symbol_bytes}-byte symbols ({limit} bytes): use larger symbols"
            )
        return max(self.max_source_block_symbols, needed)

    def repair_symbols_per_block(self, size_bytes: int) -> int:
        """Repair symbols to encode per block of an object of ``size_bytes`` so every
        channel gets K x (1 + overhead) distinct symbols of each block (0 with
        ``fec='none'``). Blocks are about equal (RFC 6330 section 4.4.1.2): Z =
        ceil(Kt / Kmax) blocks of about Kt / Z symbols."""
        if self.fec == "none":
            return 0
        kt = max(1, math.ceil(size_bytes / self.symbol_bytes))
        blocks = math.ceil(kt / self.source_block_symbols(size_bytes))
        k = math.ceil(kt / blocks)
        total = math.ceil(k * self.channels * (1 + self.cycle_overhead))
        return min(MAX_ESI - k, max(0, total - k))


@dataclass(frozen=True, slots=True)
class LayeringConfig:
    """A receiver's channel joining (receiver-driven layering, McCanne et al. RLM).

    window_s: loss is measured over windows this long. 0.5 s.
    settle_s: a channel joined less than this long ago is not counted yet (the join
        takes effect and packets already queued drain). 0.3 s.
    join_below_loss: another channel is joined when the loss over the last window was
        below this. 0.05.
    leave_above_loss: the last channel joined is left when the loss climbs above this,
        at most (`LayerCore.leave_threshold`: with k channels held, a loss above
        1 / (2k), but never under 2 x join_below_loss, says the link carries less than
        k - 1/2 of them). 0.25 (above the 10-20% random loss of a poor link, which more
        channels do not worsen; a congested link loses far more as channels are
        added).
    max_channels: at most this many channels at once (None: every channel). None.
    start_channels: channels joined at the start. 1.
    leave_latency_s: how long a channel left keeps coming down the link: the network
        forwards a group until its querier has asked the port and heard no member
        (IGMP's last-member query time, RFC 2236 / RFC 3376: 2 queries 1 s apart;
        MLD's is the same). The window after a leave starts this long plus
        ``settle_s`` after the leave returned: before, the channels kept still share
        the link with the one left, and their loss is not theirs. 2.0.
    climb_doubling: until the first window with path loss at or above
        ``join_below_loss``, a join adds the next channels whose rate together is at
        most the rate held (the rate held doubles a step, as TCP's slow start; the
        first loss ends it), then one channel a join (RLM). A fibre-50 reader of
        10 x 5 Mbit/s held its 10 channels 9.0 s into a 15.1 s receive one channel a
        window (docs/multicast.md, "A plan for mixed links"). True.
    """

    window_s: float = 0.5
    settle_s: float = 0.3
    join_below_loss: float = 0.05
    leave_above_loss: float = 0.25
    max_channels: int | None = None
    start_channels: int = 1
    leave_latency_s: float = 2.0
    climb_doubling: bool = True

    def __post_init__(self) -> None:
        if self.start_channels < 1:
            raise ValueError("start_channels must be at least 1")
        if not self.window_s > 0 or self.settle_s < 0 or self.leave_latency_s < 0:
            raise ValueError("window_s must be positive, settle_s and leave_latency_s not negative")
        if not 0 <= self.join_below_loss < self.leave_above_loss <= 1:
            raise ValueError("need 0 <= join_below_loss < leave_above_loss <= 1")
        if self.max_channels is not None and self.max_channels < 1:
            raise ValueError("max_channels must be at least 1")
