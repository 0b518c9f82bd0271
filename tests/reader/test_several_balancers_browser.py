"""The web reader knows several balancers (issue 30): in a real headless Chromium, a
reader whose first balancer is dead (nobody listens on its port) finds the issues and
downloads through the second."""

from __future__ import annotations

import socket

import pytest

from pressrun.content.keys import load_public_key
from pressrun.reader.aio import start_reader
from pressrun.reader.config import ReaderConfig

from .conftest import Phone, StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_a_dead_first_balancer_is_passed_over_in_the_browser(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    stack = await make_stack()
    assert stack.bed.balancer is not None
    reader = await start_reader(
        ReaderConfig(
            balancer_url=f"{dead_url()},{stack.bed.balancer.url}",
            publisher_keys=(load_public_key(stack.root / "publisher.key.pub").hex(),),
        )
    )
    stack.stop.insert(0, reader.stop)
    phone: Phone = await phone_factory(reader.url)
    await phone.open()
    await stack.publish([await phone.subscriber_key()])
    await phone.check_for_issues()  # /v1/origins: the dead one, then the live one
    result = await phone.wait_for_download()
    assert result["size_bytes"] == len(stack.data)
    assert sum(result["bytes_by_origin"].values()) == result["transfer_bytes"]
