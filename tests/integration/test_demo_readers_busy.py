"""`pressrun.demo.readers.BrowserReaders.read` with a page too busy to answer: a
download that did not end is the reader's error even when the app's notices cannot be
read after it (bench/reader_swarm.py, N = 20 with peers, 4abca16, load 6-42: all 20
rows said only "the app's notices: no answer in 10 s", hiding "the download: no answer
in 150 s"). A stand-in browser, no Chromium: the pages' answers are what is tested."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pressrun.demo import readers
from pressrun.demo.readers import BrowserReaders


class BusyPage:
    """A page whose app starts, then never answers a download nor its notices."""

    def on(self, event: str, handler: Any) -> None:
        pass

    async def goto(self, url: str) -> None:
        pass

    async def wait_for_function(self, expression: str, timeout: float) -> None:
        pass

    async def evaluate(self, expression: str, arg: Any = None) -> Any:
        if expression == "window.pressrun.ready":
            return None
        await asyncio.Event().wait()  # the download, the notices: no answer


class Context:
    def set_default_timeout(self, ms: float) -> None:
        pass

    async def new_page(self) -> BusyPage:
        return BusyPage()

    async def close(self) -> None:
        pass


class Browser:
    async def new_context(self, **options: Any) -> Context:
        return Context()


async def test_a_download_without_an_end_stays_the_error_when_the_notices_do_not_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(readers, "NOTICES_TIMEOUT_S", 0.2)
    fleet = BrowserReaders()
    fleet._browser = Browser()
    outcome = await fleet.read(3, "http://127.0.0.1:1/", "issue", "0" * 64, timeout_s=0.3)
    assert not outcome.verified
    assert outcome.error is not None
    assert "the download: no answer in 0.3 s" in outcome.error
    assert "the app's notices: no answer in 0.2 s" in outcome.error
