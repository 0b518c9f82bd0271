"""The tracker's records in Redis, shared by several tracker instances.

The adapter reloads a swarm before each announce and writes at once. Every record
carries a version; a Lua script refuses a write older than what is stored, so two
instances (or an expiry racing an announce) never overwrite a newer record with an
older one. The refused records come back as conflicts and the adapter reloads. The
operator-added info-hashes are the set ``allowed``, so every instance serves them.
The protocol it implements, and the SQLite store for one process:
`pressrun.tracker.store`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord, TrackerEvent
from pressrun.tracker.store import record_from_json, record_to_json

# KEYS[1] the swarm's hash, KEYS[2] the set of swarms, KEYS[3] the swarm's event list.
# ARGV: swarm hex, then triples (field, json, version), then events as JSON strings.
# Writes each record unless the stored one has the same or a newer version; answers
# the fields refused.
_SAVE_LUA = """
local refused = {}
local n = tonumber(ARGV[2])
for i = 0, n - 1 do
  local field = ARGV[3 + 3 * i]
  local body = ARGV[4 + 3 * i]
  local version = tonumber(ARGV[5 + 3 * i])
  local current = redis.call('HGET', KEYS[1], field)
  if current and cjson.decode(current)['version'] >= version then
    table.insert(refused, field)
  else
    redis.call('HSET', KEYS[1], field, body)
  end
end
redis.call('SADD', KEYS[2], ARGV[1])
for i = 3 + 3 * n, #ARGV do
  redis.call('RPUSH', KEYS[3], ARGV[i])
end
if #ARGV >= 3 + 3 * n then
  redis.call('LTRIM', KEYS[3], -10000, -1)
end
return refused
"""


# KEYS[1] a swarm's hash: every record as one JSON array, so the client parses one
# bulk string instead of one per peer (the pure-Python RESP parser dominated).
_LOAD_LUA = """
local values = redis.call('HVALS', KEYS[1])
return '[' .. table.concat(values, ',') .. ']'
"""


class RedisStore:
    """Records in Redis, shared by every tracker instance pointed at it.

    Layout under ``prefix`` (default ``pressrun:tracker:``): ``swarms`` is the set of
    info-hashes (hex); ``peers:<hex>`` a hash from ``<peer_id hex>:<family>`` to the
    record as JSON; ``events:<hex>`` the last 10,000 events as JSON.
    """

    def __init__(self, url: str, *, prefix: str = "pressrun:tracker:") -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.prefix = prefix
        self._redis: Any = aioredis.Redis.from_url(url)
        self._save_script: Any = self._redis.register_script(_SAVE_LUA)
        self._load_script: Any = self._redis.register_script(_LOAD_LUA)
        # Records already built, by (info_hash, peer_id hex, family, version): most of a
        # swarm is unchanged between two announces, and a frozen record can be reused.
        self._built: dict[tuple[str, str, int, int], PeerRecord] = {}

    @property
    def shared(self) -> bool:
        """Other instances write the same records."""
        return True

    def _field(self, record: PeerRecord) -> str:
        return f"{record.peer_id.hex()}:{record.family.value}"

    async def open(self) -> None:
        """Check that Redis answers (raises redis.ConnectionError if not)."""
        await self._redis.ping()

    async def load_swarm(self, info_hash: bytes) -> list[PeerRecord]:
        """One swarm's records as every instance last wrote them."""
        raw: bytes = await self._load_script(keys=[f"{self.prefix}peers:{info_hash.hex()}"])
        records = []
        built = self._built
        for data in json.loads(raw):
            key = (data["info_hash"], data["peer_id"], data["family"], data["version"])
            record = built.get(key)
            if record is None:
                record = built[key] = record_from_json(data)
            records.append(record)
        if len(built) > 100_000:  # bounded: forget and rebuild as needed
            built.clear()
        return records

    async def load_all(self) -> list[PeerRecord]:
        """Every record of every swarm."""
        members: set[bytes] = await self._redis.smembers(f"{self.prefix}swarms")
        records: list[PeerRecord] = []
        for hex_hash in sorted(members):
            records.extend(await self.load_swarm(bytes.fromhex(hex_hash.decode())))
        return records

    async def load_events(self, info_hash: bytes) -> list[TrackerEvent]:
        """The last events of one swarm, oldest first."""
        raw: list[bytes] = await self._redis.lrange(f"{self.prefix}events:{info_hash.hex()}", 0, -1)
        events = []
        for body in raw:
            d = json.loads(body)
            events.append(
                TrackerEvent(
                    at=d["at"],
                    info_hash=bytes.fromhex(d["info_hash"]),
                    peer_id=bytes.fromhex(d["peer_id"]),
                    family=AddressFamily(d["family"]),
                    event=d["event"],
                    uploaded_total=d["uploaded_total"],
                    downloaded_total=d["downloaded_total"],
                    left=d["left"],
                    leave_rule=LeaveRule(d["leave_rule"]) if d["leave_rule"] else None,
                )
            )
        return events

    async def save(
        self, records: Sequence[PeerRecord], events: Sequence[TrackerEvent] = ()
    ) -> list[PeerRecord]:
        """Write records at once, refusing any older than the stored one."""
        refused: list[PeerRecord] = []
        by_swarm: dict[bytes, tuple[list[PeerRecord], list[TrackerEvent]]] = {}
        for record in records:
            by_swarm.setdefault(record.info_hash, ([], []))[0].append(record)
        for event in events:
            by_swarm.setdefault(event.info_hash, ([], []))[1].append(event)
        for info_hash, (swarm_records, swarm_events) in by_swarm.items():
            hex_hash = info_hash.hex()
            args: list[object] = [hex_hash, len(swarm_records)]
            fields = {}
            for record in swarm_records:
                field = self._field(record)
                fields[field] = record
                args += [field, json.dumps(record_to_json(record)), record.version]
            for event in swarm_events:
                args.append(
                    json.dumps(
                        {
                            "at": event.at,
                            "info_hash": hex_hash,
                            "peer_id": event.peer_id.hex(),
                            "family": event.family.value,
                            "event": event.event,
                            "uploaded_total": event.uploaded_total,
                            "downloaded_total": event.downloaded_total,
                            "left": event.left,
                            "leave_rule": event.leave_rule.value if event.leave_rule else None,
                        }
                    )
                )
            keys = [
                f"{self.prefix}peers:{hex_hash}",
                f"{self.prefix}swarms",
                f"{self.prefix}events:{hex_hash}",
            ]
            answer: list[bytes] = await self._save_script(keys=keys, args=args)
            refused.extend(fields[field.decode()] for field in answer)
        return refused

    async def load_allowed(self) -> set[bytes]:
        """The operator-added info-hashes (the set ``allowed``, hex)."""
        members: set[bytes] = await self._redis.smembers(f"{self.prefix}allowed")
        return {bytes.fromhex(m.decode()) for m in members}

    async def add_allowed(self, info_hash: bytes) -> None:
        """Add to the set ``allowed``."""
        await self._redis.sadd(f"{self.prefix}allowed", info_hash.hex())

    async def flush(self) -> None:
        """Nothing to do: every save is already in Redis."""

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
