"""The subscription service over real HTTP on 127.0.0.1: operators, challenges, wraps, CORS."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nacl.exceptions
import nacl.public
import pytest

from pressrun.cli import main
from pressrun.content.encryption import key_check, new_content_key, open_wrap, wrap_key
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import (
    NotSubscribed,
    NoWrap,
    SubscriptionError,
    SubscriptionsClient,
)
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "operator-secret-token"


@dataclass
class Clock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Live:
    service: SubscriptionService
    url: str
    http: aiohttp.ClientSession
    clock: Clock

    def client(self, token: str | None = TOKEN) -> SubscriptionsClient:
        return SubscriptionsClient(self.url, self.http, operator_token=token)


async def start(tmp_path: Path, **kwargs: object) -> tuple[SubscriptionService, str, Clock]:
    clock = Clock()
    service = SubscriptionService(
        SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN, clock=clock, **kwargs
    )
    port = await service.start("127.0.0.1", 0)
    return service, f"http://127.0.0.1:{port}", clock


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    service, url, clock = await start(tmp_path)
    async with aiohttp.ClientSession() as http:
        try:
            yield Live(service, url, http, clock)
        finally:
            await service.close()


def pk(key: nacl.public.PrivateKey) -> bytes:
    return bytes(key.public_key)


async def test_operator_routes_need_the_token(live: Live) -> None:
    alice = nacl.public.PrivateKey.generate()
    for token in (None, "wrong"):
        with pytest.raises(SubscriptionError):
            await live.client(token).add_subscriber(pk(alice), "alice")
    async with live.http.get(f"{live.url}/v1/subscribers") as resp:
        assert resp.status == 401
        assert (await resp.json())["code"] == "bad_token"
    async with live.http.get(
        f"{live.url}/v1/subscribers", headers={"Authorization": "Bearer nope"}
    ) as resp:
        assert resp.status == 401
    # every operator route, every method, is behind the shared guard (pressrun.security):
    # refused before the body is read, in this API's error shape
    key = "ab" * 32
    for method, path in [
        ("GET", "/v1/subscribers"),
        ("PUT", f"/v1/subscribers/{key}"),
        ("DELETE", f"/v1/subscribers/{key}"),
        ("PUT", "/v1/issues/mag-1/versions/1/wraps"),
    ]:
        async with live.http.request(
            method, f"{live.url}{path}", data=b"x" * 100_000, headers={"Authorization": "Basic a"}
        ) as resp:
            assert resp.status == 401, (method, path)
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            doc = await resp.json()
            assert doc["code"] == "bad_token" and "wrong operator token" in doc["error"]
    async with live.http.get(f"{live.url}/metrics") as resp:
        assert 'pressrun_subscriptions_refusals_total{code="bad_token"} 7.0' in await resp.text()
    assert await live.client().subscribers() == []


async def test_add_rename_list_remove(live: Live) -> None:
    c = live.client()
    alice, bob = nacl.public.PrivateKey.generate(), nacl.public.PrivateKey.generate()
    record, created = await c.add_subscriber(pk(alice), "alice")
    assert created and record["public_key"] == pk(alice).hex() and record["name"] == "alice"
    _, created = await c.add_subscriber(pk(alice), "Alice A.")
    assert not created
    await c.add_subscriber(pk(bob), "bob")
    subs = await c.subscribers()
    assert [(s["public_key"], s["name"]) for s in subs] == [
        (pk(alice).hex(), "Alice A."),
        (pk(bob).hex(), "bob"),
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", subs[0]["added_at"])
    await c.put_wraps("mag-1", 1, {pk(bob): wrap_key(new_content_key(), pk(bob))})
    assert await c.remove_subscriber(pk(bob)) == 1
    with pytest.raises(SubscriptionError, match="is not a subscriber"):
        await c.remove_subscriber(pk(bob))
    assert [s["name"] for s in await c.subscribers()] == ["Alice A."]
    # malformed input: a clear 400, nothing stored
    async with live.http.put(
        f"{live.url}/v1/subscribers/xyz",
        json={"name": "x"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as resp:
        assert resp.status == 400 and "64 lower-case hex" in (await resp.json())["error"]


async def test_each_subscriber_gets_only_its_own_wrap(live: Live) -> None:
    c = live.client()
    alice, bob, eve = (nacl.public.PrivateKey.generate() for _ in range(3))
    await c.add_subscriber(pk(alice), "alice")
    await c.add_subscriber(pk(bob), "bob")
    key = new_content_key()
    stored, skipped = await c.put_wraps(
        "mag-1", 1, {k: wrap_key(key, k) for k in (pk(alice), pk(bob), pk(eve))}
    )
    assert stored == 2 and skipped == [pk(eve).hex()]
    wrap = await c.fetch_wrap("mag-1", 1, alice)
    assert open_wrap(wrap, alice, key_check(key)) == key
    assert await c.fetch_wrap("mag-1", 1, bob) != wrap
    with pytest.raises(NotSubscribed, match="not subscribed"):
        await c.fetch_wrap("mag-1", 1, eve)
    with pytest.raises(NoWrap, match="no wrap of mag-1 version 2"):
        await c.fetch_wrap("mag-1", 2, alice)
    # removed: no wrap of any issue any more
    await c.remove_subscriber(pk(bob))
    with pytest.raises(NotSubscribed):
        await c.fetch_wrap("mag-1", 1, bob)
    # re-uploading a version replaces its wraps
    key2 = new_content_key()
    await c.put_wraps("mag-1", 1, {pk(alice): wrap_key(key2, pk(alice))})
    assert open_wrap(await c.fetch_wrap("mag-1", 1, alice), alice, key_check(key2)) == key2


async def wrap_status(live: Live, token: str) -> tuple[int, str]:
    async with live.http.get(
        f"{live.url}/v1/issues/mag-1/versions/1/wrap", headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        return resp.status, (await resp.json())["code"] if resp.status != 200 else "ok"


async def test_tokens_expire_and_cannot_be_forged_or_borrowed(live: Live) -> None:
    alice, eve = nacl.public.PrivateKey.generate(), nacl.public.PrivateKey.generate()
    await live.client().add_subscriber(pk(alice), "alice")
    await live.client().put_wraps("mag-1", 1, {pk(alice): wrap_key(new_content_key(), pk(alice))})
    async with live.http.post(
        f"{live.url}/v1/challenge", json={"subscriber": pk(alice).hex()}
    ) as resp:
        doc = await resp.json()
    assert doc["expires_in_s"] == 300
    token = nacl.public.SealedBox(alice).decrypt(bytes.fromhex(doc["sealed_token"]))
    assert await wrap_status(live, token.hex()) == (200, "ok")
    # eve cannot open alice's challenge, and cannot re-point a token at alice's key
    with pytest.raises(nacl.exceptions.CryptoError):
        nacl.public.SealedBox(eve).decrypt(bytes.fromhex(doc["sealed_token"]))
    async with live.http.post(
        f"{live.url}/v1/challenge", json={"subscriber": pk(eve).hex()}
    ) as resp:
        eve_token = nacl.public.SealedBox(eve).decrypt(
            bytes.fromhex((await resp.json())["sealed_token"])
        )
    forged = pk(alice) + eve_token[32:]
    assert await wrap_status(live, forged.hex()) == (401, "bad_token")
    assert await wrap_status(live, "zz") == (401, "bad_token")
    live.clock.now += 301
    assert await wrap_status(live, token.hex()) == (401, "bad_token")
    async with live.http.post(f"{live.url}/v1/challenge", data=b"not json") as resp:
        assert resp.status == 400


async def test_cors_on_subscriber_routes_only(tmp_path: Path) -> None:
    service, url, _ = await start(tmp_path, cors_origins=["https://reader.example"])
    try:
        async with aiohttp.ClientSession() as http:
            pre = {
                "Origin": "https://reader.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            }
            async with http.options(f"{url}/v1/issues/mag-1/versions/1/wrap", headers=pre) as r:
                assert r.status == 200
                assert r.headers["Access-Control-Allow-Origin"] == "https://reader.example"
                assert "AUTHORIZATION" in r.headers["Access-Control-Allow-Headers"].upper()
            async with http.options(
                f"{url}/v1/challenge",
                headers={**pre, "Access-Control-Request-Method": "POST"},
            ) as r:
                assert r.status == 200
            async with http.post(
                f"{url}/v1/challenge",
                json={"subscriber": os.urandom(32).hex()},
                headers={"Origin": "https://reader.example"},
            ) as r:
                assert r.status == 200
                assert r.headers["Access-Control-Allow-Origin"] == "https://reader.example"
            # an error answer carries the header too, so the browser app can read it
            async with http.get(
                f"{url}/v1/issues/mag-1/versions/1/wrap",
                headers={"Origin": "https://reader.example"},
            ) as r:
                assert r.status == 401
                assert r.headers["Access-Control-Allow-Origin"] == "https://reader.example"
            # another origin is not allowed; operator routes never carry CORS headers
            async with http.options(
                f"{url}/v1/challenge",
                headers={**pre, "Origin": "https://evil.example"},
            ) as r:
                assert "Access-Control-Allow-Origin" not in r.headers
            async with http.get(
                f"{url}/v1/subscribers",
                headers={"Origin": "https://reader.example", "Authorization": f"Bearer {TOKEN}"},
            ) as r:
                assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    finally:
        await service.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``pressrun serve subscriptions`` as a process on an ephemeral port."""
    env = {**os.environ, "PRESSRUN_SUBSCRIPTIONS_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pressrun.cli",
            "serve",
            "subscriptions",
            "--port",
            "0",
            "--db",
            str(tmp_path / "s.db"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, (line, proc.stderr.read() if proc.stderr else "")
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(10)


def test_subscribers_command_line(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = nacl.public.PrivateKey.generate()
    pub = tmp_path / "reader.key.pub"
    pub.write_text(pk(reader).hex() + "\n")
    monkeypatch.delenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", raising=False)
    assert main(["subscribers", "list", "--service", served]) == 1
    assert "no operator token: set PRESSRUN_SUBSCRIPTIONS_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", TOKEN)
    assert main(["subscribers", "add", str(pub), "--name", "reader", "--service", served]) == 0
    assert f"added: {pk(reader).hex()} reader" in capsys.readouterr().out
    assert main(["subscribers", "list", "--service", served]) == 0
    out = capsys.readouterr().out
    assert pk(reader).hex() in out and out.strip().endswith("1 subscriber")
    assert main(["subscribers", "remove", pk(reader).hex(), "--service", served]) == 0
    assert "removed" in capsys.readouterr().out
    assert main(["subscribers", "remove", pk(reader).hex(), "--service", served]) == 1
    assert "is not a subscriber" in capsys.readouterr().err
    assert main(["subscribers", "add", "nonsense", "--service", served]) == 2
    assert "subscriber key 'nonsense' is neither" in capsys.readouterr().err
    assert main(["subscribers", "list", "--service", served, "--token", "bad"]) == 1
    assert "wrong operator token" in capsys.readouterr().err


def test_serve_refuses_to_start_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", raising=False)
    assert main(["serve", "subscriptions", "--db", str(tmp_path / "x.db")]) == 2
    assert "no operator token" in capsys.readouterr().err
