"""``pressrun get``: download an issue through the balancer into a local library."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun get`` to the top-level commands."""
    p = subparsers.add_parser(
        "get",
        help="download an issue through the balancer, verified, into a library",
        description="Ask the balancer where to download ISSUE, fetch it in sections with "
        "Range requests (asking again between sections, so a long download can move to "
        "another origin), verify every piece and the publisher's signature, and only then "
        "put it in LIBRARY/<issue>/. A killed download resumes where it stopped.",
    )
    p.add_argument("issue", metavar="ISSUE", help="the issue id")
    p.add_argument("--balancer", required=True, metavar="URL", help="the balancer's base URL")
    p.add_argument("--library", required=True, metavar="DIR", help="the local library folder")
    p.add_argument(
        "--profile",
        default="desktop",
        choices=["desktop", "mobile"],
        help="desktop: 2 connections, the file in 3 sections; mobile: 1 connection, "
        "sections of at most 8 MiB, metered (default desktop)",
    )
    p.add_argument(
        "--section-mb",
        type=float,
        default=None,
        metavar="N",
        help="section size in MiB (default: the file in 3 sections, so at most 2 handoffs)",
    )
    p.add_argument(
        "--publisher-key",
        default=None,
        metavar="HEX_OR_FILE",
        help="the publisher key to trust (64 hex or a .pub file); default: LIBRARY/"
        "trusted-publishers, or trust on first use when that file does not exist",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, only errors")
    p.set_defaults(func=run_get)


class _RichProgress:
    """The progress bar of ``pressrun get``: bytes, rate, ETA, the origin now used."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("from [cyan]{task.fields[origin]}"),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.origin = "-"

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        self.task = self.bar.add_task(
            issue_id, total=total_bytes, completed=done_bytes, origin=self.origin
        )

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        if origin is not None:
            self.origin = origin
        if self.task is not None:
            self.bar.update(self.task, completed=done_bytes, origin=self.origin)

    def notice(self, text: str) -> None:
        self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)


class _PlainNotices:
    """No bar (``--quiet`` or not a terminal): warnings to stderr, nothing else."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        pass

    def notice(self, text: str) -> None:
        import sys

        if not self.quiet or text.startswith("warning:"):
            print(f"pressrun get: {text}", file=sys.stderr)


def run_get(args: argparse.Namespace) -> int:
    """Download the issue; 0 when it is in the library, 1 when it cannot be, 2 bad flags."""
    import asyncio
    import logging
    import sys
    from pathlib import Path

    from rich.console import Console

    from pressrun.clients.aio import FetchError, fetch_issue
    from pressrun.clients.config import profile
    from pressrun.content.keys import KeyFileError, load_public_key

    def fail(message: str, code: int = 1) -> int:
        print(f"pressrun get: {message}", file=sys.stderr)
        return code

    try:
        config = profile(args.profile).with_section_mb(args.section_mb)
    except ValueError as err:
        return fail(str(err), 2)
    trusted: set[bytes] | None = None
    if args.publisher_key is not None:
        try:
            trusted = {load_public_key(args.publisher_key)}
        except KeyFileError as err:
            return fail(str(err), 2)
    console = Console(stderr=True)
    show_bar = not args.quiet and console.is_terminal
    # what the client has to say goes through the progress object (above the bar, or
    # to stderr); log lines would break the bar's live display
    logging.getLogger("pressrun.clients").setLevel(logging.ERROR)
    progress: Any = _RichProgress(console) if show_bar else _PlainNotices(args.quiet)

    async def go() -> Any:
        return await fetch_issue(
            args.issue,
            balancer_url=args.balancer,
            library=Path(args.library),
            config=config,
            trusted_keys=trusted,
            progress=progress,
        )

    try:
        if show_bar:
            with progress:
                result = asyncio.run(go())
        else:
            result = asyncio.run(go())
    except FetchError as err:
        return fail(str(err))
    if not args.quiet:
        origins = ", ".join(
            f"{name} {n / 1e6:.1f} MB" for name, n in sorted(result.bytes_by_origin.items())
        )
        print(
            f"{result.path}: {result.size_bytes / 1e6:.1f} MB verified in "
            f"{result.seconds:.1f} s ({origins or 'nothing new'}; "
            f"{result.handoffs} handoff{'' if result.handoffs == 1 else 's'})"
        )
        if result.mode == "swarm":
            how = "stalled, the rest from origins" if result.swarm_stalled else "completed"
            print(
                f"swarm ({how}): {result.bytes_from_peers / 1e6:.1f} MB from peers, "
                f"{result.bytes_from_web_seeds / 1e6:.1f} MB from web seeds; left the "
                f"swarm by {result.leave_rule or 'no rule (the swarm ended early)'}"
            )
    return 0
