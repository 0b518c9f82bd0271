"""The series and figures an emulation run collects from the deployment at its end:
the egress, sender and directive series from its Prometheus (in place of the host's
probes when it has them), the carousels started and the directives per balancer, what
each balancer's demand policy saw and decided (D, mode, thresholds, the lease), the
balancers' lease and carousel events from the services' log, and the issue's info hash.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from pressrun.emulate.engine import DockerCommandError
from pressrun.emulate.outcomes import VariantResult
from pressrun.emulate.project import ORIGINS, ComposeProject, EmulationError

log = logging.getLogger(__name__)


def wall_clock() -> float:
    """The wall clock, as Prometheus's timestamps and the services' log have it."""
    import time

    return time.time()  # noqa: TID251 (Prometheus's timestamps are wall-clock)


async def series_from_prometheus(
    project: ComposeProject,
    result: VariantResult,
    elapsed_s: float,
    report: Callable[[str], None],
    variant: str,
) -> None:
    """The report's egress, sender and directive series from the deployment's
    Prometheus (issue 30) in place of the probes' when it has them."""
    from pressrun.emulate.prometheus_series import PrometheusError, read_series

    try:
        ip = await asyncio.to_thread(project.address, "prometheus")
        end = wall_clock()
        series = await asyncio.to_thread(
            read_series,
            f"http://{ip}:9090",
            origins={f"{name}:{port}": name for name, port in ORIGINS.items()},
            start_wall=end - elapsed_s,
            end_wall=end,
        )
    except (PrometheusError, EmulationError, DockerCommandError, OSError) as err:
        result.series_source = f"probes (Prometheus: {err})"
        report(f"[{variant}] the series come from the probes: {err}")
        return
    except Exception as err:  # the report's source must never end a run
        log.exception("reading the series from Prometheus failed")
        result.series_source = f"probes (Prometheus: {type(err).__name__}: {err})"
        report(f"[{variant}] the series come from the probes: {err}")
        return
    if not any(series.egress.values()) or not series.directives:
        result.series_source = "probes (Prometheus had no samples of the run)"
        report(f"[{variant}] the series come from the probes: Prometheus had no samples")
        return
    result.egress, result.sender, result.directives = (
        series.egress,
        series.sender,
        series.directives,
    )
    result.series_source = "prometheus"


async def read_carousel_counts(
    project: ComposeProject, result: VariantResult, report: Callable[[str], None], variant: str
) -> None:
    """The carousels the sender started and stopped during the run, from Prometheus
    (left None, and said, when it does not answer: the report's figure is never
    guessed)."""
    from pressrun.emulate.balancer_kill import carousel_counts, directives_by

    if result.t0_wall is None:
        return
    try:
        ip = await asyncio.to_thread(project.address, "prometheus")
        window = {"start_wall": result.t0_wall, "end_wall": wall_clock()}
        base = f"http://{ip}:9090"
        result.carousel_counts = await asyncio.to_thread(carousel_counts, base, **window)
        result.directives_by = await asyncio.to_thread(directives_by, base, **window)
    except Exception as err:  # a figure of the report must never end a run
        report(f"[{variant}] the carousels started are not known: {err}")
    await read_demand_series(project, result, report, variant)


async def read_demand_series(
    project: ComposeProject, result: VariantResult, report: Callable[[str], None], variant: str
) -> None:
    """What each balancer's demand policy saw and decided over the run, from
    Prometheus (`pressrun.emulate.demand_series`; left None, and said, when it does not
    answer)."""
    from pressrun.emulate.demand_series import read_demand

    if result.t0_wall is None:
        return
    try:
        ip = await asyncio.to_thread(project.address, "prometheus")
        result.demand = await asyncio.to_thread(
            read_demand, f"http://{ip}:9090", start_wall=result.t0_wall, end_wall=wall_clock()
        )
    except Exception as err:  # a figure of the report must never end a run
        report(f"[{variant}] the balancers' demand series are not known: {err}")


def read_balancer_events(result: VariantResult, log_path: Path) -> None:
    """Each balancer's lease and carousel events from the services' log."""
    from pressrun.emulate.balancer_kill import balancer_events

    try:
        text = log_path.read_text(errors="replace")
    except OSError as err:
        log.warning("the services' log %s could not be read: %s", log_path, err)
        return
    result.balancer_events = balancer_events(text, result.t0_wall)


def info_hash_of(content_dir: Path, issue_id: str) -> str:
    """The published issue's info hash (hex; "" when its manifest has none)."""
    doc = json.loads((content_dir / issue_id / "manifest.json").read_text())
    return str(doc["manifest"].get("info_hash") or "")
