"""The balancer's configuration, with documented defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: how each request class is placed unless configured (docs/balancer.md, "Request
#: classes"): small objects on the least loaded holder, never refused "full"; the
#: crowd by the scoring algorithm (admission included); the back catalogue by grouped
#: weighted round robin over the holders (LVS-CAD's GCAP)
DEFAULT_CLASS_POLICIES: Mapping[str, str] = {
    "small": "least-loaded",
    "crowd": "algorithm",
    "catalogue": "gwrr",
}
#: the placement policies a class may have
CLASS_POLICY_NAMES = frozenset({"algorithm", "gwrr", "least-loaded"})


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """How the balancer core polls origins and shapes its answers.

    poll_interval_s: how often each origin's /stats is polled (the paper's agent
        refreshes every second; MistServer's shipped balancer polls every 5 s).
    stale_after_s: an origin with no good status for this long is out of rotation,
        even if no poll has failed outright (a hung poll).
    directive_origins: how many origins a directive lists (the first is the pick, the
        rest are fallbacks in preference order).
    expires_in_s: how long a client may act on a directive before asking again.
    retry_after_s: what a refusal tells the client to wait before asking again.
    algorithm: the scoring algorithm's registered name (default `headroom`: the only
        one meeting issue 10's targets over the simulator's 200-scenario tournament,
        docs/tournament.md; docs/balancer.md says why; `alg2` is the paper's).
    class_policies: per request class (``small``, ``crowd``, ``catalogue``), how it
        is placed: ``algorithm`` (the scoring algorithm above, its admission
        included), ``gwrr`` (grouped weighted round robin over the class's group, as
        LVS-CAD's GCAP), ``least-loaded`` (fewest transfers per weight in the group);
        classes not named keep `DEFAULT_CLASS_POLICIES`.
    class_groups: per request class, the origins that serve it (GCAP's groups; a class
        not named: every origin). A request whose group holds no copy of its issue
        goes to any holder.
    catalogue_by_holders: a request that names no class is ``catalogue`` when some
        origin in rotation does not hold its issue (the back catalogue), else
        ``crowd``; off (the default): ``crowd``.
    """

    poll_interval_s: float = 1.0
    stale_after_s: float = 3.5
    directive_origins: int = 3
    expires_in_s: float = 5.0
    retry_after_s: float = 2.0
    algorithm: str = "headroom"
    class_policies: Mapping[str, str] = field(default_factory=dict)
    class_groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    catalogue_by_holders: bool = False

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive")
        if self.stale_after_s <= self.poll_interval_s:
            raise ValueError("stale_after_s must be longer than poll_interval_s")
        if self.directive_origins < 1:
            raise ValueError("directive_origins must be at least 1")
        for klass, policy in self.class_policies.items():
            if klass not in DEFAULT_CLASS_POLICIES:
                raise ValueError(
                    f"unknown request class {klass!r}; the classes are "
                    f"{', '.join(sorted(DEFAULT_CLASS_POLICIES))}"
                )
            if policy not in CLASS_POLICY_NAMES:
                raise ValueError(
                    f"unknown policy {policy!r} for class {klass!r}; choose one of "
                    f"{', '.join(sorted(CLASS_POLICY_NAMES))}"
                )
        for klass in self.class_groups:
            if klass not in DEFAULT_CLASS_POLICIES:
                raise ValueError(f"unknown request class {klass!r} in class_groups")

    def class_policy(self, klass: str) -> str:
        """How requests of the class (``small``, ``crowd``, ``catalogue``) are placed."""
        return self.class_policies.get(klass, DEFAULT_CLASS_POLICIES[klass])
