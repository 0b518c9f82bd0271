"""Issues prepared for their carousels: one pass of each encoded ahead of its start.

The multicast sender (`pressrun.multicast.sender`) encodes one pass of each of the
newest issues of its content folder as soon as it sees them published: the manifest
verified, the file checked against it, the pass encoded with pressrun's binding over
the Rust crate ``flute`` and each channel's cycle through it computed, the packets kept
in memory (`PreparedIssue`). A carousel start then only adds groups and a schedule.
`IssuePreparer` keeps the prepared passes (one per issue, the newest encoding asked
for) and encodes each (issue, manifest, encoding) once however many ask at the same
time. The TSI is the issue's (`pressrun.multicast.plans`: the same across restarts),
the TOI the manifest's (a republished issue is another object).

**The FDT is renewed while the pass is in use** (`renew_fdt`): the pass's FDT
Instance expires ``fdt_duration_s`` after it was built, and a pass is reused for as
long as the sender runs, so every ``fdt_renew_s`` the sender builds the FDT again (a
new FDT Instance ID, a fresh ``Expires``) and swaps its packets in the running pass.
Each FDT packet also carries the Sender Current Time (EXT_TIME, RFC 6726 section
3.3.2), so a receiver judges the expiry by the sender's clock and a receiver whose
clock is hours or days off still takes the object.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from pressrun.content.codec import ManifestError, valid_issue_id
from pressrun.content.manifest import SignedManifest
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.core import channel_cycles
from pressrun.multicast.plans import issue_toi

if TYPE_CHECKING:
    from pressrun_flute import PacketBuffer

log = logging.getLogger("pressrun.multicast.sender")


class CarouselError(Exception):
    """A carousel cannot start: the message says why (shown to the API caller)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


#: what a pass and its channels' cycles depend on: FEC, symbol bytes, source block
#: symbols, repair symbols per block, channels, packets between FDT repeats, TSI
Encoding = tuple[str, int, int, int, int, int, int]
#: the FDT Instance ID is a 20-bit field (RFC 6726 section 3.4.1): renewals wrap
FDT_INSTANCE_IDS = 1 << 20


@dataclass
class FdtRenewal:
    """The FDT of a pass: its instance ID and when it was built (the sender's
    monotonic clock); renewed by `renew_fdt`."""

    instance_id: int
    built_at: float


@dataclass(frozen=True)
class PreparedIssue:
    """One pass of an issue's carousel, encoded ahead of its start (`MulticastSender.
    prepare`), and each channel's cycle through it: a start only adds groups and a
    schedule. The packet buffer is only read by the send thread, so every carousel of
    the issue shares it."""

    issue_id: str
    manifest_sha256: str  # of the manifest's JSON: a republished issue is prepared again
    file_name: str
    size_bytes: int
    encoding: Encoding
    tsi: int
    toi: int
    packets: PacketBuffer  # the pass: FDT packets, then the object's
    fdt_packets: int
    object_packets: int
    cycles: list[tuple[int, ...]]  # each channel's cycle (`channel_cycles`)
    mean_packet_bytes: float
    symbol_bytes: int
    source_symbols: int
    encode_s: float
    content_md5: str | None = None  # the FDT's Content-MD5 (base64), for renewals
    fdt: FdtRenewal = field(default_factory=lambda: FdtRenewal(1, 0.0))


def encoding_of(carousel: CarouselConfig, size_bytes: int, tsi: int) -> Encoding:
    """What a pass's packets and cycles depend on (`Encoding`); a carousel's rate and
    groups do not."""
    return (
        carousel.fec,
        carousel.symbol_bytes,
        carousel.source_block_symbols(size_bytes),
        carousel.repair_symbols_per_block(size_bytes),
        carousel.channels,
        carousel.fdt_every_packets,
        tsi,
    )


