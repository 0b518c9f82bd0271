"""The reader service's configuration: a frozen dataclass with documented defaults."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pressrun.clients.config import MOBILE, ClientConfig, parse_balancer_urls
from pressrun.security import ServiceSecurity

#: this package's folder: ``web/`` (the app) and ``node_modules/`` (npm packages)
PACKAGE_DIR = Path(__file__).resolve().parent


#: an ICE server URL as RTCPeerConnection takes it (RFC 7064 / RFC 7065)
_ICE_URL = re.compile(r"^(stun|stuns|turn|turns):[^\s]+$")


@dataclass(frozen=True)
class SwarmSettings:
    """The reader as a swarm peer (docs/reader.md, "Peers"), served in ``config.json``.

    enabled: the app adds ``peer=webrtc`` to its directive requests and joins the
        swarm a "swarm" directive names; False: origins only (the bench's baseline).
    ice_servers: STUN/TURN URLs for WebRTC (``stun:host:3478``, ``turn:host:3478``,
        ``turns:host:5349?transport=tcp``); none: host candidates only, enough on one
        LAN (and in the tests), not across NATs.
    turn_username / turn_credential: the TURN server's long-term credential, given to
        every ``turn:``/``turns:`` URL. It is in ``config.json``, which anyone who can
        load the app reads: use a TURN user for readers only (coturn ``--user``), or
        short-lived REST credentials rotated by the operator.
    connect_timeout_s: no peer connected and no byte from a web seed within this
        long while the directive names no web seed or every one has failed a request:
        the origins as before (a web seed that has not failed is slow, not down: the
        reader stays, bounded by stall_timeout_s).
    stall_timeout_s: no piece stored through the swarm for this long: the origins.
    request_timeout_s: the least time a peer holding requests of this reader may send
        nothing before they are asked again (more for a peer whose answers take longer:
        3x its answer time, at most 30 s); silent three times that long in all while
        others send, it is disconnected (swarm-rules.js silentPeerStep).
    web_seed_starved_s / web_seed_stall_s / web_seed_hold_s: the origins serve as web
        seeds from the start of a swarm download, offering every piece (nothing waits
        for peers). Once the peers deliver (over the last web_seed_stall_s at least
        web_seed_min_peer_rate_bytes_per_s, some peer holds a piece the reader lacks, a
        peer sent a byte within stall_s, for hold_s) they offer only the pieces no
        connected peer holds, and every piece again when no connected peer holds a
        piece the reader lacks for starved_s, no byte came from a peer for stall_s, the
        peers fall under the floor, or the reader is slower than 0.9 x what the web
        seeds alone gave it (swarm.js WebSeedRule; bench/reader_swarm.py).
    web_seed_min_peer_rate_bytes_per_s: the least the peers together must send for
        the web seeds to leave (one mobile uploader's cap).
    share_ratio / max_seed_time_s: the fair-exit rule for a reader that finished: it
        stays in the swarm (the page open, uploading allowed) until it uploaded
        share_ratio x what it downloaded, or for max_seed_time_s at most (the mobile
        peer profile's 300 s, docs/swarm.md).
    upload_limit_bytes_per_s: the upload cap (the mobile peer profile's 256 KiB/s)
        where the browser does not say the link is Wi-Fi or Ethernet; 0: none.
    unmetered_upload_limit_bytes_per_s: the upload cap on a link the browser says is
        Wi-Fi or Ethernet (``navigator.connection.type``, no Data Saver), the user's
        sharing setting on; 0 (default): none. bench/reader_swarm.py: with 256 KiB/s
        the crowd's readers could not carry it (docs/results/2026-11-28-reader-swarm.md).
    """

    enabled: bool = True
    ice_servers: tuple[str, ...] = ()
    turn_username: str | None = None
    turn_credential: str | None = None
    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 15.0
    request_timeout_s: float = 3.0
    web_seed_starved_s: float = 1.0
    web_seed_stall_s: float = 2.0
    web_seed_hold_s: float = 1.0
    web_seed_min_peer_rate_bytes_per_s: int = 256 * 1024
    share_ratio: float = 1.0
    max_seed_time_s: float = 300.0
    upload_limit_bytes_per_s: int = 256 * 1024
    unmetered_upload_limit_bytes_per_s: int = 0

    def __post_init__(self) -> None:
        for url in self.ice_servers:
            if not _ICE_URL.match(url):
                raise ValueError(
                    f"ICE server {url!r} is not a stun:, stuns:, turn: or turns: URL "
                    "(e.g. stun:stun.example.net:3478)"
                )
        turn = [u for u in self.ice_servers if u.startswith("turn")]
        if turn and (not self.turn_username or not self.turn_credential):
            raise ValueError(
                "a TURN server needs --turn-username and --turn-credential (its "
                "long-term credential)"
            )
        for name in (
            "connect_timeout_s",
            "stall_timeout_s",
            "request_timeout_s",
            "web_seed_starved_s",
            "web_seed_stall_s",
            "web_seed_hold_s",
            "max_seed_time_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, not {value!r}")
        if not (math.isfinite(self.share_ratio) and self.share_ratio >= 0):
            raise ValueError("share_ratio must be a finite number >= 0")
        if self.web_seed_min_peer_rate_bytes_per_s < 0:
            raise ValueError("web_seed_min_peer_rate_bytes_per_s must be >= 0")
        if self.upload_limit_bytes_per_s < 0:
            raise ValueError("upload_limit_bytes_per_s must be >= 0")
        if self.unmetered_upload_limit_bytes_per_s < 0:
            raise ValueError("unmetered_upload_limit_bytes_per_s must be >= 0")

    def ice_config(self) -> list[dict[str, str]]:
        """The ``iceServers`` of RTCPeerConnection's configuration."""
        out: list[dict[str, str]] = []
        for url in self.ice_servers:
            entry = {"urls": url}
            if url.startswith("turn") and self.turn_username and self.turn_credential:
                entry |= {"username": self.turn_username, "credential": self.turn_credential}
            out.append(entry)
        return out

    def app_config(self) -> dict[str, Any]:
        """The ``swarm`` object of ``config.json``."""
        return {
            "enabled": self.enabled,
            "ice_servers": self.ice_config(),
            "connect_timeout_s": self.connect_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "request_timeout_s": self.request_timeout_s,
            "web_seed_starved_s": self.web_seed_starved_s,
            "web_seed_stall_s": self.web_seed_stall_s,
            "web_seed_hold_s": self.web_seed_hold_s,
            "web_seed_min_peer_rate_bytes_per_s": self.web_seed_min_peer_rate_bytes_per_s,
            "share_ratio": self.share_ratio,
            "max_seed_time_s": self.max_seed_time_s,
            "upload_limit_bytes_per_s": self.upload_limit_bytes_per_s,
            "unmetered_upload_limit_bytes_per_s": self.unmetered_upload_limit_bytes_per_s,
        }


@dataclass(frozen=True)
class ReaderConfig:
    """How ``pressrun serve reader`` serves the web app.

    balancer_url: the balancer the app asks for directives (and, through its
        ``/v1/origins``, for the issues there are); the browser calls it directly, so
        it must be reachable from the phone and answer CORS (docs/reader.md). An
        encrypted issue's manifest names its subscription service itself. Several
        balancers: a comma-separated list, tried in order (`balancer_urls`).
    publisher_keys: Ed25519 public keys (64 hex) the app accepts manifests from. At
        least one is needed unless ``trust_on_first_use`` is set: like ``pressrun get``,
        the reader trusts no key it was not configured with (issue 11).
    trust_on_first_use: with no publisher key, accept the first manifest's key and pin
        it in the browser from then on (opt-in, ``--trust-on-first-use``).
    download: the download settings the app uses (concurrency, section size, stall
        timeout, how long a failed origin is avoided, backoff): the client's mobile
        profile unless told otherwise, so the phone downloads as ``pressrun get
        --profile mobile`` does.
    web_dir / modules_dir: the app's files and the installed npm packages.
    swarm: the peer path (issue 26, docs/reader.md "Peers"): whether the app asks to
        be sent to the swarm, its STUN/TURN servers, and its timings (`SwarmSettings`).
    """

    balancer_url: str
    host: str = "127.0.0.1"
    port: int = 0
    publisher_keys: tuple[str, ...] = ()
    trust_on_first_use: bool = False
    download: ClientConfig = MOBILE
    web_dir: Path = field(default=PACKAGE_DIR / "web")
    modules_dir: Path = field(default=PACKAGE_DIR / "node_modules")
    tls: ServiceSecurity = field(default_factory=ServiceSecurity)  # HTTPS (--tls-cert/--tls-key)
    swarm: SwarmSettings = field(default_factory=SwarmSettings)

    def __post_init__(self) -> None:
        self.balancer_urls  # noqa: B018 (a malformed list fails here)
        for key in self.publisher_keys:
            if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
                raise ValueError(f"publisher key {key!r} is not 64 lower-case hex digits")
        if not self.publisher_keys and not self.trust_on_first_use:
            raise ValueError(
                "the reader trusts no publisher key: give --publisher-key (repeatable) with "
                "the publisher's public key, or --trust-on-first-use to pin the first key seen"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is out of range 0..65535")

    @property
    def balancer_urls(self) -> tuple[str, ...]:
        """The balancers, in order: ``balancer_url`` may be a comma-separated list
        (issue 30: the app moves to the next on a failure, as ``pressrun get``)."""
        return parse_balancer_urls(self.balancer_url)
