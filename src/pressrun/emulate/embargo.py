"""The release minute in the emulation (issue 35): an issue under an embargo, readers
who pre-position it, and the same crowd without an embargo.

A scenario's ``[embargo]`` (`pressrun.emulate.scenario.Embargo`) makes each run:

1. start the subscription service alone (``docker-compose up subscriptions``),
   register one subscriber per reader (`subscriber_keys`, `register_subscribers`:
   a key pair each, mounted read-only into the reader's container), and publish the
   issue encrypted for them (`publish_for_subscribers`) into the run's own content
   folder, its torrent naming tracker-1 (the prefetchers' swarm); with the embargo
   the release is an hour off at first;
2. bring up the rest of the project on that bundle;
3. with the embargo, just before the first reader is released, move the release to
   ``window_s`` after it (`move_release`: a signed notice, as ``pressrun release
   move`` does; every reader learns the moved time from its first wrap request), and
   start each reader as ``pressrun get --prefetch`` over the window's start; without
   it (the twin, ``no-embargo``), every reader is a plain ``pressrun get`` arriving
   over the release minute.

The report (`release_summary`): the share of readers whose ``opened_at`` (``get
--json``) is within ``open_within_s`` of the release, the origins' bytes before and
from the release, and the subscription service's wrap latency p50 / p99 from its
``pressrun_subscriptions_wrap_seconds`` histogram (read at the end: no wrap is handed
out before the release, so every wrap counted is the release's).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pressrun.emulate.project import ComposeProject
from pressrun.emulate.scenario import Embargo

#: the twin of an embargo scenario: the same readers, no embargo, at the release minute
NO_EMBARGO = "no-embargo"
#: where a reader's container sees the run's subscriber keys
KEYS_MOUNT = "/run/pressrun-keys"
#: the subscription service's port on the project's network (docker-compose.yml)
SUBSCRIPTIONS_PORT = 8091
#: the tracker the torrent names, for the prefetchers' swarm
PREFETCH_TRACKER = "http://tracker-1:6969/announce"
WRAP_HISTOGRAM = "pressrun_subscriptions_wrap_seconds"
_BUCKET = re.compile(WRAP_HISTOGRAM + r'_bucket\{le="([^"]+)"\} ([0-9.e+-]+)')


def key_path(keys_dir: Path, number: int) -> Path:
    """Reader ``number``'s subscriber key file."""
    return keys_dir / f"{number}.key"


def subscriber_keys(keys_dir: Path, numbers: Iterable[int]) -> dict[int, bytes]:
    """A subscriber key pair per reader number (X25519, `generate_keypair`), their
    public keys."""
    from pressrun.content.keys import generate_keypair, load_subscriber_key

    keys_dir.mkdir(parents=True, exist_ok=True)
    out: dict[int, bytes] = {}
    for number in numbers:
        secret, _ = generate_keypair(key_path(keys_dir, number), force=True, subscriber=True)
        out[number] = bytes(load_subscriber_key(secret).public_key)
    return out


async def register_subscribers(url: str, token: str, keys: Mapping[int, bytes]) -> None:
    """Add every reader's key to the subscription service at ``url`` (a few at once)."""
    import aiohttp

    from pressrun.subscriptions.client import SubscriptionsClient

    limit = asyncio.Semaphore(8)
    async with aiohttp.ClientSession() as http:
        client = SubscriptionsClient(url, http, operator_token=token)

        async def add(number: int, key: bytes) -> None:
            async with limit:
                await client.add_subscriber(key, f"reader-{number}")

        await asyncio.gather(*(add(n, k) for n, k in keys.items()))


def publish_for_subscribers(
    source: Path,
    *,
    issue_id: str,
    key_file: Path,
    content_dir: Path,
    web_seeds: Sequence[str],
    url: str,
    token: str,
    release_at: str | None,
) -> None:
    """``pressrun publish --encrypt [--release-at]`` of ``source`` for the service's
    subscribers, the torrent naming `PREFETCH_TRACKER`."""
    from pressrun.content.publish import publish
    from pressrun.subscriptions.client import HttpSubscriberDirectory

    content_dir.mkdir(parents=True, exist_ok=True)
    publish(
        source,
        issue_id=issue_id,
        title="Release-minute issue (generated sample)",
        key_path=key_file,
        content_dir=content_dir,
        web_seeds=web_seeds,
        trackers=[PREFETCH_TRACKER],
        encrypt_for=HttpSubscriberDirectory(url, token),
        release_at=release_at,
    )


