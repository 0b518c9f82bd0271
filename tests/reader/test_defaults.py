"""The reader's defaults: `pressrun serve reader` listens where no other service does."""

from __future__ import annotations

import argparse

from pressrun.cli import build_parser


def serve_ports() -> dict[str, int]:
    """Each `pressrun serve <service>`'s default --port (those with one)."""
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    (services,) = (a for a in serve._actions if isinstance(a, argparse._SubParsersAction))
    ports: dict[str, int] = {}
    for name, sub in services.choices.items():
        for action in sub._actions:
            if "--port" in action.option_strings and isinstance(action.default, int):
                ports[name] = action.default
    return ports


def test_serve_reader_defaults_to_8443_not_the_balancers_port() -> None:
    ports = serve_ports()
    # 8443: where the README, docker-compose.yml and docs/reader.md put the reader
    assert ports["reader"] == 8443
    others = {name: port for name, port in ports.items() if name != "reader"}
    assert ports["reader"] not in others.values(), others