class IssuePreparer:
    """The sender's prepared passes, and the encodings under way."""

    def __init__(
        self,
        content_dir: Path,
        *,
        prepared: Gauge,
        encodes: Counter,
        encode_seconds: Counter,
        fdt_duration_s: int = 86400,
    ) -> None:
        self.content_dir = content_dir
        #: how long after it is built a pass's FDT expires (renewed well before)
        self.fdt_duration_s = fdt_duration_s
        self._prepared_gauge = prepared
        self._encodes = encodes
        self._encode_seconds = encode_seconds
        #: issue id -> its prepared pass (the newest encoding asked for)
        self.prepared: dict[str, PreparedIssue] = {}
        #: (issue id, manifest sha, encoding) -> its encoding under way
        self._preparing: dict[tuple[str, str, Encoding], asyncio.Task[PreparedIssue]] = {}
        #: issue id -> why its newest manifest could not be prepared (manifest sha,
        #: encoding or None, the message): shown by ``/healthz`` and the control API,
        #: logged once, not retried by `refresh` until the manifest or the encoding
        #: changes (a POST tries again); at most one per issue of the content folder
        self.failed: dict[str, tuple[str, Encoding | None, str]] = {}

    async def prepare(self, issue_id: str, carousel: CarouselConfig, *, tsi: int) -> PreparedIssue:
        """The issue's pass for ``carousel``'s encoding with TSI ``tsi``: the one
        prepared, or encoded now (and kept) when none matches the issue's manifest on
        disk and the encoding."""
        if not valid_issue_id(issue_id):
            raise CarouselError(f"invalid issue id {issue_id!r}")
        bundle = self.content_dir / issue_id
        try:
            manifest_json = await asyncio.to_thread((bundle / "manifest.json").read_bytes)
        except FileNotFoundError:
            raise CarouselError(f"no issue {issue_id} in {self.content_dir}", 404) from None
        except OSError as err:
            message = f"the manifest of {issue_id} cannot be read: {err}"
            self._fail(issue_id, "", None, message)
            raise CarouselError(message, 500) from None
        digest = hashlib.sha256(manifest_json).hexdigest()
        try:
            size = SignedManifest.from_json_bytes(manifest_json).manifest.size_bytes
        except ManifestError as err:
            raise CarouselError(f"the manifest of {issue_id} does not verify: {err}", 409) from None
        try:
            encoding = encoding_of(carousel, size, tsi)
        except ValueError as err:
            self._fail(issue_id, digest, None, f"{issue_id} cannot be carouselled: {err}")
            raise CarouselError(f"{issue_id} cannot be carouselled: {err}", 413) from None
        ready = self.prepared.get(issue_id)
        if ready is not None and ready.manifest_sha256 == digest and ready.encoding == encoding:
            return ready
        key = (issue_id, digest, encoding)
        pending = self._preparing.get(key)
        if pending is None:
            pending = asyncio.ensure_future(
                self._encode_issue(issue_id, manifest_json, carousel, tsi)
            )
            self._preparing[key] = pending
            pending.add_done_callback(lambda _t: self._preparing.pop(key, None))
        try:
            prepared = await asyncio.shield(pending)
        except CarouselError as err:
            self._fail(issue_id, digest, encoding, str(err))
            raise
        except Exception as err:  # the binding, the disk, memory: say which
            log.exception("encoding %s for its carousel failed", issue_id)
            message = f"{issue_id} could not be encoded for its carousel: {err!r}"
            self._fail(issue_id, digest, encoding, message)
            raise CarouselError(message, 500) from err
        self.failed.pop(issue_id, None)
        self.prepared[issue_id] = prepared
        self._prepared_gauge.set(len(self.prepared))
        return prepared

    def _fail(self, issue_id: str, digest: str, encoding: Encoding | None, message: str) -> None:
        if self.failed.get(issue_id) != (digest, encoding, message):
            log.warning("cannot prepare %s for a carousel: %s", issue_id, message)
        self.failed[issue_id] = (digest, encoding, message)

    async def _encode_issue(
        self, issue_id: str, manifest_json: bytes, carousel: CarouselConfig, tsi: int
    ) -> PreparedIssue:
        bundle = self.content_dir / issue_id
        try:
            manifest = SignedManifest.from_json_bytes(manifest_json).verify()
        except ManifestError as err:
            raise CarouselError(f"the manifest of {issue_id} does not verify: {err}", 409) from None
        try:
            data = await asyncio.to_thread((bundle / manifest.file_name).read_bytes)
        except FileNotFoundError:
            raise CarouselError(f"{issue_id}/{manifest.file_name} is missing", 404) from None
        digest = await asyncio.to_thread(sha256_hex, data)
        if digest != manifest.sha256:
            raise CarouselError(f"{issue_id}/{manifest.file_name} does not match its manifest", 409)
        began = time.perf_counter()
        prepared = await asyncio.to_thread(
            prepare_pass,
            data,
            issue_id=issue_id,
            file_name=manifest.file_name,
            manifest_sha256=hashlib.sha256(manifest_json).hexdigest(),
            tsi=tsi,
            config=carousel,
            fdt_duration_s=self.fdt_duration_s,
            built_at=time.perf_counter(),
        )
        del data
        self._encodes.inc()
        self._encode_seconds.inc(prepared.encode_s)
        log.info(
            "%s prepared for its carousel: %d packets (%s, %d channels) in %.1f s",
            issue_id,
            prepared.object_packets,
            carousel.fec,
            carousel.channels,
            time.perf_counter() - began,
        )
        return prepared

    def published_issues(self) -> list[str]:
        """The issues of the content folder, newest manifest first."""
        found: list[tuple[float, str]] = []
        for manifest in self.content_dir.glob("*/manifest.json"):
            with contextlib.suppress(OSError):
                found.append((manifest.stat().st_mtime, manifest.parent.name))
        return [issue for _, issue in sorted(found, reverse=True) if valid_issue_id(issue)]

    async def refresh(
        self,
        count: int,
        carousel: CarouselConfig,
        on_air: Callable[[str], bool],
        tsi_for: Callable[[str], int],
    ) -> None:
        """One round: prepare the newest ``count`` issues (each once per manifest),
        forget the prepared passes of older ones not ``on_air``."""
        newest = (await asyncio.to_thread(self.published_issues))[:count] if count else []
        for issue_id in newest:
            if await self._failed_before(issue_id, carousel, tsi_for(issue_id)):
                continue  # the same manifest and encoding failed: logged then
            # any error is the issue's (marked failed, logged by `prepare`): the others
            # are still prepared and the next round comes
            with contextlib.suppress(CarouselError):
                await self.prepare(issue_id, carousel, tsi=tsi_for(issue_id))
        for issue_id in list(self.prepared):
            if issue_id not in newest and not on_air(issue_id):
                del self.prepared[issue_id]
        for issue_id in list(self.failed):
            if issue_id not in newest:
                del self.failed[issue_id]
        self._prepared_gauge.set(len(self.prepared))

    async def _failed_before(self, issue_id: str, carousel: CarouselConfig, tsi: int) -> bool:
        """Whether the issue's manifest on disk already failed with this encoding."""
        failure = self.failed.get(issue_id)
        if failure is None:
            return False
        manifest = self.content_dir / issue_id / "manifest.json"
        try:
            manifest_json = await asyncio.to_thread(manifest.read_bytes)
            size = SignedManifest.from_json_bytes(manifest_json).manifest.size_bytes
            now = (hashlib.sha256(manifest_json).hexdigest(), encoding_of(carousel, size, tsi))
        except (OSError, ManifestError, ValueError):
            return False  # tried again: `prepare` says what is wrong
        return failure[:2] == now

    def cancel(self) -> None:
        """Cancel the encodings under way (the sender is closing)."""
        for pending in list(self._preparing.values()):
            pending.cancel()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: the type the FDT gives every issue's object
