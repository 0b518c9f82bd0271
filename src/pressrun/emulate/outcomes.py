"""What an emulation run produced: each client container's outcome
(`ClientOutcome`, its ``pressrun get --json`` object parsed from its log by
`parse_outcome`) and one run's records (`VariantResult`), which the report reads.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from pressrun.emulate.cpu_use import CpuUse
from pressrun.emulate.scenario import ClientPlan


@dataclass
class ClientOutcome:
    """One client container's result (``doc``: its ``pressrun get --json`` object)."""

    plan: ClientPlan
    container: str
    #: when the client really began (its own clock, the release it saw), from the
    #: schedule's start; None when it never started
    started_s: float | None = None
    #: how long the client took from its container's start to ready at the start line
    ready_s: float | None = None
    exited_s: float | None = None  # when the host saw the container gone (2 s steps)
    exit_code: int | None = None
    doc: dict[str, Any] | None = None
    error: str | None = None

    def verified(self, sha256: str) -> bool:
        """Whether it ended with the issue, byte for byte."""
        return (
            self.exit_code == 0
            and self.doc is not None
            and bool(self.doc.get("verified"))
            and self.doc.get("sha256") == sha256
        )


@dataclass
class VariantResult:
    """What one run (the scenario, or its unicast-only twin) produced."""

    variant: str
    clients: list[ClientOutcome]
    egress: dict[str, list[tuple[float, int]]]  # origin -> [(t, bytes_sent_total)]
    sender: list[tuple[float, int]] = field(default_factory=list)  # [(t, bytes sent)]
    #: [(t, {mode: directives answered so far})], from the balancer's /metrics
    directives: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    ring_at_start: dict[str, Any] = field(default_factory=dict)
    trackers: dict[str, Any] = field(default_factory=dict)
    #: each supernode's /chord/v1/state before the first client and at the end
    supernodes_at_start: dict[str, Any] = field(default_factory=dict)
    supernodes_at_end: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    #: seconds from the services up to the sender's issue prepared (encoded for its
    #: carousel at publish time; None without a sender)
    prepared_s: float | None = None
    #: the host's CPU during the run, by component (`pressrun.emulate.cpu_use`)
    cpu: CpuUse = field(default_factory=CpuUse)
    #: where egress, sender and directives come from: "prometheus" (the deployment's,
    #: what an operator's dashboard shows) or "probes (why not Prometheus)"
    series_source: str = "probes"
    #: the wall time of the first client's release (the services' log has wall times)
    t0_wall: float | None = None
    #: the carousels the sender started and stopped in the run (from Prometheus;
    #: None: not read) and each balancer's lease and carousel events (`balancer_kill`)
    carousel_counts: dict[str, int] | None = None
    #: per balancer, the directives it answered (and since its restart), from Prometheus
    directives_by: dict[str, Any] = field(default_factory=dict)
    balancer_events: dict[str, list[list[Any]]] = field(default_factory=dict)
    #: what each balancer's demand policy saw and decided, one point a second
    #: (`pressrun.emulate.demand_series.read_demand`; None: not read)
    demand: dict[str, Any] | None = None
    #: the release minute (issue 35): ``release_s`` (from the first arrival),
    #: ``release_wall``, ``open_within_s``, ``wrap_buckets`` (the subscription
    #: service's wrap histogram at the end); None without an [embargo]
    release: dict[str, Any] | None = None


def parse_outcome(outcome: ClientOutcome, stdout: str, stderr: str) -> None:
    """The client's JSON line (its last), or the last lines it wrote to stderr."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                outcome.doc = json.loads(line)
                break
    if outcome.doc is None and outcome.error is None:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-2:]
        outcome.error = " | ".join(tail) or f"exit {outcome.exit_code}, no output"
