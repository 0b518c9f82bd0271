"""The reader's browser tests: Debian's Chromium, headless, driven by Playwright.

A `Stack` is the real thing on 127.0.0.1: origins (each with its own content folder,
so one can hold a tampered copy) and the balancer from `pressrun.demo.Testbed`, an
issue published as a real PDF, and `pressrun serve reader` in this event loop. A
`Phone` is a fresh browser context of one headless Chromium per module (its own
storage, so OPFS, IndexedDB and the service worker start empty; Playwright starts
Chromium with a fresh --user-data-dir) with a phone viewport and touch, pointed at
the reader. Screenshots go to ``artifacts/reader/`` (or ``$PRESSRUN_ARTIFACTS/reader``).

Every wait has an end. Playwright bounds its own navigations, locators and launch, but
not ``page.evaluate`` of a promise (``window.pressrun.ready``,
``navigator.serviceWorker.ready``, a storage read), nor the start of its driver, nor a
CDP call: those go through `bounded`, which fails the test after `STEP_TIMEOUT_S`
naming the step and the page's last console lines. (A first browser test once hung 17
minutes on a fresh machine, docs/emulation.md; a hang now fails in a minute.)
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio

from pressrun.clients.config import MOBILE, ClientConfig
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, PHONE, open_app, why_no_browser
from pressrun.reader.config import ReaderConfig

#: how long one step may wait (Playwright's own default is 30 s; a loaded 2-core host)
STEP_TIMEOUT_S = 60.0
#: how soon `Phone.check_for_issues` looks again after a check that found no origin up
#: (the stack's balancer polls every 0.3 s)
RECHECK_S = 0.3

ISSUE = "weekly-2026-47"
PIECE = 64 * 1024
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("PRESSRUN_ARTIFACTS", REPO / "artifacts")) / "reader"
browser_only = pytest.mark.skipif(why_no_browser() is not None, reason=why_no_browser() or "")


@pytest.fixture(scope="session")
def sample_pdf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A 5-page sample issue of about 1.5 MB (24 pieces of 64 KiB)."""
    from pressrun.reader.sample import write_sample_pdf

    path = tmp_path_factory.mktemp("pdf") / "issue.pdf"
    write_sample_pdf(path, title="Weekly, issue 47", pages=4, pad_to_bytes=1_500_000)
    return path.read_bytes()


TOKEN = "reader-tests-operator-token"


@dataclass
class Stack:
    """Origins, the balancer, the subscription service and the reader service."""

    bed: Testbed
    root: Path
    reader_url: str
    subscriptions_url: str
    data: bytes
    stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    file_name: str = ""

    async def publish(self, subscribers: list[str] | None) -> None:
        """Publish the sample issue: encrypted for these subscribers (public keys in
        hex, added to the subscription service first), or plain with None; then wait
        until the balancer directs to it."""
        import aiohttp

        from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient

        directory = None
        if subscribers is not None:
            directory = HttpSubscriberDirectory(self.subscriptions_url, TOKEN)
            async with aiohttp.ClientSession() as http:
                client = SubscriptionsClient(self.subscriptions_url, http, operator_token=TOKEN)
                for n, key in enumerate(subscribers):
                    await client.add_subscriber(bytes.fromhex(key), f"reader-{n}")
        bundle = await self.bed.publish(
            self.data,
            issue_id=ISSUE,
            key_path=self.root / "publisher.key",
            piece_size=PIECE,
            encrypt_for=directory,
        )
        self.file_name = json.loads((bundle / "manifest.json").read_text())["manifest"]["file_name"]
        assert self.bed.balancer is not None
        url = f"{self.bed.balancer.url}/v1/issues/{ISSUE}/directive"
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
                await asyncio.sleep(0.05)
        raise AssertionError(f"the balancer never directed to {ISSUE}")

    def origin_copy(self, name: str) -> Path:
        """The issue file (ciphertext when encrypted) in one origin's own folder."""
        return self.bed.content_of(name) / ISSUE / self.file_name


StackFactory = Callable[..., Awaitable[Stack]]
T = TypeVar("T")


async def bounded(
    what: str, step: Awaitable[T], *, timeout_s: float = STEP_TIMEOUT_S, console: Sequence[str] = ()
) -> T:
    """``await step``, or fail the test after ``timeout_s`` saying which step hung (and
    the page's last console lines): a wait without an end becomes a clear failure."""
    try:
        async with asyncio.timeout(timeout_s):
            return await step
    except TimeoutError:
        tail = "; ".join(list(console)[-8:]) or "nothing"
        pytest.fail(f"{what}: no answer in {timeout_s:g} s (the page's console: {tail})")