CONTENT_TYPE = "application/octet-stream"


def content_location(issue_id: str, file_name: str) -> str:
    """The Content-Location the FDT gives an issue's file."""
    return f"file:///{issue_id}/{file_name}"


def prepare_pass(
    data: bytes,
    *,
    issue_id: str,
    file_name: str,
    manifest_sha256: str,
    tsi: int,
    config: CarouselConfig,
    fdt_duration_s: int = 86400,
    built_at: float = 0.0,
) -> PreparedIssue:
    """One pass of ``data`` from the binding (imported here: a native module) and each
    channel's cycle through it; its FDT expires ``fdt_duration_s`` from now and was
    built at ``built_at`` (the caller's monotonic clock). Blocking (the sender runs it
    in a thread)."""
    import pressrun_flute

    began = time.perf_counter()
    encoded = pressrun_flute.encode_object(
        data,
        content_location=content_location(issue_id, file_name),
        content_type=CONTENT_TYPE,
        tsi=tsi,
        toi=issue_toi(manifest_sha256),
        fec=config.fec,
        encoding_symbol_length=config.symbol_bytes,
        max_source_block_length=config.source_block_symbols(len(data)),
        repair_symbols_per_block=config.repair_symbols_per_block(len(data)),
        fdt_duration_s=fdt_duration_s,
    )
    # each getter of the binding's lists makes a new list: taken once
    sbns, esis, object_packets = encoded.sbns, encoded.esis, encoded.packets
    fdt_packets = len(encoded.fdt_packets)
    order = pass_order(config.fec, sbns, esis, encoded.block_source_symbols)
    cycles = [
        # the cycles over the packets in that order, as indices into the pass (the
        # encoder's order)
        tuple(p if p < fdt_packets else fdt_packets + order[p - fdt_packets] for p in cycle)
        for cycle in channel_cycles(
            fec=config.fec,
            sbns=[sbns[i] for i in order],
            esis=[esis[i] for i in order],
            channels=config.channels,
            fdt_packets=fdt_packets,
            fdt_every_packets=config.fdt_every_packets,
        )
    ]
    packets = pressrun_flute.PacketBuffer([*encoded.fdt_packets, *object_packets])
    return PreparedIssue(
        issue_id=issue_id,
        manifest_sha256=manifest_sha256,
        file_name=file_name,
        size_bytes=len(data),
        encoding=encoding_of(config, len(data), tsi),
        tsi=tsi,
        toi=encoded.toi,
        packets=packets,
        fdt_packets=fdt_packets,
        object_packets=len(object_packets),
        cycles=cycles,
        mean_packet_bytes=sum(len(p) for p in object_packets) / max(1, len(object_packets)),
        symbol_bytes=encoded.encoding_symbol_length,
        source_symbols=encoded.source_symbols,
        encode_s=time.perf_counter() - began,
        content_md5=encoded.content_md5,
        fdt=FdtRenewal(encoded.fdt_instance_id, built_at),
    )


