"""The `pressrun` command line.

Each component owns its subcommands: its module ``pressrun.<component>.cli``
defines ``register(subparsers)`` for top-level commands and/or
``register_serve(serve_subparsers)`` for ``pressrun serve <service>``. The
handler a subcommand sets with ``set_defaults(func=...)`` takes the parsed
arguments and returns the process exit code. Heavy imports (libtorrent,
matplotlib) happen inside handlers so ``pressrun --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from pressrun import __version__

# Modules that register top-level commands, in help order.
COMMAND_MODULES = (
    "pressrun.content.cli",  # keys, publish, verify
    "pressrun.clients.cli",  # get
    "pressrun.subscriptions.cli",  # subscribers
    "pressrun.peer.cli",  # seed
    "pressrun.chord.cli",  # supernode
    "pressrun.sim.cli",  # sim
    "pressrun.demo.cli",  # demo
    "pressrun.emulate.cli",  # emulate
)
# Modules that register `pressrun serve <service>`.
SERVE_MODULES = (
    "pressrun.origin.cli",
    "pressrun.balancer.cli",
    "pressrun.tracker.cli",
    "pressrun.subscriptions.cli",
    "pressrun.multicast.cli",
    "pressrun.reader.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every component's subcommands included."""
    parser = argparse.ArgumentParser(
        prog="pressrun",
        description="Deliver e-magazine issues to many readers at once: "
        "scored origins and a BitTorrent swarm, every copy verified.",
    )
    parser.add_argument("--version", action="version", version=f"pressrun {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = (
            importlib.import_module(name).register
        )
        register(sub)
    serve = sub.add_parser("serve", help="run a pressrun service (origin, balancer, tracker)")
    serve_sub = serve.add_subparsers(dest="service", metavar="SERVICE", required=True)
    for name in SERVE_MODULES:
        importlib.import_module(name).register_serve(serve_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; its exit status (what tests call)."""
    return run(build_parser().parse_args(argv))


def console_main() -> NoReturn:
    """Entry point of the `pressrun` console script: `main`, then `end`."""
    end(main())


def end(code: int) -> NoReturn:
    """End the process with ``code``, as the console script and the emulation's held
    clients (`pressrun.emulate.held`) do: a process whose swarm session had WebRTC
    peers ends by ``os._exit`` (`pressrun.peer.watchdog.end_process`), since
    libdatachannel's threads can hold the interpreter's teardown and the exit watchdog
    would turn a verified download into status 1."""
    from pressrun.peer import watchdog  # no libtorrent import

    watchdog.end_process(code)
    sys.exit(code)


def run(args: argparse.Namespace) -> int:
    """Run a parsed command line (`main`; ``pressrun.emulate.held`` parses it first)."""
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    console_main()
