"""libtorrent downloads from the origin as a BEP 19 web seed, with the egress cap on.

The origin must never answer a web-seed request with a non-2xx (libtorrent drops the
web seed for good after one), and libtorrent's habit of closing connections mid-range
must stay quiet on the origin's side (FIELD-NOTES.md, libtorrent section).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import libtorrent as lt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pressrun.origin import OriginConfig, RunningOrigin, start_origin

ISSUE = "weekly-2026-48"
FILE = "weekly-2026-48.pdf"


def _torrent(path: Path, web_seed: str) -> bytes:
    ct = lt.create_torrent(lt.list_files(str(path)), 262144, lt.create_torrent.v1_only)
    ct.add_url_seed(web_seed)
    lt.set_piece_hashes(ct, str(path.parent))
    data: bytes = lt.bencode(ct.generate())
    return data


def _session() -> lt.session:
    return lt.session(
        {
            "listen_interfaces": "127.0.0.1:0",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "urlseed_max_request_bytes": 1 << 20,
            "alert_mask": lt.alert.category_t.error_notification,
        }
    )


def _status_codes(origin: RunningOrigin) -> dict[str, float]:
    text = origin.service.metrics.exposition().decode()
    codes: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "pressrun_origin_requests_total":
                codes[sample.labels["code"]] = codes.get(sample.labels["code"], 0) + sample.value
    return codes


async def test_libtorrent_downloads_from_the_capped_origin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    content = tmp_path / "content"
    (content / ISSUE).mkdir(parents=True)
    source = content / ISSUE / FILE
    data = os.urandom(3_000_000)
    source.write_bytes(data)
    origin = await start_origin(
        OriginConfig(content_dir=content, egress_cap_mbps=24.0, stats_interval_s=0.2)
    )  # 3 MB/s
    session: lt.session | None = _session()
    try:
        torrent = _torrent(source, f"{origin.url}/content/{ISSUE}/{FILE}")
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(lt.bdecode(torrent))
        params.save_path = str(tmp_path / "reader")
        assert session is not None
        handle = session.add_torrent(params)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        saw_active = False
        while not handle.status().is_seeding:
            assert loop.time() - t0 < 30, f"not done after 30 s: {handle.status().state}"
            saw_active = saw_active or origin.service.stats_document()["active_transfers"] > 0
            await asyncio.sleep(0.05)
        elapsed = loop.time() - t0
        assert (tmp_path / "reader" / FILE).read_bytes() == data
        errors = [a.message() for a in session.pop_alerts() if "url_seed" in a.what()]
        assert errors == []
    finally:
        session = None  # no tracker: the destructor does not block
        await asyncio.sleep(0.3)
        await origin.stop()
    assert saw_active
    # 3 MB at 3 MB/s, less the burst: the cap held for libtorrent too
    assert elapsed > 0.8
    codes = _status_codes(origin)
    assert set(codes) <= {"200", "206"}, codes
    assert origin.service.meter.bytes_sent_total >= len(data)
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []


async def test_libtorrent_leaving_mid_range_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    content = tmp_path / "content"
    (content / ISSUE).mkdir(parents=True)
    source = content / ISSUE / FILE
    source.write_bytes(os.urandom(8_000_000))
    origin = await start_origin(
        OriginConfig(content_dir=content, egress_cap_mbps=8.0)  # 1 MB/s: slow on purpose
    )
    session: lt.session | None = _session()
    try:
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(
            lt.bdecode(_torrent(source, f"{origin.url}/content/{ISSUE}/{FILE}"))
        )
        params.save_path = str(tmp_path / "reader")
        assert session is not None
        handle = session.add_torrent(params)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while origin.service.meter.active_transfers == 0:
            assert loop.time() - t0 < 15, "libtorrent never asked the web seed"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        session.remove_torrent(handle)  # closes the web-seed connection mid-range
        session = None
        t0 = loop.time()
        while origin.service.meter.active_transfers > 0:
            assert loop.time() - t0 < 10, "the origin did not notice the client left"
            await asyncio.sleep(0.05)
        # still serving
        assert origin.service.stats_document()["issues"] == [ISSUE]
    finally:
        session = None
        await origin.stop()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []
    assert any("transfer client gone" in r.getMessage() for r in caplog.records)
