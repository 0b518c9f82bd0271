"""``pressrun serve balancer``: the front door that scores origins and answers directives."""

from __future__ import annotations

import argparse
import os
import string
from pathlib import Path
from typing import Any

from pressrun.balancer.events import OriginSpec
from pressrun.security import add_security_arguments, security_from_args


class OriginListError(ValueError):
    """The ``--origins`` list is malformed."""


def default_origin_name(index: int) -> str:
    """origin-a, origin-b, ..., origin-z, origin-aa, origin-ab, ..."""
    letters = string.ascii_lowercase
    name = ""
    n = index
    while True:
        name = letters[n % 26] + name
        n = n // 26 - 1
        if n < 0:
            return f"origin-{name}"


def parse_origins(text: str) -> tuple[OriginSpec, ...]:
    """``URL``, ``name=URL`` or ``name=URL@weight``, comma-separated, in order.

    Unnamed origins are called origin-a, origin-b, ... by their position in the list.
    """
    from pressrun.balancer.codec import ORIGIN_NAME_RE

    specs: list[OriginSpec] = []
    for index, item in enumerate(text.split(",")):
        item = item.strip()
        if not item:
            raise OriginListError("--origins has an empty entry (two commas in a row?)")
        name = default_origin_name(index)
        if "=" in item:
            name, _, item = item.partition("=")
            if not ORIGIN_NAME_RE.match(name):
                raise OriginListError(
                    f"origin name {name!r} must be letters, digits, '.', '_' or '-'"
                )
        weight = 1.0
        url = item
        if "@" in item:
            url, _, weight_text = item.rpartition("@")
            try:
                weight = float(weight_text)
            except ValueError:
                raise OriginListError(
                    f"weight {weight_text!r} of origin {name!r} is not a number"
                ) from None
            if not weight >= 0 or weight == float("inf"):
                raise OriginListError(f"weight of origin {name!r} must be 0 or more")
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
            raise OriginListError(f"origin {name!r}: {url!r} is not an http:// or https:// URL")
        specs.append(OriginSpec(name, url.rstrip("/"), weight))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise OriginListError(f"origin names must be unique: {', '.join(duplicates)} repeated")
    return tuple(specs)