@pytest_asyncio.fixture(loop_scope="module")
async def make_stack(tmp_path: Path, sample_pdf: bytes) -> AsyncIterator[StackFactory]:
    """``await make_stack(egress_cap_mbps=..., download=...)``: a `Stack`, nothing
    published yet (``await stack.publish(...)``)."""
    from pressrun.reader.aio import start_reader
    from pressrun.subscriptions.aio import SubscriptionService
    from pressrun.subscriptions.store import SubscriptionStore

    stacks: list[Stack] = []

    async def make(
        *,
        egress_cap_mbps: float | None = None,
        download: ClientConfig = MOBILE,
        origins: tuple[str, ...] = ("origin-a", "origin-b"),
        max_devices: int = 5,
    ) -> Stack:
        root = tmp_path / f"stack{len(stacks)}"
        root.mkdir()
        generate_keypair(root / "publisher.key")
        subs = SubscriptionService(
            SubscriptionStore(root / "subs.db"), operator_token=TOKEN, max_devices=max_devices
        )
        subs_url = f"http://127.0.0.1:{await subs.start('127.0.0.1', 0)}"
        shapes = tuple(
            OriginShape(name, egress_cap_mbps=egress_cap_mbps, content_dir=root / name)
            for name in origins
        )
        bed = Testbed(root / "bed", shapes, poll_interval_s=0.3, poll_timeout_s=1.0)
        stack = Stack(bed, root, "", subs_url, sample_pdf, stop=[subs.close])
        stacks.append(stack)
        await bed.__aenter__()
        stack.stop.insert(0, bed.close)
        await bed.start_balancer()
        assert bed.balancer is not None
        reader = await start_reader(
            ReaderConfig(
                balancer_url=bed.balancer.url,
                publisher_keys=(load_public_key(root / "publisher.key.pub").hex(),),
                download=download,
            )
        )
        stack.reader_url = reader.url
        stack.stop.insert(0, reader.stop)
        return stack

    yield make
    for stack in stacks:
        for stop in stack.stop:
            await stop()


async def origins(response: Any) -> list[dict[str, Any]]:
    """The origins in a balancer's ``/v1/origins`` answer the page received (none if
    its body is no longer there to read)."""
    try:
        doc = await response.json()
    except Exception:  # Playwright's error for a body the browser dropped
        return []
    found = doc.get("origins", []) if isinstance(doc, dict) else []
    return [o for o in found if isinstance(o, dict)]


