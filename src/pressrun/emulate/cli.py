"""``pressrun emulate``: the docker compose emulation, from images to the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pressrun.emulate.scenario import EmulationScenario

#: where images, wheels and the engine's data live (ignored by git)
CACHE_ENV = "PRESSRUN_EMULATE_CACHE"


def project_root() -> Path:
    """The source tree (docker-compose.yml, Dockerfile, pyproject.toml)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "docker-compose.yml").is_file() and (parent / "pyproject.toml").is_file():
            return parent
    raise FileNotFoundError(
        "pressrun emulate runs from a source checkout (docker-compose.yml and the "
        "Dockerfile are not installed with the package)"
    )


#: the machine's cache, shared by every checkout: a fresh clone (CI) finds the base
#: image, the dependencies and the engine's data where the last run left them
MACHINE_CACHE = Path("/var/cache/pressrun-emulate")


def cache_dir(root: Path) -> Path:
    """The cache folder: ``PRESSRUN_EMULATE_CACHE``; else, as root, the machine's
    (/var/cache/pressrun-emulate); else ``.cache/emulate`` in the tree (ignored by git)."""
    import os

    given = os.environ.get(CACHE_ENV)
    if given:
        path = Path(given)
    elif os.geteuid() == 0:
        path = MACHINE_CACHE
    else:
        path = root / ".cache" / "emulate"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun emulate``."""
    from pressrun.emulate.scenario import builtin_names

    p = subparsers.add_parser(
        "emulate",
        help="run a scenario on the docker compose emulation and write a report",
        description="Start the container engine if none runs (in 198.18.0.0/15, leaving "
        "the host's network alone), build the images offline if needed, bring "
        "docker-compose.yml up, run the scenario's clients on its schedule, and write a "
        "report (summary.json, egress.png, clients.png) to --out. Everything is torn "
        "down at the end, on errors and on Ctrl-C. Needs root (or DOCKER_HOST). "
        "docs/emulation.md.",
    )
    p.add_argument(
        "--scenario",
        metavar="NAME_OR_FILE",
        help=f"a built-in scenario ({', '.join(builtin_names())}) or a TOML file",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="the report folder (default ./emulation-<scenario>)",
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="build the images (base from mmdebstrap, pressrun from the host's wheels) and stop",
    )
    p.add_argument(
        "--no-twin",
        action="store_true",
        help="skip the scenario's twin run (unicast-only, one balancer, or no embargo)",
    )
    p.add_argument(
        "--readers",
        type=int,
        default=None,
        metavar="N",
        help="an [embargo] scenario's readers (its default is the issue's 150): what "
        "this host carries",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="PRESSRUN_NAME=VALUE",
        help="set a docker-compose.yml variable over the scenario's [env] (repeatable), "
        "e.g. --env PRESSRUN_UPLOADER_POLICY=stripes to run the same crowd with another "
        "swarm policy",
    )
    p.set_defaults(func=run)


def with_env(scenario: EmulationScenario, settings: list[str]) -> EmulationScenario:
    """The scenario with ``--env PRESSRUN_NAME=VALUE`` settings over its ``[env]``;
    `ScenarioError` for a setting that is not one."""
    import dataclasses

    from pressrun.sim.scenario import ScenarioError

    env = dict(scenario.env)
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or not name.startswith("PRESSRUN_"):
            raise ScenarioError(f"--env {setting!r}: write PRESSRUN_NAME=VALUE")
        env[name] = value
    return dataclasses.replace(scenario, env=env) if settings else scenario


def interrupt_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP end the run through KeyboardInterrupt, so the teardown
    and the engine's stop run (also where the shell started us with SIGINT ignored, as
    a background job)."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def run(args: argparse.Namespace) -> int:
    """Run the emulation; 0 when every client of every run ended with a verified file."""
    import asyncio
    import logging

    from pressrun.emulate.engine import DockerCommandError, EngineUnavailable, engine_session
    from pressrun.emulate.images import DEFAULT_IMAGE, ImageBuildError, build_images
    from pressrun.emulate.project import EmulationError
    from pressrun.sim.scenario import ScenarioError

    def say(text: str) -> None:
        print(f"pressrun emulate: {text}", flush=True)

    if not args.build_only and not args.scenario:
        print("pressrun emulate: --scenario is required (or --build-only)", file=sys.stderr)
        return 2
    scenario = None
    if args.scenario:
        from pressrun.emulate.scenario import load_scenario

        try:
            scenario = with_env(load_scenario(args.scenario), args.env)
            if args.readers is not None:
                from pressrun.emulate.scenario import with_readers

                scenario = with_readers(scenario, args.readers)
        except ScenarioError as err:
            print(f"pressrun emulate: {err}", file=sys.stderr)
            return 2
    try:
        root = project_root()
    except FileNotFoundError as err:
        print(f"pressrun emulate: {err}", file=sys.stderr)
        return 2
    for name in ("pressrun.content", "pressrun.emulate.engine"):
        logging.getLogger(name).setLevel(logging.WARNING)
    cache = cache_dir(root)
    interrupt_on_signals()
    try:
        with engine_session(cache) as engine:
            say(f"container engine at {engine.host}")
            import os

            image = os.environ.get("PRESSRUN_IMAGE") or DEFAULT_IMAGE
            built = build_images(engine, cache_dir=cache, project_root=root, image=image,
                                 report=say)  # fmt: skip
            steps = ", ".join(f"{k} {v:.0f} s" for k, v in built.seconds_by_step.items())
            say(f"images ready: {built.base}, {built.image} ({steps})")
            if scenario is None:
                return 0
            from pressrun.emulate.run import run_scenario

            out = Path(args.out) if args.out else None
            return asyncio.run(
                run_scenario(
                    engine,
                    scenario,
                    out=out,
                    compose_file=root / "docker-compose.yml",
                    image=image,
                    twin=not args.no_twin,
                    report=say,
                )
            )
    except EngineUnavailable as err:
        print(f"pressrun emulate: no container engine: {err}", file=sys.stderr)
        return 1
    except (ImageBuildError, EmulationError, DockerCommandError) as err:
        print(f"pressrun emulate: {err}", file=sys.stderr)
        return 1