def parse_trackers(text: str) -> tuple[str, ...]:
    """``--tracker``'s comma-separated announce URLs; empty: no tracker (origin only)."""
    urls = tuple(u.strip() for u in text.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://", "udp://")):
            raise ValueError(f"--tracker {url!r} is not an http://, https:// or udp:// URL")
    if len(set(urls)) != len(urls):
        raise ValueError("--tracker lists a URL twice")
    return urls


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve balancer`` to the serve subcommands."""
    from pressrun.balancer.algorithms import algorithm_class, algorithm_names
    from pressrun.balancer.config import BalancerConfig
    from pressrun.balancer.demand import DemandConfig
    from pressrun.balancer.health import HealthConfig

    demand = DemandConfig()

    choices = algorithm_names()
    listing = "; ".join(f"{n}: {algorithm_class(n).summary}" for n in choices)
    p = serve_subparsers.add_parser(
        "balancer",
        help="score origins from their /stats and answer delivery directives",
        description="Polls every origin's /stats, scores the origins with the chosen "
        "algorithm and answers GET /v1/issues/<id>/directive (JSON), GET /issues/<id> "
        "(302 to an origin), GET /v1/origins, GET /v1/algorithms, /metrics, /healthz. "
        "An origin that does not answer is out of rotation until it answers again.",
    )
    p.add_argument(
        "--origins",
        required=True,
        metavar="LIST",
        help="comma-separated origins, each URL, name=URL or name=URL@weight "
        "(e.g. a=http://127.0.0.1:8001@5,b=http://127.0.0.1:8002); unnamed origins are "
        "origin-a, origin-b, ... in order; weights (default 1) are used by wrr and wlc",
    )
    p.add_argument(
        "--algorithm",
        default=BalancerConfig().algorithm,
        choices=choices,
        metavar="NAME",
        help=f"scoring algorithm (default {BalancerConfig().algorithm}). {listing}",
    )
    p.add_argument(
        "--poll-interval-s",
        type=float,
        default=1.0,
        help="how often each origin's /stats is polled, seconds (default 1.0)",
    )
    p.add_argument(
        "--stale-after-s",
        type=float,
        default=None,
        help="an origin with no good status for this long is out of rotation even if no "
        "poll failed outright (default (fall + 0.5) x the poll interval, at least 3.5 x)",
    )
    p.add_argument(
        "--rise",
        type=int,
        default=HealthConfig().rise,
        help="consecutive good /stats polls that bring an origin that was down back into "
        f"rotation (HAProxy's rise; default {HealthConfig().rise})",
    )
    p.add_argument(
        "--fall",
        type=int,
        default=HealthConfig().fall,
        help="consecutive failed polls that take an origin in rotation out (HAProxy's "
        f"fall; default {HealthConfig().fall})",
    )
    p.add_argument(
        "--slowstart-s",
        type=float,
        default=HealthConfig().slowstart_s,
        help="seconds over which an origin that came back grows from no share of new "
        f"clients to its full share (HAProxy's slowstart; default {HealthConfig().slowstart_s:g}"
        "; 0: at once)",
    )
    p.add_argument(
        "--poll-timeout-s",
        type=float,
        default=None,
        help="timeout of one /stats poll (default 0.8 x the poll interval)",
    )
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0: any)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--directive-origins",
        type=int,
        default=3,
        help="origins listed in a directive, best first (default 3)",
    )
    p.add_argument(
        "--expires-in-s",
        type=float,
        default=5.0,
        help="how long a client may act on a directive before asking again (default 5)",
    )
    p.add_argument(
        "--retry-after-s",
        type=float,
        default=2.0,
        help="Retry-After of a 503 when no origin is available (default 2)",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an algorithm parameter, repeatable (e.g. w_max=10 for weighted, "
        "inflation_decay=0.9 for alg2)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random numbers of algorithms that draw them (default: random)",
    )
    p.add_argument(
        "--prefetch-share",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="the most of the origins' capacity prefetch of embargoed issues may use "
        "(GET /v1/issues/<id>/prefetch, `pressrun get --prefetch`; default 0.2)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log every HTTP request (off by default: it slows directives down)",
    )
    p.add_argument(
        "--tracker",
        default=None,
        metavar="URL[,URL...]",
        help="the tracker's announce URL (e.g. http://127.0.0.1:6969/announce); given, an "
        "issue in demand is answered in swarm mode (default, or an empty value: origin "
        "mode only). Several comma-separated URLs: tracker instances sharing one Redis, "
        "named in turn by the swarm directives",
    )
    p.add_argument(
        "--swarm-enter-downloaders",
        type=float,
        default=demand.enter_downloaders,
        help="estimated concurrent downloaders of an issue at or above which it moves to "
        f"the swarm (default {demand.enter_downloaders:g})",
    )
    p.add_argument(
        "--swarm-leave-downloaders",
        type=float,
        default=demand.leave_downloaders,
        help="estimated concurrent downloaders below which it goes back to the origins "
        f"(default {demand.leave_downloaders:g}; must be below the enter threshold)",
    )
    p.add_argument(
        "--swarm-min-dwell-s",
        type=float,
        default=demand.min_dwell_s,
        help="a mode is left downward only this long after the last change, seconds; "
        "a step up (origin to swarm, to multicast) is taken at once "
        f"(default {demand.min_dwell_s:g})",
    )
    p.add_argument(
        "--demand-client-window-s",
        type=float,
        default=demand.client_window_s,
        help="a client address (IPv4, IPv6 /64) counts as demand at most once per issue "
        f"in this many seconds; 0: every request counts (default {demand.client_window_s:g})",
    )
    p.add_argument(
        "--demand-count-every-request-from",
        action="append",
        default=None,
        metavar="CIDR",
        help="a network whose every request counts as demand (repeatable; default "
        "loopback, the operator's host; 'none': no such network, e.g. behind a reverse "
        "proxy on this host)",
    )
    p.add_argument(
        "--multicast-sender",
        default=None,
        metavar="URL",
        help="the multicast sender's control API (pressrun serve multicast); given, an "
        "issue at peak demand gets a carousel and multicast directives (default, or an "
        "empty value: none)",
    )
    p.add_argument(
        "--multicast-token-env",
        default="PRESSRUN_MULTICAST_TOKEN",
        metavar="NAME",
        help="environment variable holding the sender's API token "
        "(default PRESSRUN_MULTICAST_TOKEN)",
    )
    p.add_argument(
        "--multicast-control-group",
        default=None,
        metavar="GROUP:PORT",
        help="the sender's control group, told to clients (needed with --multicast-sender)",
    )
    p.add_argument(
        "--multicast-interface",
        default=None,
        metavar="ADDR",
        help="interface hint told to clients (e.g. 127.0.0.1 on one host; default none)",
    )
    p.add_argument(
        "--multicast-source",
        default=None,
        metavar="ADDR",
        help="the sender's address, told to clients: needed for a source-specific "
        "(232/8) control group and for AMT relays",
    )
    p.add_argument(
        "--amt-relay",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="an AMT relay (RFC 7450, pressrun serve amt-relay) named in multicast "
        "directives for readers without a multicast route (repeat for more)",
    )
    p.add_argument(
        "--multicast-enter-downloaders",
        type=float,
        default=100.0,
        help="estimated concurrent downloaders at or above which an issue moves to "
        "multicast (default 100)",
    )
    p.add_argument(
        "--multicast-leave-downloaders",
        type=float,
        default=50.0,
        help="estimated concurrent downloaders below which it leaves multicast "
        "(default 50; between the swarm's leave and the multicast enter threshold)",
    )
    p.add_argument(
        "--redis",
        default=os.environ.get("PRESSRUN_BALANCER_REDIS") or None,
        metavar="URL",
        help="redis://host:port/db shared by several balancer instances: they share each "
        "issue's demand (the swarm and multicast thresholds hold for the total) and one "
        "of them starts and stops carousels (default: $PRESSRUN_BALANCER_REDIS, else a "
        "balancer alone)",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        default=None,
        metavar="PEM",
        help="an extra CA for the origins' HTTPS certificates (default: $PRESSRUN_CA_FILE)",
    )
    add_security_arguments(p, token=False)
    p.set_defaults(func=run_balancer)


def _parse_params(items: list[str]) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {item!r} must be KEY=VALUE")
        try:
            params[key] = float(value)
        except ValueError:
            raise ValueError(f"--param {item!r}: {value!r} is not a number") from None
    return params


def _multicast_options(args: argparse.Namespace) -> dict[str, Any]:
    """The service's multicast settings from the flags (ValueError when incomplete)."""
    import os

    from pressrun.balancer.events import MulticastInfo
    from pressrun.multicast.net import parse_group

    if not args.multicast_sender:
        return {}
    if not args.multicast_control_group:
        raise ValueError("--multicast-sender needs --multicast-control-group GROUP:PORT")
    group, _ = parse_group(args.multicast_control_group)
    from pressrun.multicast.config import is_ssm
    from pressrun.multicast.gateway import parse_relay

    if (is_ssm(group) or args.amt_relay) and not args.multicast_source:
        raise ValueError("a 232/8 control group or --amt-relay needs --multicast-source ADDR")
    for relay in args.amt_relay:
        parse_relay(relay)
    token = os.environ.get(args.multicast_token_env, "").strip()
    if not token:
        raise ValueError(
            f"--multicast-sender needs the sender's token in ${args.multicast_token_env}"
        )
    return {
        "multicast_sender_url": args.multicast_sender.rstrip("/"),
        "multicast_token": token,
        "multicast": MulticastInfo(
            args.multicast_control_group,
            args.multicast_interface,
            args.multicast_source,
            tuple(args.amt_relay),
        ),
    }


def _every_request_from(given: list[str] | None) -> tuple[str, ...]:
    """``--demand-count-every-request-from`` (None: DemandConfig's default, loopback)."""
    from pressrun.balancer.demand import DemandConfig

    if given is None:
        return DemandConfig().count_every_request_from
    return tuple(n for n in given if n.lower() != "none")


def run_balancer(args: argparse.Namespace) -> int:
    """Run the balancer until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import sys

    from pressrun.balancer.aio import BalancerServiceConfig, serve
    from pressrun.balancer.config import BalancerConfig
    from pressrun.balancer.demand import DemandConfig
    from pressrun.balancer.health import HealthConfig
    from pressrun.balancer.prefetch import PrefetchConfig

    try:
        origins = parse_origins(args.origins)
        trackers = parse_trackers(args.tracker or "")
        health = HealthConfig(rise=args.rise, fall=args.fall, slowstart_s=args.slowstart_s)
        stale = (
            args.stale_after_s
            if args.stale_after_s is not None
            else max(3.5, health.fall + 0.5) * args.poll_interval_s
        )
        balancer = BalancerConfig(
            poll_interval_s=args.poll_interval_s,
            stale_after_s=stale,
            directive_origins=args.directive_origins,
            expires_in_s=args.expires_in_s,
            retry_after_s=args.retry_after_s,
            algorithm=args.algorithm,
        )
        if args.poll_timeout_s is not None and args.poll_timeout_s <= 0:
            raise ValueError("--poll-timeout-s must be positive")
        if args.expires_in_s <= 0:
            raise ValueError("--expires-in-s must be positive")
        config = BalancerServiceConfig(
            origins=origins,
            balancer=balancer,
            host=args.host,
            port=args.port,
            seed=args.seed,
            algorithm_params=_parse_params(args.param),
            poll_timeout_s=args.poll_timeout_s,
            access_log=args.access_log,
            tracker_url=trackers[0] if trackers else None,
            extra_tracker_urls=trackers[1:],
            demand=DemandConfig(
                enter_downloaders=args.swarm_enter_downloaders,
                leave_downloaders=args.swarm_leave_downloaders,
                min_dwell_s=args.swarm_min_dwell_s,
                multicast_enter_downloaders=(
                    args.multicast_enter_downloaders if args.multicast_sender else None
                ),
                multicast_leave_downloaders=args.multicast_leave_downloaders,
                client_window_s=args.demand_client_window_s,
                count_every_request_from=_every_request_from(args.demand_count_every_request_from),
            ),
            **_multicast_options(args),
            security=security_from_args(args),
            ca_file=args.ca_file,
            health=health,
            redis_url=args.redis or None,
            prefetch=PrefetchConfig(share=args.prefetch_share),
        )
        config.security.server_ssl_context()  # a bad --tls-cert/--tls-key fails here
    except ValueError as err:
        print(f"pressrun serve balancer: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except OSError as err:
        print(
            f"pressrun serve balancer: cannot listen on {args.host}:{args.port}: {err}",
            file=sys.stderr,
        )
        return 1
    return 0
