"""One emulation run: publish the issue, bring the compose project up, run the clients
on the scenario's schedule, break what the scenario breaks, collect, tear down.

The services are docker-compose.yml's, started with ``docker-compose up`` in a project
of their own (``pressrun-emu-<pid>-<variant>``) on a /24 of the benchmarking range no
interface of the host uses. Each client is a container of the same image on the
project's network with its access link's ``PRESSRUN_LINK_*`` variables, running
``pressrun get --json``. Every client container is started before the schedule and held
at the start line (`pressrun.emulate.held`: link shaped, imports done) until the host
releases it at its arrival time by writing a file into a folder they share; the client
records when it really began, so the report has each client's lag behind its schedule.
It exits after its download (and seeding), and its outcome is read from its log. The
host reaches the services at their addresses on the bridge: every second it reads the
origins' ``/stats`` (their egress over time).

Everything started is removed in `finally` (clients, services, network, volumes), so an
error or Ctrl-C leaves nothing behind but the report folder.

The issue and the client containers' commands are `pressrun.emulate.issue`'s, the held
clients' start and wait `pressrun.emulate.held_clients`'s, what a run produced
`pressrun.emulate.outcomes`'s, and what is read from the deployment at the end
`pressrun.emulate.collect`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from pressrun.clients.config import UPLOADER_POLICY_ENV
from pressrun.emulate.amt import (
    AMT_NETWORK,
    RELAY_PORT,
    SSM_ENV,
    amt_network,
    island_addresses,
    write_override,
)
from pressrun.emulate.balancer_kill import ONE_BALANCER, SECOND_BALANCER
from pressrun.emulate.collect import (
    info_hash_of,
    read_balancer_events,
    read_carousel_counts,
    series_from_prometheus,
    wall_clock,
)
from pressrun.emulate.container_kill import container_pid, kill_container_process
from pressrun.emulate.cpu_use import sample_cpu
from pressrun.emulate.embargo import (
    KEYS_MOUNT,
    NO_EMBARGO,
    publish_for_readers,
    set_release,
    wrap_buckets,
)
from pressrun.emulate.embargo import client_args as embargo_client_args
from pressrun.emulate.engine import DockerCommandError, Engine, end_orphan_shims
from pressrun.emulate.held import go_path
from pressrun.emulate.held_clients import plans_of, read_started, start_held, wait_clients
from pressrun.emulate.issue import (
    RELEASE_MOUNT,
    PublishedIssue,
    balancers_for,
    browser_command,
    publish_issue,
)
from pressrun.emulate.outcomes import ClientOutcome, VariantResult
from pressrun.emulate.probes import (
    SAMPLE_INTERVAL_S,
    sample_egress,
    supernode_states,
    tracker_views,
    wait_balancer_ready,
    wait_prepared,
    wait_ring,
    wait_supernodes_on_ring,
)
from pressrun.emulate.project import (
    ORIGINS,
    QUERIER_SETTLE_S,
    SENDER_PORT,
    SUPERNODES,
    ComposeProject,
    bridge_querier,
    docker_async,
    free_subnet,
    remove_stale_projects,
    teardown,
)
from pressrun.emulate.project import (
    project_name as project_name_of,
)
from pressrun.emulate.prometheus_series import prometheus_config_for_emulation
from pressrun.emulate.scenario import AMT, BROWSER, EmulationScenario

#: each client's CPU weight (cgroup cpu.shares; the services have 8192 in
#: docker-compose.yml): on a host of a few cores, hundreds of client containers would
#: otherwise starve the services they all depend on
CLIENT_CPU_SHARES = 256
#: the unicast-only twin turns these off (no tracker, no sender: origin mode only)
UNICAST_ENV = {"PRESSRUN_SWARM_TRACKERS": "", "PRESSRUN_MULTICAST_SENDER": ""}


async def run_variant(
    engine: Engine,
    *,
    scenario: EmulationScenario,
    variant: str,
    issue: PublishedIssue,
    compose_file: Path,
    image: str,
    extra_env: Mapping[str, str],
    report: Callable[[str], None],
    log_dir: Path,
) -> VariantResult:
    """Run the scenario once (``variant``: "emulation" or "unicast-only")."""
    project_name = project_name_of(variant)
    # the one-balancer twin: balancer-2 never starts and no client names it
    single = variant == ONE_BALANCER
    # the release minute (issue 35): this run publishes the issue encrypted into its
    # own content folder; with the embargo ("emulation") its readers prefetch
    embargoed = scenario.embargo is not None and variant != NO_EMBARGO
    if scenario.embargo is not None:
        issue = dataclasses.replace(issue, content_dir=log_dir / f"{variant}-content")
    subnet = free_subnet(engine)
    env = {
        # with readers behind an AMT relay the carousel is source-specific (232/8)
        **(SSM_ENV if scenario.amt is not None else {}),
        **scenario.env,
        **extra_env,
        "PRESSRUN_IMAGE": image,
        "PRESSRUN_SUBNET": subnet,
        "PRESSRUN_CONTENT": str(issue.content_dir.resolve()),
        "PRESSRUN_ISSUE": issue.issue_id,
        "PRESSRUN_PUBLISHER_KEY": issue.public_key_hex,
        "PRESSRUN_PUBLISHER_KEY_FILE": str(issue.key_file.resolve()),
        "PRESSRUN_MULTICAST_TOKEN": secrets.token_hex(16),
        "PRESSRUN_OPERATOR_TOKEN": secrets.token_hex(16),  # the trackers' /v1/swarms
        "PRESSRUN_SUBSCRIPTIONS_TOKEN": secrets.token_hex(16),
        "PRESSRUN_PUBLISHER_PUB_FILE": str(issue.key_file.resolve()) + ".pub",
        "PRESSRUN_PROMETHEUS_CONFIG_DIR": str(
            prometheus_config_for_emulation(
                compose_file.parent / "deploy" / "prometheus", log_dir / f"{variant}-prometheus"
            ).resolve()
        ),
        "PRESSRUN_RESTART": "no",
        "PRESSRUN_REDIS_SAVE": "",
        # the browser readers reach the balancers and coturn by their names on the
        # project's network, as the desktop clients do
        "PRESSRUN_READER_BALANCERS": balancers_for(0, single=single),
        "PRESSRUN_TURN_HOST": "turn",
        # no fixed host ports: each published port on an ephemeral port of 127.0.0.1
        **{
            f"PRESSRUN_{svc}_PUBLISH": "127.0.0.1:"
            for svc in (
                "ORIGIN_A",
                "ORIGIN_B",
                "ORIGIN_C",
                "TRACKER_1",
                "TRACKER_2",
                "BALANCER",
                "BALANCER_2",
                "MULTICAST",
                "SUBSCRIPTIONS",
                "READER",
                "PROMETHEUS",
                "TURN",
                "TURN_RELAY",
            )
        },
    }
    overrides: list[Path] = []
    amt_subnet: str | None = None
    if scenario.amt is not None:
        # the island (the project's network) gets the relay, the readers a network of
        # their own (`pressrun.emulate.amt`)
        amt_subnet = free_subnet(engine, avoid=[subnet])
        overrides.append(
            write_override(compose_file, subnet, log_dir / f"{variant}-amt-override.yml")
        )
    project = ComposeProject(engine, compose_file, project_name, env, overrides)
    log_path = log_dir / f"{variant}-services.log"
    plans = scenario.clients()
    if scenario.embargo is not None and not embargoed:
        plans = scenario.release_crowd()  # the same readers at the release minute
    outcomes = [ClientOutcome(p, f"{project_name}_client_{p.number}") for p in plans]
    egress: dict[str, list[tuple[float, int]]] = {name: [] for name in ORIGINS}
    result = VariantResult(variant, outcomes, egress)
    loop = asyncio.get_running_loop()
    sampler: asyncio.Task[None] | None = None
    cpu_sampler: asyncio.Task[None] | None = None
    clients_ready: asyncio.Task[None] | None = None
    try:
        keys_dir = log_dir / f"{variant}-keys"
        if scenario.embargo is not None:
            note = await publish_for_readers(
                project, issue_id=issue.issue_id, source=issue.source, key_file=issue.key_file,
                content_dir=issue.content_dir, numbers=[p.number for p in plans],
                keys_dir=keys_dir, token=env["PRESSRUN_SUBSCRIPTIONS_TOKEN"], embargoed=embargoed,
                web_seeds=[f"http://{name}:{port}" for name, port in ORIGINS.items()],
            )  # fmt: skip
            report(f"[{variant}] {note}")
        report(f"[{variant}] starting the services on {subnet} (docker-compose up)")
        scale = ("--scale", f"{SECOND_BALANCER}=0") if single else ()
        await asyncio.to_thread(project.compose, "up", "-d", "--no-build", *scale, timeout_s=300)
        # the bridge the querier now, while the services start: it floods every
        # multicast group to every port for its first `QUERIER_SETTLE_S` (below)
        await asyncio.to_thread(bridge_querier, engine, project)
        querier_settled = loop.time() + QUERIER_SETTLE_S
        amt_hosts: list[str] = []
        if amt_subnet is not None:
            amt_hosts = await asyncio.to_thread(amt_network, engine, project, amt_subnet)
            report(
                f"[{variant}] {len(plans_of(plans, AMT))} AMT readers on {amt_subnet} "
                f"(no multicast route; unicast routed to {subnet}), the relay at "
                f"{island_addresses(subnet)[1]}:{RELAY_PORT}"
            )
        # every client container is created and started before the schedule starts and
        # held at the start line, so that its arrival costs only a file the host writes
        release_dir = log_dir / f"{variant}-release"
        shutil.rmtree(release_dir, ignore_errors=True)
        release_dir.mkdir(parents=True)
        report(f"[{variant}] creating {len(plans)} client containers (beside the services' start)")
        max_seed = env.get("PRESSRUN_CLIENT_MAX_SEED_S", "30")
        mc_deadline = env.get("PRESSRUN_CLIENT_MULTICAST_DEADLINE_S", "60")
        control_group = env.get("PRESSRUN_MULTICAST_CONTROL_GROUP") or "239.255.70.1:5400"
        creating = asyncio.Semaphore(4)

        async def create_client(outcome: ClientOutcome) -> None:
            link = outcome.plan.link
            network = project.network
            if outcome.plan.kind == AMT:  # behind the relay, the island's names known
                network = project.network_named(AMT_NETWORK)
            args = ["create", "--name", outcome.container, "--network", network,
                    "--cap-add", "NET_ADMIN", "--init", "--cpu-shares", str(CLIENT_CPU_SHARES),
                    "--label", f"pressrun.emulate.project={project_name}",
                    "-v", f"{release_dir.resolve()}:{RELEASE_MOUNT}"]  # fmt: skip
            if outcome.plan.kind == AMT:
                args += amt_hosts
            if scenario.embargo is not None:  # a subscriber's key of its own
                args += ["-v", f"{keys_dir.resolve()}:{KEYS_MOUNT}:ro"]
            for key, value in link.env().items():
                args += ["-e", f"{key}={value}"]
            # libtorrent's WebRTC peers (the browser readers' way in) ask coturn, as
            # docker-compose.yml's client service does
            args += ["-e", "PRESSRUN_STUN=turn:3478"]
            if env.get(UPLOADER_POLICY_ENV):  # the swarm's uploader policy (docs/chord.md)
                args += ["-e", f"{UPLOADER_POLICY_ENV}={env[UPLOADER_POLICY_ENV]}"]
            args += [
                image, "python3", "-m", "pressrun.emulate.held", "--release-dir", RELEASE_MOUNT,
                "--name", str(outcome.plan.number), "--", "get", issue.issue_id,
                "--balancer", balancers_for(outcome.plan.number, single=single),
                "--library", "/var/lib/pressrun/library", "--profile", link.profile,
                "--publisher-key", issue.public_key_hex, "--json", "--max-seed-s", max_seed,
                "--multicast-deadline-s", mc_deadline,
            ]  # fmt: skip
            if scenario.embargo is not None:
                args += embargo_client_args(outcome.plan.number, prefetch=embargoed)
            if env.get("PRESSRUN_MULTICAST_SENDER", "x"):
                # a swarm client moves to the carousel when it starts early in its download
                args += ["--multicast-control-group", control_group]
                if amt_subnet is not None:  # source-specific (232/8): joined by its source
                    args += ["--multicast-control-source", island_addresses(subnet)[0]]
            if outcome.plan.kind == BROWSER:
                args = args[: args.index(image) + 1] + browser_command(
                    scenario, issue, outcome.plan.number
                )
            async with creating:
                try:
                    await docker_async(engine, *args)
                except DockerCommandError as err:
                    outcome.error = f"could not create its container: {err}"
                    outcome.exit_code = -1

        async def prepare_clients() -> None:
            await asyncio.gather(*(create_client(o) for o in outcomes))
            await start_held(engine, outcomes, release_dir, report, variant)

        clients_ready = asyncio.create_task(prepare_clients())
        balancer_url = f"http://{await asyncio.to_thread(project.address, 'balancer')}:8080"
        await wait_balancer_ready(balancer_url, issue.issue_id, timeout_s=60)
        addresses = {n: await asyncio.to_thread(project.address, n) for n in ORIGINS}
        sender_url = f"http://{await asyncio.to_thread(project.address, 'multicast')}:{SENDER_PORT}"
        info_hash = info_hash_of(issue.content_dir, issue.issue_id)
        result.ring_at_start = await wait_ring(project, info_hash, len(SUPERNODES), 90)
        report(
            f"[{variant}] the issue's Chord ring: {len(result.ring_at_start['supernodes'])} "
            "supernodes registered with tracker-1"
        )
        result.supernodes_at_start = await wait_supernodes_on_ring(project, 60)
        joining = [n for n, s in result.supernodes_at_start.items() if s.get("phase") != "on_ring"]
        if joining:
            report(f"[{variant}] not on the Chord ring after 60 s: {', '.join(joining)}")
        prepared: asyncio.Task[float] | None = None
        if env.get("PRESSRUN_MULTICAST_SENDER", "x"):
            # the sender encodes the issue once it sees it published: a carousel start
            # at the peak then costs no encoding (timed beside the clients' start)
            began = loop.time()

            async def timed_prepare() -> float:
                await wait_prepared(sender_url, issue.issue_id, 600)
                return loop.time() - began

            prepared = asyncio.create_task(timed_prepare())
        # (the clients, created and started meanwhile, are held at the start line)
        await clients_ready
        if prepared is not None:
            result.prepared_s = await prepared
            report(
                f"[{variant}] the sender prepared the issue's carousel "
                f"({result.prepared_s:.0f} s after the services were up)"
            )
        # (no client before the bridge forwards a group only to its members: a carousel
        # started in the querier's first seconds went to every client's link)
        await asyncio.sleep(max(0.0, querier_settled - loop.time()))
        t0 = loop.time()
        result.t0_wall = wall_clock()
        if scenario.embargo is not None:
            result.release = await set_release(
                project, scenario.embargo, token=env["PRESSRUN_SUBSCRIPTIONS_TOKEN"],
                key_file=issue.key_file, issue_id=issue.issue_id, t0_wall=result.t0_wall,
                embargoed=embargoed,
            )  # fmt: skip
            if embargoed:
                report(f"[{variant}] the release moved to {result.release['release_s']:.0f} s "
                       "after the first arrival")  # fmt: skip
        sampler = asyncio.create_task(
            sample_egress(
                addresses, egress, t0, sender_url, result.sender, balancer_url, result.directives
            )
        )
        # the CPU by component: the containers' ids (all exist by now) and the engine's
        # processes (their command lines name its socket folder)
        cpu_sampler = asyncio.create_task(
            sample_cpu(
                result.cpu, t0, engine.cgroup,
                lambda: engine.docker("ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"),
                str(Path(engine.host.removeprefix("unix://")).parent)
                if engine.cgroup is not None else None,
            )
        )  # fmt: skip
        # the one-balancer twin leaves out the faults of the balancer it does not run
        faults = [f for f in scenario.faults if not (single and f.service == SECOND_BALANCER)]
        report(
            f"[{variant}] {len(plans)} clients over "
            f"{max(p.at_s for p in plans):.0f} s; faults: "
            + (", ".join(f"{f.action} {f.service} at {f.at_s:g} s" for f in faults) or "none")
        )

        async def start_client(outcome: ClientOutcome) -> None:
            if outcome.exit_code is not None:
                return
            await asyncio.sleep(max(0.0, t0 + outcome.plan.at_s - loop.time()))
            go_path(release_dir, str(outcome.plan.number)).touch()

        async def fault(at_s: float, action: str, service: str) -> None:
            container = project.container(service)
            # a kill is SIGKILL to the container's first process, sent from the host at
            # the second it is due (its pid read beforehand): `docker kill` through the
            # loaded daemon landed 33 s late in a measured balancer-kill run, after the
            # crowd it was meant to hit
            pid = await container_pid(engine, container) if action == "kill" else None
            await asyncio.sleep(max(0.0, t0 + at_s - loop.time()))
            if action == "kill":
                if pid is None or not kill_container_process(*pid):
                    await docker_async(engine, "kill", container)
            elif action == "start":  # a killed service back (its container restarted)
                await docker_async(engine, "start", container)
            else:
                await docker_async(
                    engine, "exec", container, "python3", "-m",
                    "pressrun.emulate.entrypoint", "--cut-link",
                )  # fmt: skip
            when = loop.time() - t0
            result.faults.append({"at_s": round(when, 1), "action": action, "service": service})
            report(f"[{variant}] t={when:.0f} s: {action} {service}")

        starters = [asyncio.create_task(start_client(o)) for o in outcomes]
        faulters = [asyncio.create_task(fault(f.at_s, f.action, f.service))
                    for f in faults]  # fmt: skip
        deadline = t0 + max(p.at_s for p in plans) + scenario.timeout_s
        await asyncio.gather(
            *starters,
            wait_clients(
                engine, outcomes, deadline, report, variant, t0, log_dir / f"{variant}-clients"
            ),
        )
        await asyncio.gather(*faulters)
        result.wall_s = loop.time() - t0
        if result.release is not None:
            try:
                result.release["wrap_buckets"] = await wrap_buckets(project)
            except Exception as err:  # a figure of the report must never end a run
                report(f"[{variant}] the wrap latency is not known: {err}")
        for outcome in outcomes:
            read_started(outcome, release_dir, t0)
        result.trackers = await tracker_views(project, info_hash)
        result.supernodes_at_end = await supernode_states(project)
        await asyncio.sleep(SAMPLE_INTERVAL_S * 1.5)  # one last egress sample
        await series_from_prometheus(project, result, loop.time() - t0, report, variant)
        await read_carousel_counts(project, result, report, variant)
        return result
    finally:
        for task in (sampler, cpu_sampler, clients_ready):
            if task is not None and not task.done():
                task.cancel()
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        report(f"[{variant}] tearing down (the services' logs: {log_path.name})")
        took = await asyncio.shield(asyncio.to_thread(teardown, engine, project, log_path))
        report(
            f"[{variant}] torn down in {sum(took.values()):.0f} s ("
            + ", ".join(f"{step} {s:.1f} s" for step, s in took.items())
            + ")"
        )


def out_dir_for(base: Path | None, scenario_name: str) -> Path:
    """The report folder: ``--out`` or ``emulation-<scenario>/`` here."""
    out = base if base is not None else Path.cwd() / f"emulation-{scenario_name}"
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("content", "source"):
        shutil.rmtree(out / stale, ignore_errors=True)
    return out


async def run_scenario(
    engine: Engine,
    scenario: EmulationScenario,
    *,
    out: Path | None,
    compose_file: Path,
    image: str,
    twin: bool,
    report: Callable[[str], None],
) -> int:
    """The scenario (and its unicast-only twin), then the report; 0 when every client
    of every run ended with a verified file, 1 otherwise."""
    from pressrun.emulate.report import print_summary, write_report

    folder = out_dir_for(out, scenario.name)
    stale = await asyncio.to_thread(remove_stale_projects, engine)
    if stale:
        report(f"removed what earlier runs left on the engine: {', '.join(stale)}")
    shims = await asyncio.to_thread(end_orphan_shims, engine)
    if shims:
        report(f"ended {len(shims)} shim(s) of containers earlier runs removed")
    report(f"publishing a {scenario.issue_mb:g} MB issue into {folder / 'content'}")
    issue = await asyncio.to_thread(
        publish_issue, folder, scenario.issue_mb, scenario.seed,
        pdf=scenario.browsers is not None, publish_now=scenario.embargo is None,
    )  # fmt: skip
    variants: list[tuple[str, dict[str, str]]] = [("emulation", {})]
    if scenario.embargo is not None and scenario.embargo.twin and twin:
        variants.append((NO_EMBARGO, {}))
    if scenario.unicast_twin and twin:
        variants.append(("unicast-only", UNICAST_ENV))
    if scenario.one_balancer_twin and twin:
        variants.append((ONE_BALANCER, {}))
    results: list[VariantResult] = []
    for variant, extra in variants:
        results.append(
            await run_variant(
                engine,
                scenario=scenario,
                variant=variant,
                issue=issue,
                compose_file=compose_file,
                image=image,
                extra_env=extra,
                report=report,
                log_dir=folder,
            )
        )
        read_balancer_events(results[-1], folder / f"{variant}-services.log")
    summary = write_report(folder, scenario, issue, results)
    print_summary(summary, folder)
    bad = [
        (name, c) for name, v in summary["variants"].items()
        for c in v["per_client"] if not c["verified"]
    ]  # fmt: skip
    if bad:
        name, first = bad[0]
        report(
            f"{len(bad)} client(s) did not end with a verified file ({name} client "
            f"{first['client']}: {first['error'] or 'not verified'})"
        )
        return 1
    return 0