def release_at_text(wall: float) -> str:
    """The release time as a notice carries it (UTC, whole seconds), not before
    ``wall``."""
    from pressrun.content.release import utc_text

    return utc_text(math.ceil(wall))


async def move_release(
    url: str, token: str, key_file: Path, issue_id: str, version: int, at: str
) -> None:
    """Move the version's release to ``at`` with the next signed notice (what
    ``pressrun release move`` does)."""
    import aiohttp

    from pressrun.content.keys import load_signing_key
    from pressrun.content.release import ReleaseNotice, sign_release, utc_text
    from pressrun.subscriptions.client import SubscriptionsClient

    key = load_signing_key(key_file)
    async with aiohttp.ClientSession() as http:
        client = SubscriptionsClient(url, http, operator_token=token)
        doc = await client.release(issue_id, version)
        sequence = 1 if doc is None else int(doc["release"]["sequence"]) + 1
        import time

        notice = ReleaseNotice(
            issue_id=issue_id,
            version=version,
            release_at=at,
            revoked=False,
            sequence=sequence,
            publisher_key=bytes(key.verify_key).hex(),
            signed_at=utc_text(time.time()),  # noqa: TID251 (a notice's wall-clock time)
        )
        await client.put_release(sign_release(notice, key))


def client_args(number: int, *, prefetch: bool) -> list[str]:
    """A reader's extra ``pressrun get`` arguments: its subscriber key, ``--prefetch``
    with the embargo."""
    key = f"{KEYS_MOUNT}/{number}.key"
    return ["--subscriber-key", key, *(["--prefetch"] if prefetch else [])]


def parse_wrap_buckets(metrics: str) -> dict[float, float]:
    """The wrap histogram's cumulative buckets (upper bound -> count) from /metrics."""
    return {float(le): float(n) for le, n in _BUCKET.findall(metrics)}


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile``: the ``q`` quantile of cumulative buckets,
    linear within the bucket it falls in (the highest finite bound for the +Inf one);
    None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def bytes_from(series: Sequence[Sequence[float]], t_s: float) -> int:
    """Bytes a cumulative counter series (``[(t, total)]``) grew by from ``t_s`` to its
    end (from its first sample when it starts later)."""
    if len(series) < 2:
        return 0
    at = series[0][1]
    for t, total in series:
        if t > t_s:
            break
        at = total
    return int(series[-1][1] - at)