def pass_order(
    fec: str, sbns: Sequence[int], esis: Sequence[int], block_source_symbols: Sequence[int]
) -> list[int]:
    """The order in which the channels' cycles take the encoder's object packets
    (indices into them; `channel_cycles` keeps it within a block on each channel).

    With RaptorQ each block's source and repair symbols are interleaved evenly (the
    source symbol i of K at i / K of the block's run, repair symbol j of R at j / R),
    so every stretch of a channel's cycle carries the block's symbols in the pass's
    proportion:
    K / (K + R) of them source symbols, 7% with 10 channels. A reader that held
    pieces from the swarm (the receiver takes them as known source symbols) wastes a
    held source symbol only in that proportion, wherever in the cycle it joins; with
    the encoder's order (a block's source symbols first) a reader joining as the
    carousel starts, as the readers leaving the swarm at a crowd's peak do, got only
    source symbols for the first 7% of the cycle, a third of them held already
    (docs/multicast.md, "Source blocks"). With ``none`` the encoder's order."""
    if fec != "raptorq":
        return list(range(len(esis)))
    repairs: dict[int, int] = {}
    for sbn, esi in zip(sbns, esis, strict=True):
        if esi >= block_source_symbols[sbn]:
            repairs[sbn] = repairs.get(sbn, 0) + 1

    def place(i: int) -> tuple[int, float, int]:
        sbn, esi = sbns[i], esis[i]
        k = block_source_symbols[sbn]
        at = (esi + 0.5) / k if esi < k else (esi - k + 0.5) / repairs[sbn]
        return sbn, at, esi

    return sorted(range(len(esis)), key=place)


def renew_fdt(prepared: PreparedIssue, *, fdt_duration_s: int, built_at: float) -> bool:
    """Build the pass's FDT again (the next FDT Instance ID, ``Expires`` and the
    Sender Current Time from now) and put its packets in place of the old ones in the
    pass, which the send thread may be sending. False (and the old FDT kept) when the
    new FDT does not take as many packets as the old one (it names one file: never
    seen). Blocking but cheap (the object is not read)."""
    import pressrun_flute

    fec, symbol_bytes, block_symbols, repair, _channels, _every, tsi = prepared.encoding
    instance_id = (prepared.fdt.instance_id + 1) % FDT_INSTANCE_IDS
    packets = pressrun_flute.encode_fdt(
        content_location=content_location(prepared.issue_id, prepared.file_name),
        content_type=CONTENT_TYPE,
        transfer_length=prepared.size_bytes,
        content_md5=prepared.content_md5,
        tsi=tsi,
        toi=prepared.toi,
        fec=fec,
        encoding_symbol_length=symbol_bytes,
        max_source_block_length=block_symbols,
        repair_symbols_per_block=repair,
        fdt_instance_id=instance_id,
        fdt_duration_s=fdt_duration_s,
    )
    if len(packets) != prepared.fdt_packets:
        return False
    for index, packet in enumerate(packets):
        prepared.packets.replace(index, packet)
    prepared.fdt.instance_id = instance_id
    prepared.fdt.built_at = built_at
    return True
