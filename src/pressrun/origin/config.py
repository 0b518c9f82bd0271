"""The origin's configuration, with documented defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pressrun.origin.core import valid_name


def mbps_to_bytes_per_s(mbps: float) -> float:
    """Megabits per second (10^6 bits) -> bytes per second."""
    return mbps * 1e6 / 8


@dataclass(frozen=True, slots=True)
class OriginConfig:
    """How one origin serves its content directory.

    content_dir: the folder of issue bundles, ``CONTENT/<issue_id>/<file>``
        (docs/protocols.md).
    host, port: where to listen; port 0 takes any free port (read it back from
        ``RunningOrigin.port``).
    name: the origin's name in ``/stats``; None: ``origin-<port>``.
    capacity_mbps: the link capacity the operator states (megabits/s); reported as
        ``capacity_bytes_per_s``, the figure the balancer scores against. It limits
        nothing: it may be wrong, like machine C of 000_9aae53f3113e9bd8.txt.
    egress_cap_mbps: a real cap (megabits/s) on the sum of all transfers, enforced by
        one token bucket; None: no cap, files go out with sendfile(2) at full speed.
    stats_interval_s: the status agent's interval: rates in ``/stats`` are over the
        last closed interval of this length.
    cache_window_s: an issue served within this many seconds is listed in
        ``cached_issues`` (hot in the page cache).
    shutdown_grace_s: on stop, transfers still running after this long are cut.
    sendfile_chunk_bytes: without a cap, a transfer is handed to sendfile(2) in chunks
        of this size, so byte counters (and ``/stats``) follow it as it goes.
    cap_chunk_bytes: with a cap, the size of each paced write.
    cap_turn_bytes: with a cap, a transfer takes this many bytes of the bucket at once
        (a turn; less at its answer's end) and sends them in paced writes inside it,
        so concurrent answers of at most this size finish one after another in the
        order they asked instead of all together, and a longer one takes turns with
        them (docs/origin.md, "The egress cap").
    cap_burst_s: with a cap, the bucket's depth in seconds of the cap (at least one
        chunk): how far ahead of the average rate a burst may go.
    send_buffer_bytes: SO_SNDBUF of each connection that gets a body; None (default):
        the kernel's autotuning. The byte counters count what is handed to the kernel,
        which runs ahead of the wire by up to the send buffer (megabytes with
        autotuning, for a slow client); a small buffer keeps ``/stats`` close to the
        wire (the egress check of docs/demo.md uses 64 KiB).
    tls_cert, tls_key: PEM files; given, the origin serves HTTPS (pressrun.security).
    send_timeout_s: a chunk of a body the client has not taken within this long
        (it stopped reading) ends the transfer and closes the connection. 60 s, nginx's
        ``send_timeout``: chunks shrink to 64 KiB for a slow client
        (`pressrun.origin.core.next_chunk_bytes`), so only a client slower than
        64 KiB a minute (about 9 kbit/s) is cut.
    stalled_after_s: a transfer that sent no byte for this long is *stalled*: it is
        left out of ``active_transfers`` and the per-transfer means of ``/stats`` (it
        is no load) until it moves again. 5 s: several chunks of a slow client.
    """

    content_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    name: str | None = None
    capacity_mbps: float = 1000.0
    egress_cap_mbps: float | None = None
    stats_interval_s: float = 1.0
    cache_window_s: float = 300.0
    shutdown_grace_s: float = 5.0
    sendfile_chunk_bytes: int = 1024 * 1024
    cap_chunk_bytes: int = 64 * 1024
    cap_turn_bytes: int = 256 * 1024
    cap_burst_s: float = 0.05
    send_buffer_bytes: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    send_timeout_s: float = 60.0
    stalled_after_s: float = 5.0

    def __post_init__(self) -> None:
        if not (self.capacity_mbps > 0 and math.isfinite(self.capacity_mbps)):
            raise ValueError("capacity_mbps must be a positive number")
        if self.egress_cap_mbps is not None and not (
            self.egress_cap_mbps > 0 and math.isfinite(self.egress_cap_mbps)
        ):
            raise ValueError("egress_cap_mbps must be a positive number (or None: no cap)")
        if not (self.stats_interval_s > 0 and math.isfinite(self.stats_interval_s)):
            raise ValueError("stats_interval_s must be positive")
        if not (self.cache_window_s >= 0 and math.isfinite(self.cache_window_s)):
            raise ValueError("cache_window_s must not be negative")
        if self.shutdown_grace_s < 0:
            raise ValueError("shutdown_grace_s must not be negative")
        if self.sendfile_chunk_bytes < 4096 or self.cap_chunk_bytes < 1024:
            raise ValueError("chunk sizes must be at least 4096 (sendfile) / 1024 (cap) bytes")
        if self.cap_turn_bytes < 1024:
            raise ValueError("cap_turn_bytes must be at least 1024")
        if self.cap_burst_s < 0:
            raise ValueError("cap_burst_s must not be negative")
        if self.send_buffer_bytes is not None and self.send_buffer_bytes < 4096:
            raise ValueError("send_buffer_bytes must be at least 4096 (or None: the kernel's)")
        if not (self.send_timeout_s > 0 and math.isfinite(self.send_timeout_s)):
            raise ValueError("send_timeout_s must be a positive number")
        if not (self.stalled_after_s > 0 and math.isfinite(self.stalled_after_s)):
            raise ValueError("stalled_after_s must be a positive number")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if self.name is not None and not valid_name(self.name):
            raise ValueError(
                f"origin name {self.name!r} must be letters, digits, '.', '_' or '-' "
                "(starting with a letter or digit, at most 128 characters)"
            )

    @property
    def capacity_bytes_per_s(self) -> float:
        """The stated link capacity in bytes per second."""
        return mbps_to_bytes_per_s(self.capacity_mbps)

    @property
    def egress_cap_bytes_per_s(self) -> float | None:
        """The real egress cap in bytes per second, or None."""
        if self.egress_cap_mbps is None:
            return None
        return mbps_to_bytes_per_s(self.egress_cap_mbps)

    @property
    def cap_burst_bytes(self) -> float:
        """The token bucket's depth in bytes (0 when there is no cap)."""
        cap = self.egress_cap_bytes_per_s
        if cap is None:
            return 0.0
        return max(float(self.cap_chunk_bytes), cap * self.cap_burst_s)
