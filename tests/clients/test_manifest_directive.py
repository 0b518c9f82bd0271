"""The manifest's directive is the download's own, and a resumed download tells it
what it lacks.

The directive a download asks for before its manifest is a ``crowd`` request (no
``class=``): the one the balancer's demand counts and that sends the reader to the
swarm or the carousel (docs/balancer.md, "Request classes"). A download resuming a
partial copy names its verified bytes in that first request (``have=``, ``size=``),
so the balancer's `headroom` counts what it lacks from the start; before, the first
request of a resume said nothing and was counted (and, under full origins, refused)
as a whole new transfer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from aiohttp import web

from fronts import directive_front
from pressrun.clients.aio import fetch_issue
from pressrun.clients.codec import ResumeState
from pressrun.clients.config import DESKTOP
from pressrun.clients.library import Library
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "resumed-2026-48"
PIECE = 16 * 1024
DATA = random.Random(4848).randbytes(6 * PIECE + 321)  # seven pieces, the last short
KEPT = (0, 1, 6)  # verified before the cut: the short last piece among them
KEPT_BYTES = 2 * PIECE + 321


def a_partial_copy(library: Path, bundle: Path) -> None:
    """The library as a download cut after pieces `KEPT` leaves it."""
    manifest_json = (bundle / "manifest.json").read_bytes()
    m = json.loads(manifest_json)["manifest"]
    lib = Library(library)
    lib.ensure()
    path = lib.prepare_partial(ISSUE, m["file_name"], len(DATA), manifest_json, fresh=True)
    with path.open("r+b") as out:
        for i in KEPT:
            out.seek(i * PIECE)
            out.write(DATA[i * PIECE : (i + 1) * PIECE])
    lib.save_state(
        ResumeState(ISSUE, m["file_name"], m["sha256"], len(DATA), PIECE, frozenset(KEPT))
    )


async def test_a_resumed_download_tells_what_it_has_in_its_first_request(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    async with Testbed(tmp_path / "bed", (OriginShape("origin-a"),), poll_interval_s=0.3) as bed:
        bundle = await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        balancer = await bed.start_balancer()
        queries: list[dict[str, str]] = []

        def record(request: web.Request) -> web.Response | None:
            queries.append(dict(request.query))
            return None

        fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
        a_partial_copy(resumed, bundle)
        async with directive_front(balancer.url, record) as url:
            for library in (fresh, resumed):
                queries.clear()
                result = await fetch_issue(
                    ISSUE,
                    balancer_url=url,
                    library=library,
                    config=DESKTOP,
                    trusted_keys={load_public_key(public)},
                )
                assert result.verified and result.path.read_bytes() == DATA
                if library == fresh:
                    # a new download knows nothing of the file before its manifest
                    assert "size" not in queries[0] and "class" not in queries[0], queries[0]
        first = queries[0]
        # the resume's first request: what its partial copy holds, and no class=
        assert (first.get("have"), first.get("size")) == (str(KEPT_BYTES), str(len(DATA))), first
        assert first.get("elapsed") == "0.0" and "class" not in first, first
        assert result.resumed_bytes == KEPT_BYTES
        assert sum(result.bytes_by_origin.values()) == len(DATA) - KEPT_BYTES
