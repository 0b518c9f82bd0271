"""The demand thresholds by the paper's cost model (De Winter, paper 004, section
III.B: the bytes the infrastructure injects), for `DemandConfig`'s levels.

Pure arithmetic; the balancer does not call it: an operator (or a scenario) derives its
thresholds with it, and docs/emulation.md ("Choosing the demand thresholds") says why.

- **The swarm**: the origins send a swarm about one issue per group of readers whose
  downloads overlap (its web seeds: the first reader has no peer; 41-125 MB for
  25-32 clients of a 50 MB issue in the flash-crowd-50 runs), against one issue per
  reader served whole. So the swarm costs the origins less from the second reader
  whose download overlaps another's: `overlap_downloaders`.
- **The carousel** sends its rate whoever listens, from its start until its slowest
  reader is done: a crowd of n readers arriving over T seconds costs at least
  R (T + t_slowest) against n F unicast. In the estimate's terms (D = n x
  typical_download_s / T by Little's law) it is cheaper above
  `carousel_break_even`.
"""

from __future__ import annotations

import math


def overlap_downloaders(typical_download_s: float, tau_s: float) -> float:
    """The D the demand estimate reads at a client's request when one other client
    was counted ``typical_download_s`` earlier: each counted request adds
    typical_download_s / tau_s and D fades with tau_s, so two requests closer than a
    typical download read at least this and one alone reads less (30 s and 10 s: 3 x
    (1 + e^-3) = 3.149 against 3). A swarm threshold at this D enters the swarm at the
    second overlapping reader, where the cost model makes the swarm cheaper."""
    if not (typical_download_s > 0 and tau_s > 0):
        raise ValueError("typical_download_s and tau_s must be positive")
    step = typical_download_s / tau_s
    return step * (1.0 + math.exp(-typical_download_s / tau_s))


def carousel_break_even(
    *,
    rate_bps: float,
    size_bytes: float,
    typical_download_s: float,
    slowest_s: float,
    burst_s: float,
) -> float:
    """The D above which a carousel of ``rate_bps`` (all its channels) injects fewer
    bytes than unicast, for a crowd arriving over ``burst_s`` seconds whose slowest
    reader needs ``slowest_s`` on the carousel: R T_typ / F x (1 + t_slowest / T).
    10 x 5 Mbit/s, 50 MB, 30 s, a reader on one 5 Mbit/s channel (80 s): 3.75 for a
    long crowd, 41 for an 8 s burst."""
    if min(rate_bps, size_bytes, typical_download_s, burst_s) <= 0 or slowest_s < 0:
        raise ValueError("rates, sizes and times must be positive")
    return rate_bps / 8 * typical_download_s / size_bytes * (1.0 + slowest_s / burst_s)
