"""The demo's report: one row per client and the tables printed at the end (rich).

The rows come from `pressrun.clients.aio.fetch_issue` results and the origins' own
``/stats`` documents, so any run of the same topology (the demo, the compose
emulation) can print the same tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pressrun.demo.testbed import DEMO_SHAPES, OriginShape

if TYPE_CHECKING:
    from pressrun.clients.aio import FetchResult
    from pressrun.demo.readers import ReaderOutcome


@dataclass(frozen=True)
class ClientRow:
    """One demo client's outcome."""

    number: int
    result: FetchResult | None
    error: str | None
    sha_ok: bool
    wave: int = 1


def print_tables(
    rows: list[ClientRow],
    stats: list[dict[str, Any]],
    wall_s: float,
    shapes: Sequence[OriginShape] = DEMO_SHAPES,
    *,
    sender_bytes: float | None = None,
) -> None:
    """The demo's two tables (rich): per origin (``stats``: each origin's ``/stats``
    document; ``shapes`` describe them) and the multicast sender (``sender_bytes``, its
    UDP payload bytes; None: no sender), and per client, then the summary lines."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    by_origin: dict[str, int] = {}
    for row in rows:
        if row.result is not None:
            for name, n in row.result.bytes_by_origin.items():
                by_origin[name] = by_origin.get(name, 0) + n
    by_name = {s.name: s for s in shapes}
    origins = Table(title="Origins (000_9aae53f3113e9bd8.txt machines A, B, C)")
    origins.add_column("origin")
    origins.add_column("shape")
    origins.add_column("transfers", justify="right")
    origins.add_column("MB served", justify="right")
    origins.add_column("MB in verified pieces", justify="right")
    for doc in stats:
        name = str(doc["name"])
        origins.add_row(
            name,
            by_name[name].description if name in by_name else "",
            str(doc["transfers_total"]),
            f"{doc['bytes_sent_total'] / 1e6:.1f}",
            f"{by_origin.get(name, 0) / 1e6:.1f}",
        )
    if sender_bytes is not None:
        multicast_mb = sum(r.result.bytes_from_multicast for r in rows if r.result) / 1e6
        origins.add_row(
            "multicast sender",
            "carousel, sent once for all",
            "-",
            f"{sender_bytes / 1e6:.1f}",
            f"{multicast_mb:.1f}",
        )
    console.print(origins)
    clients = Table(title=f"Clients ({len(rows)}, arriving in waves)")
    clients.add_column("client", justify="right")
    clients.add_column("wave", justify="right")
    clients.add_column("mode")
    clients.add_column("s", justify="right")
    clients.add_column("origin sections MB")
    clients.add_column("web seeds MB", justify="right")
    clients.add_column("peers MB", justify="right")
    clients.add_column("multicast MB", justify="right")
    clients.add_column("left by")
    clients.add_column("ok")
    for row in rows:
        r = row.result
        if r is None:
            clients.add_row(
                str(row.number),
                str(row.wave),
                "-",
                "-",
                row.error or "",
                "-",
                "-",
                "-",
                "-",
                "[red]no",
            )
            continue
        used = ", ".join(
            f"{n.removeprefix('origin-')} {b / 1e6:.0f}"
            for n, b in sorted(r.bytes_by_origin.items())
            if b > 0
        )
        mode = r.mode + (" (stalled, then origins)" if r.swarm_stalled else "")
        if r.mode == "multicast" and r.bytes_from_multicast < r.size_bytes - r.resumed_bytes:
            mode += " (then fallbacks)"
        swarm_cols = (
            (f"{r.bytes_from_web_seeds / 1e6:.1f}", f"{r.bytes_from_peers / 1e6:.1f}")
            if r.bytes_from_web_seeds or r.bytes_from_peers or r.mode == "swarm"
            else ("-", "-")
        )
        multicast_col = f"{r.bytes_from_multicast / 1e6:.1f}" if r.mode == "multicast" else "-"
        clients.add_row(
            str(row.number),
            str(row.wave),
            mode,
            f"{r.seconds:.1f}",
            used or "-",
            *swarm_cols,
            multicast_col,
            r.leave_rule or "-",
            "[green]yes" if row.sha_ok and r.verified else "[red]NO",
        )
    console.print(clients)
    results = [r.result for r in rows if r.result is not None]
    in_swarm = sum(1 for r in results if r.mode == "swarm")
    in_multicast = sum(1 for r in results if r.mode == "multicast")
    delivered = sum(r.size_bytes - r.resumed_bytes for r in results)
    served = sum(int(doc["bytes_sent_total"]) for doc in stats)
    if delivered:
        console.print(
            f"{in_swarm} of {len(rows)} clients in swarm mode; the origins served "
            f"{served / 1e6:.1f} MB (their own counters: sections, web seeds, manifests, "
            f"torrents) for {delivered / 1e6:.1f} MB delivered to the clients "
            f"({served / delivered:.2f} of it). Web seeds vs peers per client are "
            "libtorrent's per-connection tallies, approximate."
        )
    if delivered and sender_bytes is not None:
        console.print(
            f"{in_multicast} of {len(rows)} clients from the multicast carousel; the sender "
            f"sent {sender_bytes / 1e6:.1f} MB (its /metrics, while its carousel ran, "
            f"whatever the number of receivers) beside the origins' {served / 1e6:.1f} MB."
        )
    done = [r.result.seconds for r in rows if r.result is not None]
    if done:
        console.print(
            f"{len(done)}/{len(rows)} clients verified; seconds per client: "
            f"min {min(done):.1f}, median {sorted(done)[len(done) // 2]:.1f}, "
            f"max {max(done):.1f}; all done {wall_s:.1f} s after the first started"
        )


def print_reader_table(readers: Sequence[ReaderOutcome]) -> None:
    """The browser readers' table (rich): per reader its wave, the directive's mode it
    followed, the app's seconds, MB from origins (sections and web seeds) and from
    peers (the app's own tallies), and whether the page's SHA-256 of the stored file is
    the publisher's; then one summary line."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Browser readers ({len(readers)}, headless Chromium, phone profile)")
    table.add_column("reader", justify="right")
    table.add_column("wave", justify="right")
    table.add_column("mode")
    table.add_column("s", justify="right")
    table.add_column("origins MB", justify="right")
    table.add_column("peers MB", justify="right")
    table.add_column("ok")
    for r in readers:
        if r.seconds is None:
            table.add_row(str(r.number), str(r.wave), "-", "-", "-", "-", f"[red]no: {r.error}")
            continue
        table.add_row(
            str(r.number),
            str(r.wave),
            r.mode,
            f"{r.seconds:.1f}",
            f"{r.bytes_from_origins / 1e6:.1f}",
            f"{r.bytes_from_peers / 1e6:.1f}",
            "[green]yes" if r.verified else "[red]NO",
        )
    console.print(table)
    done = [r for r in readers if r.seconds is not None]
    origins = sum(r.bytes_from_origins for r in done)
    peers = sum(r.bytes_from_peers for r in done)
    if done and origins + peers:
        console.print(
            f"{sum(r.verified for r in readers)}/{len(readers)} browser readers verified; "
            f"they took {origins / 1e6:.1f} MB from origins and {peers / 1e6:.1f} MB from "
            f"peers ({peers / (origins + peers):.0%} from peers; the app's own tallies)"
        )