def release_summary(
    rows: Sequence[Mapping[str, Any]],
    egress: Mapping[str, Sequence[Sequence[float]]],
    *,
    release_s: float,
    release_wall: float,
    open_within_s: float,
    wrap_buckets: Mapping[float, float],
) -> dict[str, Any]:
    """One run's release-minute figures: readers, verified, opened within
    ``open_within_s`` of the release (``opened_at`` against ``release_wall``) and the
    share of all readers that is, the spread of the opening times after the release,
    the origins' bytes before the release and from it (``egress``: the run's series,
    seconds from the first arrival), and the wrap latency p50 / p99."""
    after = sorted(
        float(r["opened_at"]) - release_wall
        for r in rows
        if r.get("verified") and r.get("opened_at") is not None
    )
    within = sum(1 for a in after if -1.0 <= a <= open_within_s)
    total = sum(bytes_from(s, float("-inf")) for s in egress.values())
    from_release = sum(bytes_from(s, release_s) for s in egress.values())
    p50, p99 = (histogram_quantile(q, wrap_buckets) for q in (0.5, 0.99))
    return {
        "readers": len(rows),
        "verified": sum(1 for r in rows if r.get("verified")),
        "release_s": round(release_s, 1),
        "open_within_s": open_within_s,
        "opened_within": within,
        "share_opened_within": round(within / len(rows), 3) if rows else None,
        "opened_after_release_s": {
            "min": round(after[0], 2) if after else None,
            "median": round(after[len(after) // 2], 2) if after else None,
            "max": round(after[-1], 2) if after else None,
        },
        "prefetched": sum(1 for r in rows if r.get("mode") == "prefetch"),
        "origin_bytes_before_release": total - from_release,
        "origin_bytes_from_release": from_release,
        "wraps_timed": int(max(wrap_buckets.values(), default=0)),
        "wrap_latency_s": {
            "p50": None if p50 is None else round(p50, 5),
            "p99": None if p99 is None else round(p99, 5),
        },
    }


def release_comparison(
    with_embargo: Mapping[str, Any], without: Mapping[str, Any]
) -> dict[str, Any]:
    """The origins' bytes from the release with the embargo against the flash crowd
    without it."""
    base = without["origin_bytes_from_release"]
    ours = with_embargo["origin_bytes_from_release"]
    return {
        "origin_bytes_from_release": ours,
        "no_embargo_origin_bytes_from_release": base,
        "ratio": round(ours / base, 4) if base else None,
    }


def release_line(name: str, r: Mapping[str, Any]) -> str:
    """One console line of a run's release minute."""
    wrap = r["wrap_latency_s"]
    after = r["opened_after_release_s"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    share = r["share_opened_within"]
    return (
        f"{name}: {r['opened_within']}/{r['readers']} readers opened the issue within "
        f"{r['open_within_s']:g} s of the release"
        + ("" if share is None else f" ({share:.0%})")
        + f", {r['prefetched']} by prefetch; opened after the release "
        f"{after['min']} / {after['median']} / {after['max']} s (min / median / max); "
        f"origins {r['origin_bytes_before_release'] / 1e6:.0f} MB before the release, "
        f"{r['origin_bytes_from_release'] / 1e6:.0f} MB from it; wrap latency p50 "
        f"{ms(wrap['p50'])}, p99 {ms(wrap['p99'])} ({r['wraps_timed']} wraps)"
    )


# -- the run's steps (adapters: the compose project, the services' HTTP)


async def subscriptions_url(project: ComposeProject) -> str:
    """The subscription service's URL on the project's network (the host and every
    container reach it there; the manifest names it)."""
    ip = await asyncio.to_thread(project.address, "subscriptions")
    return f"http://{ip}:{SUBSCRIPTIONS_PORT}"


async def publish_for_readers(
    project: ComposeProject,
    *,
    issue_id: str,
    source: Path | None,
    key_file: Path,
    content_dir: Path,
    numbers: Sequence[int],
    keys_dir: Path,
    token: str,
    embargoed: bool,
    web_seeds: Sequence[str],
) -> str:
    """The subscription service first, one subscriber per reader, then the issue
    published encrypted for them (with the embargo, released in an hour until
    `set_release` moves it), before the other services start on the bundle; what was
    done, in a line."""
    from pressrun.content.release import utc_text
    from pressrun.emulate.probes import wait_healthy

    if source is None:
        raise ValueError("the release minute needs the issue's file to publish")
    await asyncio.to_thread(project.compose, "up", "-d", "--no-build", "subscriptions")
    url = await subscriptions_url(project)
    await wait_healthy(f"{url}/healthz", timeout_s=60)
    keys = await asyncio.to_thread(subscriber_keys, keys_dir, numbers)
    await register_subscribers(url, token, keys)
    import time

    later = time.time() + 3600  # noqa: TID251 (the service's wall clock decides)
    await asyncio.to_thread(
        publish_for_subscribers, source, issue_id=issue_id, key_file=key_file,
        content_dir=content_dir, web_seeds=web_seeds, url=url, token=token,
        release_at=utc_text(later) if embargoed else None,
    )  # fmt: skip
    return f"{len(keys)} subscribers registered at {url}; the issue published encrypted for " + (
        "them under an embargo" if embargoed else "them, no embargo"
    )


async def set_release(
    project: ComposeProject,
    embargo: Embargo,
    *,
    token: str,
    key_file: Path,
    issue_id: str,
    t0_wall: float,
    embargoed: bool,
) -> dict[str, Any]:
    """With the embargo, the release moved to ``window_s`` after the first arrival
    (``t0_wall``, before any reader asks); without it the release is the first
    arrival. ``release_s``, ``release_wall`` and ``open_within_s``."""
    from pressrun.content.release import unix_of

    out: dict[str, Any] = {"open_within_s": embargo.open_within_s}
    if not embargoed:
        return {**out, "release_s": 0.0, "release_wall": t0_wall}
    at = release_at_text(t0_wall + embargo.window_s)
    url = await subscriptions_url(project)
    await move_release(url, token, key_file, issue_id, 1, at)
    release_wall = float(unix_of(at))
    return {**out, "release_s": release_wall - t0_wall, "release_wall": release_wall}


async def wrap_buckets(project: ComposeProject) -> dict[float, float]:
    """The subscription service's wrap histogram now."""
    import aiohttp

    url = await subscriptions_url(project)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(f"{url}/metrics") as resp:
        return parse_wrap_buckets(await resp.text())