class Phone:
    """One Chromium profile at phone size, on the reader's page."""

    def __init__(self, context: Any, url: str) -> None:
        self.context = context
        self.url = url
        self.page: Any = None
        self.console: list[str] = []

    async def open(self) -> Any:
        """A new tab on the reader, once the app has started."""
        self.page = await self.context.new_page()
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        # the app's module sets window.pressrun once its imports are in, which on a
        # loaded host can come after the page's load event that goto waits for; a load
        # cut part-way (ERR_NETWORK_CHANGED while a container network is added beside
        # the test) never sets it, so open_app opens the page again until it is set
        try:
            await bounded(
                "the app's start",
                open_app(self.page, self.url, STEP_TIMEOUT_S),
                timeout_s=STEP_TIMEOUT_S + 5,
                console=self.console,
            )
        except Exception as error:  # open_app's last playwright error, said with the console
            tail = "; ".join(self.console[-8:]) or "nothing"
            pytest.fail(f"the app's start: {error} (the page's console: {tail})")
        await self.evaluate("window.pressrun.ready", what="the app's start")
        return self.page

    async def reload(self, *, what: str = "the app's start after a reload") -> None:
        """Reload the page and wait for the app's start: its module sets
        ``window.pressrun`` after its imports, which on a busy host comes after the
        load event ``reload`` waits for (the suite run at c9387fa, 02:44: "Cannot read
        properties of undefined (reading 'subscriberPublicKey')" right after a reload)."""
        await bounded("a reload", self.page.reload(), timeout_s=STEP_TIMEOUT_S)
        await bounded(
            what,
            self.page.wait_for_function(
                "() => window.pressrun !== undefined", timeout=1000 * STEP_TIMEOUT_S
            ),
            timeout_s=STEP_TIMEOUT_S + 5,
            console=self.console,
        )
        await self.evaluate("window.pressrun.ready", what=what)

    async def evaluate(
        self, expression: str, arg: Any = None, *, what: str, timeout_s: float = STEP_TIMEOUT_S
    ) -> Any:
        """``page.evaluate`` (which waits for a promise without an end), bounded:
        `bounded` fails the test naming ``what`` after ``timeout_s``."""
        step = self.page.evaluate(expression, arg)
        return await bounded(what, step, timeout_s=timeout_s, console=self.console)

    async def subscriber_key(self) -> str:
        """The public key (hex) the app made for this browser."""
        return str(
            await self.evaluate("window.pressrun.subscriberPublicKey()", what="the reader's key")
        )

    async def check_for_issues(self) -> None:
        """What the app does on open and on a periodic sync: look for new issues.

        A check made while the balancer lists no origin up finds nothing, and the app
        looks again at its next sync; so does this, every `RECHECK_S`, within
        `STEP_TIMEOUT_S`. The stack's balancer takes an origin out of rotation 1.05 s
        after its last /stats answer (3.5 polls of 0.3 s), and the origins, the balancer
        and the reader service share the test's event loop: in the fresh-clone suite at
        11b23ff beside two busy loops (29 Nov 15:12-15:25, load 3.7-7.0) the only origin
        of test_quality's stack was out for a moment and the tablet's check found no
        issue to download (wait_for_download: 60 s, then a timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_TIMEOUT_S
        listings: list[Any] = []

        def listed(response: Any) -> None:
            if response.ok and response.url.endswith("/v1/origins"):
                listings.append(response)

        self.page.on("response", listed)
        try:
            while True:
                listings.clear()
                await self.evaluate("window.pressrun.checkForIssues()", what="the check for issues")
                up = [o.get("state") == "up" for r in listings for o in await origins(r)]
                if not listings or any(up) or loop.time() > deadline:
                    return
                await asyncio.sleep(RECHECK_S)
        finally:
            self.page.remove_listener("response", listed)

    async def wait_for_download(self, issue: str = ISSUE, timeout_s: float = 60.0) -> Any:
        """The app's result for ``issue`` (AssertionError with the app's error if it failed)."""
        await self.page.wait_for_function(
            f"() => window.pressrun.results[{issue!r}] || window.pressrun.errors[{issue!r}]",
            timeout=timeout_s * 1000,
        )
        error = await self.evaluate(f"window.pressrun.errors[{issue!r}]", what="the app's errors")
        assert error is None, f"the download failed in the browser: {error}"
        return await self.evaluate(f"window.pressrun.results[{issue!r}]", what="the app's result")

    async def stored_sha256(self, issue: str = ISSUE) -> str:
        """SHA-256 (hex) of the issue as the browser stored it (OPFS)."""
        return str(
            await self.evaluate(
                """async (issue) => {
                    const store = await import('./js/store.js');
                    const db = await import('./js/db.js');
                    const r = await db.getRecord('issues', issue);
                    const blob = await store.issueBlob(issue, r.num_pieces, 'application/pdf');
                    const d = await crypto.subtle.digest('SHA-256', await blob.arrayBuffer());
                    const hex = (b) => b.toString(16).padStart(2, '0');
                    return Array.from(new Uint8Array(d), hex).join('');
                }""",
                issue,
                what="the stored issue's SHA-256",
            )
        )

    async def stored_pieces(self, issue: str = ISSUE) -> int:
        """How many pieces of ``issue`` are in the browser's storage (OPFS)."""
        return int(
            await self.evaluate(
                """async (issue) => {
                    const store = await import('./js/store.js');
                    return (await store.storedPieces(issue)).size;
                }""",
                issue,
                what="the stored pieces",
            )
        )

    async def notices(self) -> list[str]:
        notices = await self.evaluate("window.pressrun.notices", what="the app's notices")
        return [n["text"] for n in notices]

    async def screenshot(self, name: str) -> Path:
        """A PNG of the page, kept in the artifacts folder."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await self.page.screenshot(path=str(path), timeout=STEP_TIMEOUT_S * 1000)
        return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    """One headless Chromium for a test module (each test gets fresh contexts)."""
    from playwright.async_api import async_playwright

    manager = async_playwright()
    playwright = await bounded("the Playwright driver's start", manager.__aenter__())
    try:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), timeout=STEP_TIMEOUT_S * 1000
        )
        yield browser
        await bounded("Chromium's close", browser.close())
    finally:
        await bounded("the Playwright driver's stop", manager.__aexit__(None, None, None))


@pytest_asyncio.fixture(loop_scope="module")
async def phone_factory(browser: Any) -> AsyncIterator[Callable[..., Awaitable[Phone]]]:
    """``await make_phone(reader_url)``: a `Phone` with its own empty storage (the
    phone profile, or ``make_phone(url, TABLET)``)."""
    contexts: list[Any] = []

    async def make(url: str, profile: dict[str, Any] | None = None) -> Phone:
        options = PHONE if profile is None else profile
        context = await bounded("a new browser context", browser.new_context(**options))
        context.set_default_timeout(STEP_TIMEOUT_S * 1000)
        contexts.append(context)
        return Phone(context, url)

    yield make
    for context in contexts:
        await bounded("a browser context's close", context.close())
