"""End to end: a libtorrent session downloads a published issue from its BEP 19 web
seed alone (a plain aiohttp static server standing in for an origin), and the copy
verifies against the signed manifest."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import libtorrent as lt
from aiohttp import web
from published_bundle import make_issue

from fronts import served
from pressrun.content.bundle import Bundle, verify_issue
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.publish import publish


async def test_libtorrent_downloads_the_issue_from_the_web_seed(tmp_path: Path) -> None:
    content = tmp_path / "content"
    content.mkdir()
    app = web.Application()
    app.router.add_static("/content", content)
    session: lt.session | None = None
    async with served(app) as base:
        secret, public = generate_keypair(tmp_path / "publisher.key")
        source = tmp_path / "daily-9.pdf"
        data = make_issue(source, 1_500_000, seed=9)
        bundle_dir = publish(
            source,
            issue_id="daily-9",
            title="Daily 9",
            key_path=secret,
            content_dir=content,
            web_seeds=[base],
            piece_size=65536,
        )
        bundle = Bundle.load(bundle_dir, [load_public_key(str(public))])

        session = lt.session(
            {
                "listen_interfaces": "127.0.0.1:0",
                "enable_dht": False,
                "enable_lsd": False,
                "enable_upnp": False,
                "enable_natpmp": False,
                "urlseed_max_request_bytes": 1 << 20,
            }
        )
        download = tmp_path / "reader"
        download.mkdir()
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(str(bundle.torrent_path))
        params.save_path = str(download)
        handle = session.add_torrent(params)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while not handle.status().is_seeding:
            assert loop.time() < deadline, f"not done after 30 s: {handle.status().state}"
            await asyncio.sleep(0.1)
        copy = download / "daily-9.pdf"
        assert copy.read_bytes() == data
        # The reader's copy, with the manifest beside it, verifies as a trusted issue.
        shutil.copy(bundle.manifest_path, download / "manifest.json")
        report = verify_issue(copy, [load_public_key(str(public))])
        assert report.manifest.info_hash == str(handle.status().info_hashes.v1)
        # No tracker to tell "stopped", so the destructor does not block.
        session = None
