"""A download the web reader resumes tells the balancer what its stored copy holds.

As a resumed ``pressrun get`` does (tests/clients/test_manifest_directive.py), the
browser's first directive request of a resumed download names the bytes of the issue's
file it already stores and the file's size (``have=``, ``size=``: docs/protocols.md,
"Balancer HTTP"), from its store (the pieces in its folder, measured in the manifest
it stored), so that the balancer counts what it lacks, not a whole new transfer; its
later requests say what it has stored by then. A download begun from nothing tells
nothing. Before, no request of the reader named either.

Real services on 127.0.0.1 and Debian's Chromium (tests/reader/conftest.py); the
directive requests are read as the browser sends them.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from pressrun.clients.config import MOBILE

from .conftest import ISSUE, PIECE, Phone, StackFactory, browser_only
from .test_browser import subscribe_and_publish

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

DIRECTIVE_PATH = f"/v1/issues/{ISSUE}/directive"


async def test_a_resumed_download_tells_the_balancer_what_it_stored(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # 4 Mbit/s origins: the 1.5 MB issue takes about 3 s, in sections of 8 pieces
    stack = await make_stack(egress_cap_mbps=4.0, download=replace(MOBILE, section_bytes=8 * PIECE))
    phone: Phone = await phone_factory(stack.reader_url)
    asked: list[dict[str, str]] = []

    def directive_request(request: Any) -> None:
        url = urlsplit(request.url)
        if url.path == DIRECTIVE_PATH:
            asked.append(dict(parse_qsl(url.query)))

    phone.context.on("request", directive_request)
    page = await phone.open()
    await subscribe_and_publish(stack, phone)
    async with asyncio.timeout(30):
        while await phone.stored_pieces() < 8:
            await asyncio.sleep(0.05)
    await page.close()  # the phone closes the app half way
    fresh, asked[:] = list(asked), []
    # the download begun from nothing told nothing of a copy
    assert fresh, "the first download asked the balancer nothing"
    assert all("have" not in q and "size" not in q for q in fresh), fresh

    await phone.open()  # opened again: the unfinished download goes on
    result = await phone.wait_for_download()
    transfer = stack.origin_copy("origin-a").stat().st_size  # the ciphertext's size
    assert result["transfer_bytes"] == transfer
    resumed = result["resumed"]
    assert 8 <= len(resumed) < -(-transfer // PIECE)
    stored = sum(min(PIECE, transfer - i * PIECE) for i in resumed)
    # the resume's first request, before its manifest: what its store held
    assert asked, "the resumed download asked the balancer nothing"
    assert (asked[0].get("have"), asked[0].get("size")) == (str(stored), str(transfer)), asked[0]
    # every later one: what it had stored by then, of the same file
    for q in asked:
        assert q.get("size") == str(transfer), q
        assert stored <= int(q["have"]) < transfer, (q, stored)
    assert any("resuming" in text for text in await phone.notices())
    haves = [q["have"] for q in asked]
    print(f"resumed with {stored} of {transfer} bytes; the requests' have: {haves}")
