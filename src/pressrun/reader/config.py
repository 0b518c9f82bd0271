"""The reader service's configuration: a frozen dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pressrun.clients.config import MOBILE, ClientConfig, parse_balancer_urls
from pressrun.security import ServiceSecurity

#: this package's folder: ``web/`` (the app) and ``node_modules/`` (npm packages)
PACKAGE_DIR = Path(__file__).resolve().parent


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
