"""`pressrun serve reader` over HTTP, and CORS on the balancer and the origins."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pressrun.clients.config import DESKTOP
from pressrun.cors import EXPOSED_HEADERS
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.reader.aio import VENDOR_FILES, AssetsMissing, RunningReader, start_reader
from pressrun.reader.config import PACKAGE_DIR, ReaderConfig

from .conftest import ISSUE, browser_only

KEY = "ab" * 32


@pytest.fixture
async def reader() -> AsyncIterator[RunningReader]:
    running = await start_reader(
        ReaderConfig(
            balancer_url="http://127.0.0.1:9/",
            publisher_keys=(KEY,),
            download=DESKTOP,
        )
    )
    yield running
    await running.stop()


@browser_only
async def test_serves_the_app_its_config_and_vendor_files(reader: RunningReader) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(reader.url + "/") as resp:
            assert resp.status == 200
            assert 'rel="manifest"' in await resp.text()
            assert resp.headers["Cache-Control"] == "no-cache"
        async with http.get(reader.url + "/config.json") as resp:
            doc = json.loads(await resp.text())
        assert doc["balancer_url"] == "http://127.0.0.1:9"
        assert doc["publisher_keys"] == [KEY]
        assert doc["download"]["concurrency"] == DESKTOP.concurrency
        assert doc["download"]["failed_ttl_s"] == DESKTOP.failed_ttl_s
        assert doc["download"]["retry_jitter"] == DESKTOP.retry_jitter == 0.5
        async with http.get(reader.url + "/sw.js") as resp:
            sw = await resp.text()
            assert resp.headers["Content-Type"].startswith("text/javascript")
        assert "__BUILD__" not in sw
        assert f'const BUILD = "{doc["build"]}"' in sw
        async with http.get(reader.url + "/app.webmanifest") as resp:
            assert resp.headers["Content-Type"].startswith("application/manifest+json")
            manifest = json.loads(await resp.text())
        assert {icon["sizes"] for icon in manifest["icons"]} == {"192x192", "512x512"}
        for rel in VENDOR_FILES:
            async with http.get(f"{reader.url}/vendor/{rel}") as resp:
                assert resp.status == 200, rel
                assert "javascript" in resp.headers["Content-Type"]
        async with http.get(reader.url + "/vendor/pdfjs/standard_fonts/FoxitSerif.pfb") as resp:
            assert resp.status == 200


@browser_only
async def test_text_files_are_sent_compressed_whole_and_ranges_as_they_are(
    reader: RunningReader,
) -> None:
    """A phone on a slow link waits for every module of the app's start: text goes out
    compressed when the browser accepts it (Lighthouse's LCP on the phone profile 3.4 s
    uncompressed, 2.1 s compressed), the bytes unchanged once decoded; a range, an
    image and a client that accepts no encoding get the file as it is, and a
    revalidation a 304 with nothing after it on the connection."""
    web = PACKAGE_DIR / "web"
    app_js = (web / "js" / "app.js").read_bytes()
    gzip = {"Accept-Encoding": "gzip, deflate"}
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.get(reader.url + "/js/app.js", headers=gzip) as resp:
            coding = resp.headers["Content-Encoding"]
            assert "Accept-Encoding" in resp.headers["Vary"]
            body = await resp.read()
        # aiohttp takes deflate (zlib's format) where both are accepted, as browsers do
        assert coding in ("gzip", "deflate")
        assert zlib.decompress(body, wbits=31 if coding == "gzip" else 15) == app_js
        assert len(body) < len(app_js) / 2
        for rel in VENDOR_FILES:
            async with http.get(f"{reader.url}/vendor/{rel}", headers=gzip) as resp:
                assert resp.headers["Content-Encoding"] in ("gzip", "deflate"), rel
        async with http.get(
            reader.url + "/js/app.js", headers={**gzip, "Range": "bytes=0-99"}
        ) as resp:
            assert resp.status == 206
            assert "Content-Encoding" not in resp.headers
            assert await resp.read() == app_js[:100]
        async with http.get(reader.url + "/icons/icon-192.png", headers=gzip) as resp:
            assert "Content-Encoding" not in resp.headers
            assert await resp.read() == (web / "icons" / "icon-192.png").read_bytes()
        async with http.get(
            reader.url + "/js/app.js", headers={"Accept-Encoding": "identity"}
        ) as resp:
            assert "Content-Encoding" not in resp.headers
            assert await resp.read() == app_js
            etag = resp.headers["ETag"]
        # a revalidation is a 304 with no body: on the first code aiohttp sent a
        # compressed empty body after it, and the next answer on the connection was
        # read from those bytes ("Bad status line ... x\x9c\x03")
        for _ in range(2):
            async with http.get(
                reader.url + "/js/app.js", headers={**gzip, "If-None-Match": etag}
            ) as resp:
                assert resp.status == 304
                assert await resp.read() == b""
        async with http.get(reader.url + "/js/app.js", headers=gzip) as resp:
            assert resp.status == 200 and resp.headers["Content-Encoding"] in ("gzip", "deflate")


@browser_only
@pytest.mark.parametrize(
    "path",
    [
        "/vendor/pdfjs/cmaps/../../package.json",
        "/vendor/pdfjs-dist/package.json",
        "/../pyproject.toml",
        "/js/../../aio.py",
        "/nothing.html",
    ],
)
async def test_nothing_outside_the_app_is_served(reader: RunningReader, path: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(reader.url + path) as resp,
    ):
        assert resp.status == 404


def test_missing_npm_packages_say_how_to_install(tmp_path: Path) -> None:
    config = ReaderConfig(balancer_url="http://b", modules_dir=tmp_path, publisher_keys=(KEY,))
    with pytest.raises(AssetsMissing, match="run `make setup`"):
        from pressrun.reader.aio import ReaderService

        ReaderService(config)
    with pytest.raises(ValueError, match="not an http"):
        ReaderConfig(balancer_url="ftp://b", publisher_keys=(KEY,))
    # no trust on first use unless asked for (as `pressrun get`)
    with pytest.raises(ValueError, match="trusts no publisher key"):
        ReaderConfig(balancer_url="http://b")
    assert ReaderConfig(balancer_url="http://b", trust_on_first_use=True).publisher_keys == ()
    with pytest.raises(ValueError, match="64 lower-case hex"):
        ReaderConfig(balancer_url="http://b", publisher_keys=("xyz",))
    assert (PACKAGE_DIR / "package-lock.json").is_file()


async def test_balancer_and_origins_answer_cors(tmp_path: Path) -> None:
    from pressrun.content.keys import generate_keypair

    secret, _ = generate_keypair(tmp_path / "publisher.key")
    async with Testbed(
        tmp_path / "bed", (OriginShape("origin-a"),), poll_interval_s=0.3, poll_timeout_s=1.0
    ) as bed:
        await bed.publish(b"x" * 5000, issue_id=ISSUE, key_path=secret, piece_size=16384)
        await bed.start_balancer()
        assert bed.balancer is not None
        origin = bed.urls["origin-a"]
        cross = {"Origin": "http://127.0.0.1:1234"}
        async with aiohttp.ClientSession() as http:
            # the preflight a Range request may need
            async with http.options(
                f"{origin}/content/{ISSUE}/{ISSUE}.pdf",
                headers={
                    **cross,
                    "Access-Control-Request-Method": "GET",
                    "Access-Control-Request-Headers": "range",
                },
            ) as resp:
                assert resp.status == 200
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
                assert "range" in resp.headers["Access-Control-Allow-Headers"].lower()
            async with http.get(
                f"{origin}/content/{ISSUE}/{ISSUE}.pdf", headers={**cross, "Range": "bytes=10-19"}
            ) as resp:
                assert resp.status == 206
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
                exposed = resp.headers["Access-Control-Expose-Headers"]
                assert {h.strip().lower() for h in exposed.split(",")} >= {
                    h.lower() for h in EXPOSED_HEADERS
                }
                assert await resp.read() == b"x" * 10
            async with http.get(f"{origin}/content/{ISSUE}/nothing", headers=cross) as resp:
                assert resp.status == 404
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
            url = f"{bed.balancer.url}/v1/issues/{ISSUE}/directive"
            async with http.get(url, headers=cross) as resp:
                assert resp.status == 200
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
            async with http.get(
                f"{bed.balancer.url}/v1/issues/nope/directive", headers=cross
            ) as resp:
                assert resp.status == 404
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
            async with http.get(f"{bed.balancer.url}/v1/origins", headers=cross) as resp:
                assert resp.headers["Access-Control-Allow-Origin"] == cross["Origin"]
