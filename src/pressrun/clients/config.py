"""The client's configuration: a frozen dataclass and the two profiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

MIB = 1024 * 1024


#: the environment variable of `pressrun get --uploader-policy`
UPLOADER_POLICY_ENV = "PRESSRUN_UPLOADER_POLICY"

#: the environment variables naming the balancers when ``--balancer`` is not given
#: (either; a comma-separated list, tried in order)
BALANCER_ENVS = ("PRESSRUN_BALANCERS", "PRESSRUN_BALANCER")


def parse_balancer_urls(items: str | Sequence[str]) -> tuple[str, ...]:
    """Balancer base URLs from a comma-separated list or several of them (a repeated
    ``--balancer``), in order, without a trailing slash or a repeat; ValueError for an
    empty list or a URL that is not http(s)."""
    texts = [items] if isinstance(items, str) else list(items)
    urls: list[str] = []
    for text in texts:
        for item in text.split(","):
            url = item.strip().rstrip("/")
            if not url:
                continue
            if not url.startswith(("http://", "https://")) or url[-3:] == "://":
                raise ValueError(f"balancer {url!r} is not an http:// or https:// URL")
            if url not in urls:
                urls.append(url)
    if not urls:
        raise ValueError("no balancer URL given")
    return tuple(urls)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How one client downloads an issue.

    profile: ``desktop`` or ``mobile`` (informational; the fields below are what act).
    concurrency: sections downloaded at once, each on its own connection and each
        with its own directive (so two sections may come from two origins).
    section_bytes: the size of a section (a Range request that one directive
        covers), rounded up to whole pieces; None: automatic, the file split into
        ``max_sections`` sections (see :meth:`section_size_for`).
    max_sections: the automatic section count: 3 sections means at most two
        handoffs between sections (leaving a slow origin mid-section adds one).
        001_524169374db25375.txt found handing off about half of the transfers best
        and "excessive handoffs" worse than none, so a handoff is there to let the
        balancer move a long download, not to chop it.
    max_section_bytes: an upper bound on the automatic section size (None: none).
        The mobile profile caps it so that a dropped radio link costs little.
    stall_timeout_s: an origin that sends no byte for this long is failed.
    connect_timeout_s: timeout of a TCP connect (origin or balancer).
    balancer_timeout_s: timeout of one directive request.
    max_attempts_without_progress: give up after this many failures in a row (a
        failed origin, a refusal, an unreachable or slow balancer, a bad or truncated
        manifest) with no piece verified in between...
    give_up_after_s: ... and only once this long has passed without progress (since
        the start, or the last verified piece): a client that keeps retrying while the
        system is slow or briefly down (a CPU-starved balancer, origins restarting).
        0: the count alone. ``pressrun get`` sets it (``--give-up-after-s``, 300 s).
    failed_ttl_s: how long an origin named in ``failed=`` stays excluded; after that
        it may be tried again (it may have come back).
    retry_backoff_s: the wait after a failure, doubled per failure in a row, up to
        ``retry_backoff_max_s`` (:meth:`backoff_s`); a 503's Retry-After, when longer,
        is waited instead.
    retry_jitter: that wait is lengthened by a random share of itself, up to this
        (0.5: up to half again; 0: none), drawn per retry: clients refused together
        come back spread out, not in step (:meth:`backoff_s`). A Retry-After is
        still waited in full. In step, a balancer that admits a few clients after
        each status of its origins admits the same early ones every time: in the
        security soak test on a CPU-starved host (29 Nov), six clients started
        within 0.1 s were refused "full" together once a second for 19 s and gave
        up, while the balancer admitted about 20 others a second.
    metered: the connection costs money per byte (mobile); a later swarm mode uses it
        to upload nothing. The origin mode ignores it.
    steal_after_s: a worker with nothing left to assign takes over the back half of
        another worker's section when that section, at the rate it has shown, still
        needs more than this many seconds (a section stuck on a slow origin is handed
        off mid-way instead of holding up the whole download); None: never.
    steal_min_elapsed_s: a section is judged only after it ran this long.
    swarm_stall_after_s: in swarm mode, no progress for this long ends the swarm and
        the rest comes from origin sections (None: the peer profile's, 20 s).
    swarm_max_seed_s: in swarm mode, the longest the client seeds after finishing
        before it leaves (None: the peer profile's, 30 min desktop, 5 min mobile; it
        leaves sooner by the ratio or when nobody needs it).
    carousel_share: a carousel reader that may seed joins the directive's swarm
        while it receives, offering the pieces it holds (`carousel_share`), not only
        once its copy is complete. Off by default: in the two flash-crowd-50 runs with
        it (29 Nov) the phones took 219.5 and 194.1 s at the median against 146.0 s
        without, and the origins' egress did not fall (8.7% and 10.1% of the twin's
        against 9.4%); ``pressrun get --share-while-receiving``.
    multicast_deadline_s: in multicast mode, the carousel gets this long to deliver
        a complete file; then the pieces that verify are kept and the rest comes from
        the swarm or origin sections (docs/multicast.md). 60 s.
    multicast_interface: the IPv4 address of the interface to join channels on
        (None: the directive's hint, else 0.0.0.0, the kernel's choice).
    multicast_receive_drop: drop this share of multicast packets in the receive
        path, at random (loss emulation for tests and the bench; 0: none).
    amt: multicast mode through an AMT relay (RFC 7450, docs/multicast.md):
        ``auto`` when the native join hears no announcement within
        ``amt_native_wait_s`` and a relay is known (the directive's, ``amt_relays``,
        or by DNS with ``amt_dns``), ``always`` (no native join), ``never``.
    amt_relays: the reader's own relays (``HOST[:PORT]``), tried before the
        directive's.
    amt_dns: look relays up by DNS (RFC 8777 AMTRELAY records at the reverse name of
        the carousel's source) at this resolver, ``HOST[:PORT]`` or ``system``
        (/etc/resolv.conf); None: no lookup.
    amt_native_wait_s: how long the native join gets to hear an announcement before
        the relay is tried (``auto``). 1.5 s: announcements go every 0.5 s.
    supernode_host: in swarm mode, also run a Chord supernode of the issue's ring
        while in the swarm, listening on and announced as this reachable address
        (docs/chord.md); None: none. Never with the mobile profile.
    carousel_control_group: in swarm mode, watch the publisher's signed control
        channel at this ``GROUP:PORT`` (None: do not): while a carousel of the issue
        is on the air, the client leaves the swarm for it once the carousel would
        bring the whole file sooner than the swarm's peers the rest, both from rates
        the client measured (`pressrun.clients.carousel_switch`; the balancer starts
        a carousel at peak demand: a newcomer sent to the swarm just before the peak
        then does not take the file from the origins' web seeds). The swarm is the
        carousel's fallback.
    carousel_control_source: the sender's address, which a source-specific (232/8)
        ``carousel_control_group`` and its channels are joined by (None: any-source
        groups only; a 232/8 group cannot be joined without it).
    carousel_rate_window_s: see carousel_control_group: the swarm's rates are
        measured over the last this many seconds of its status reports. 4 s (eight
        status reports).
    uploader_policy: in swarm mode, the peer's uploader policy by name
        (`pressrun.peer.uploader`: ``libtorrent``, ``stripes``, ``chord``); None: the
        peer's default. With a policy that asks the issue's Chord ring, the peer
        listens on (and tells the ring) the address it reaches the tracker from.
    """

    profile: str = "desktop"
    concurrency: int = 2
    section_bytes: int | None = None
    max_sections: int = 3
    max_section_bytes: int | None = None
    stall_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    balancer_timeout_s: float = 5.0
    max_attempts_without_progress: int = 8
    give_up_after_s: float = 0.0
    failed_ttl_s: float = 30.0
    retry_backoff_s: float = 0.25
    retry_backoff_max_s: float = 4.0
    retry_jitter: float = 0.5
    metered: bool = False
    steal_after_s: float | None = 4.0
    steal_min_elapsed_s: float = 1.0
    swarm_stall_after_s: float | None = None
    swarm_max_seed_s: float | None = None
    carousel_share: bool = False
    multicast_deadline_s: float = 60.0
    multicast_interface: str | None = None
    multicast_receive_drop: float = 0.0
    amt: str = "auto"
    amt_relays: tuple[str, ...] = ()
    amt_dns: str | None = None
    amt_native_wait_s: float = 1.5
    supernode_host: str | None = None
    carousel_control_group: str | None = None
    carousel_control_source: str | None = None
    carousel_rate_window_s: float = 4.0
    uploader_policy: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.section_bytes is not None and self.section_bytes < 1:
            raise ValueError("section_bytes must be positive (or None: automatic)")
        if self.max_sections < 1:
            raise ValueError("max_sections must be at least 1")
        if self.max_section_bytes is not None and self.max_section_bytes < 1:
            raise ValueError("max_section_bytes must be positive (or None)")
        for name in ("stall_timeout_s", "connect_timeout_s", "balancer_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number")
        if self.max_attempts_without_progress < 1:
            raise ValueError("max_attempts_without_progress must be at least 1")
        if self.steal_after_s is not None and not self.steal_after_s > 0:
            raise ValueError("steal_after_s must be positive (or None: never)")
        for name in ("swarm_stall_after_s", "swarm_max_seed_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number >= 0 (or None)")
        if not (self.multicast_deadline_s > 0 and math.isfinite(self.multicast_deadline_s)):
            raise ValueError("multicast_deadline_s must be a positive number")
        if not 0 <= self.multicast_receive_drop < 1:
            raise ValueError("multicast_receive_drop must be in [0, 1)")
        if self.amt not in ("auto", "always", "never"):
            raise ValueError("amt must be auto, always or never")
        if not (self.amt_native_wait_s > 0 and math.isfinite(self.amt_native_wait_s)):
            raise ValueError("amt_native_wait_s must be a positive number")
        if not (self.carousel_rate_window_s > 0 and math.isfinite(self.carousel_rate_window_s)):
            raise ValueError("carousel_rate_window_s must be a positive number")
        if self.failed_ttl_s < 0 or self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0:
            raise ValueError("failed_ttl_s and the backoffs must not be negative")
        if not 0 <= self.retry_jitter <= 1:
            raise ValueError("retry_jitter must be in [0, 1]")
        if not (self.give_up_after_s >= 0 and math.isfinite(self.give_up_after_s)):
            raise ValueError("give_up_after_s must be a number >= 0")
        if self.uploader_policy is not None:
            from pressrun.peer.uploader import uploader_policy_names

            if self.uploader_policy not in uploader_policy_names():
                raise ValueError(
                    f"unknown uploader policy {self.uploader_policy!r}; "
                    f"known: {', '.join(uploader_policy_names())}"
                )
        if self.supernode_host is not None and self.profile == "mobile":
            raise ValueError(
                "a mobile profile never runs a supernode (it uses the ring only as a client)"
            )

    def backoff_s(
        self, failures_in_a_row: int, retry_after_s: float | None = None, spread: float = 0.0
    ) -> float:
        """The wait before the next attempt after ``failures_in_a_row`` failures:
        ``retry_backoff_s`` doubled per failure, capped at ``retry_backoff_max_s``; a
        server's Retry-After when it asks for longer; lengthened by ``spread`` (a
        uniform draw in [0, 1) from the caller's ``random.Random``) times
        ``retry_jitter`` of itself."""
        if not 0 <= spread <= 1:
            raise ValueError(f"spread must be in [0, 1], got {spread!r}")
        n = max(1, failures_in_a_row)
        wait = min(self.retry_backoff_max_s, self.retry_backoff_s * 2.0 ** min(n - 1, 30))
        if retry_after_s is not None and retry_after_s > wait:
            wait = retry_after_s
        return wait * (1.0 + self.retry_jitter * spread)

    def gives_up(self, failures_in_a_row: int, without_progress_s: float) -> bool:
        """Whether a download gives up: ``max_attempts_without_progress`` failures in
        a row and at least ``give_up_after_s`` without progress."""
        return (
            failures_in_a_row >= self.max_attempts_without_progress
            and without_progress_s >= self.give_up_after_s
        )

    def section_size_for(self, size_bytes: int, piece_size_bytes: int) -> int:
        """The section size in bytes for a file: whole pieces, at least one piece.

        Automatic: ``max(piece, ceil(size / max_sections))`` rounded up to pieces,
        then capped by ``max_section_bytes`` (rounded down to pieces, at least one).
        """
        if self.section_bytes is not None:
            wanted = self.section_bytes
        else:
            wanted = max(piece_size_bytes, -(-size_bytes // self.max_sections))
            if self.max_section_bytes is not None:
                capped = (self.max_section_bytes // piece_size_bytes) * piece_size_bytes
                wanted = min(wanted, max(piece_size_bytes, capped))
        pieces = max(1, -(-wanted // piece_size_bytes))
        return pieces * piece_size_bytes

    def with_section_mb(self, section_mb: float | None) -> ClientConfig:
        """This config with ``--section-mb`` applied (None: unchanged)."""
        if section_mb is None:
            return self
        if not (section_mb > 0 and math.isfinite(section_mb)):
            raise ValueError("--section-mb must be a positive number")
        return replace(self, section_bytes=max(1, int(section_mb * MIB)))


#: A desktop on a fixed line: two sections at once, the file in three sections.
DESKTOP = ClientConfig(profile="desktop")

#: A phone: one connection, sections of at most 8 MiB (a dropped radio link loses
#: at most a piece and costs one re-ask), quicker stall detection, metered.
MOBILE = ClientConfig(
    profile="mobile",
    concurrency=1,
    max_section_bytes=8 * MIB,
    stall_timeout_s=8.0,
    metered=True,
)

PROFILES: dict[str, ClientConfig] = {"desktop": DESKTOP, "mobile": MOBILE}


def profile(name: str) -> ClientConfig:
    """The config of a named profile; ValueError for an unknown name."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r}: choose one of {', '.join(sorted(PROFILES))}"
        ) from None
