"""A download asks the balancer for the directives it uses, no more.

Each directive the balancer answers counts at the origin it names as a transfer on its
way (headroom dispatch: for `pick_timeout_s`, and in the places its probe floor gives
an origin per status; alg2: in the origin's bandwidth inflation), so one asked for and
not used is an origin's room taken for nothing. Before, a download's two workers whose
sections ended together both asked for its last section, and one of the five
directives of every 65 kB download in the security soak test went unused (five
answered, four transfers).
"""

from __future__ import annotations

import random
from pathlib import Path

from pressrun.clients.aio import fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "used-2026-48"
PIECE = 16 * 1024
DATA = random.Random(48).randbytes(4 * PIECE + 123)  # five pieces: three sections


async def test_every_directive_a_download_is_answered_starts_a_transfer(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    shapes = (OriginShape("origin-a"), OriginShape("origin-b"))
    async with Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3) as bed:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        balancer = await bed.start_balancer()
        for n in range(3):
            answered = balancer.core.directives_answered
            started = sum(o.service.meter.transfers_total for o in bed.origins.values())
            result = await fetch_issue(
                ISSUE,
                balancer_url=balancer.url,
                library=tmp_path / f"library-{n}",
                config=DESKTOP,
                trusted_keys={load_public_key(public)},
            )
            assert result.verified and result.path.read_bytes() == DATA
            answered = balancer.core.directives_answered - answered
            started = sum(o.service.meter.transfers_total for o in bed.origins.values()) - started
            # the manifest and three sections; before: five directives for four
            assert (answered, started) == (4, 4), (answered, started)
