"""The tracker's records in Redis, shared by several tracker instances.

Every record carries a version; a Lua script refuses a write older than what is
stored, so two instances (or an expiry racing an announce) never overwrite a newer
record with an older one. The refused records come back as conflicts and the adapter
reloads. The operator-added info-hashes are the set ``allowed``, so every instance
serves them. The protocol it implements: `pressrun.tracker.store`; the SQLite store
for one process: `pressrun.tracker.sqlite_store`.

Cost of an announce (issue 24): an instance does not reload a swarm's whole hash
before each announce. Every write takes a number from one counter (``seq``) and files
the record's field under it in the swarm's sorted set ``changes:<hex>``; an instance
remembers the highest number it has read per swarm and reads only the fields written
since (``load_changes``). With one instance that is nothing but its own write; with
several, each change is read once by each instance. A forgotten record is deleted from
the hash and from ``changes`` (its bytes added to ``totals:<hex>``), so nothing brings
it back, and a swarm whose last record goes is deleted whole. The refresh every
interval reads only the swarms changed since the last one (``swarm_seq``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord, TrackerEvent
from pressrun.tracker.store import record_from_json, record_to_json
from pressrun.tracker.swarm import ForgottenTotals

#: events kept per swarm (a list, trimmed at every write)
MAX_EVENTS_PER_SWARM = 1000
#: swarms whose read position an instance remembers; beyond, it forgets them all and
#: reads those swarms whole next time (correct, only slower)
MAX_POSITIONS = 100_000

# KEYS: the swarm's hash, swarm_seq, the swarm's events, the swarm's changes, seq.
# ARGV: swarm hex, n, the caller's read position, then triples (field, json,
# version), then events as JSON strings. Writes each record unless the stored one has
# the same or a newer version. Answers {seq of this write or 0, 1 if nobody else
# wrote to the swarm after the caller's read position else 0, refused fields...}.
_SAVE_LUA = (
    """
local refused = {}
local n = tonumber(ARGV[2])
local since = tonumber(ARGV[3])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
local alone = 1
if last[2] and tonumber(last[2]) > since then alone = 0 end
local seq = 0
for i = 0, n - 1 do
  local field = ARGV[4 + 3 * i]
  local body = ARGV[5 + 3 * i]
  local version = tonumber(ARGV[6 + 3 * i])
  local current = redis.call('HGET', KEYS[1], field)
  if current and cjson.decode(current)['version'] >= version then
    table.insert(refused, field)
  else
    redis.call('HSET', KEYS[1], field, body)
    if seq == 0 then seq = redis.call('INCR', KEYS[5]) end
    redis.call('ZADD', KEYS[4], seq, field)
  end
end
if seq ~= 0 then redis.call('ZADD', KEYS[2], seq, ARGV[1]) end
for i = 4 + 3 * n, #ARGV do
  redis.call('RPUSH', KEYS[3], ARGV[i])
end
if #ARGV >= 4 + 3 * n then
  redis.call('LTRIM', KEYS[3], -"""
    + str(MAX_EVENTS_PER_SWARM)
    + """, -1)
end
local answer = {seq, alone}
for _, field in ipairs(refused) do table.insert(answer, field) end
return answer
"""
)

# KEYS: the swarm's hash, the swarm's changes. ARGV: the read position (-1: all).
# Answers {highest seq of the swarm (0: none), the records written after the position
# as one JSON array (one bulk string: the pure-Python RESP parser dominated)}.
_LOAD_LUA = """
local since = tonumber(ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local top = 0
if last[2] then top = tonumber(last[2]) end
local values
if since < 0 then
  values = redis.call('HVALS', KEYS[1])
elseif top <= since then
  return {top, '[]'}
else
  local fields = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. since, '+inf')
  values = {}
  -- in slices: unpack() of thousands of fields would overflow Lua's stack
  for first = 1, #fields, 500 do
    local last = math.min(first + 499, #fields)
    for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(fields, first, last))) do
      if v then table.insert(values, v) end
    end
  end
end
return {top, '[' .. table.concat(values, ',') .. ']'}
"""

# KEYS: the swarm's hash, changes, totals, events; swarm_seq.
# ARGV: swarm hex, then (field, version) pairs. Deletes each field whose stored record
# is that version and no longer active (a newer one stays), adding its bytes to the
# totals; a swarm left with no record is deleted whole. Answers how many went.
_FORGET_LUA = """
local gone = 0
for i = 2, #ARGV, 2 do
  local field = ARGV[i]
  local current = redis.call('HGET', KEYS[1], field)
  if current then
    local r = cjson.decode(current)
    if r['version'] <= tonumber(ARGV[i + 1]) and not r['active'] then
      redis.call('HDEL', KEYS[1], field)
      redis.call('ZREM', KEYS[2], field)
      redis.call('HINCRBY', KEYS[3], 'peers', 1)
      redis.call('HINCRBY', KEYS[3], 'uploaded', r['uploaded_total'])
      redis.call('HINCRBY', KEYS[3], 'downloaded', r['downloaded_total'])
      redis.call('HINCRBY', KEYS[3], 'completed', r['completed_count'])
      if r['leave_rule'] ~= cjson.null then
        redis.call('HINCRBY', KEYS[3], 'rule:' .. r['leave_rule'], 1)
      end
      gone = gone + 1
    end
  end
end
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
return gone
"""


class RedisStore:
    """Records in Redis, shared by every tracker instance pointed at it.

    Layout under ``prefix`` (default ``pressrun:tracker:``): ``seq`` the write counter;
    ``swarm_seq`` a sorted set of info-hashes (hex) by their last write; ``peers:<hex>``
    a hash from ``<peer_id hex>:<family>`` to the record as JSON (times in wall-clock
    seconds); ``changes:<hex>`` the same fields by their last write; ``totals:<hex>``
    what the forgotten records added up to; ``events:<hex>`` the last 1,000 events.
    """

    def __init__(self, url: str, *, prefix: str = "pressrun:tracker:") -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.prefix = prefix
        self._redis: Any = aioredis.Redis.from_url(url)
        self._save_script: Any = self._redis.register_script(_SAVE_LUA)
        self._load_script: Any = self._redis.register_script(_LOAD_LUA)
        self._forget_script: Any = self._redis.register_script(_FORGET_LUA)
        # the highest write number read, per swarm and over all swarms (refresh)
        self._positions: dict[bytes, int] = {}
        self._refreshed_to = -1

    @property
    def shared(self) -> bool:
        """Other instances write the same records."""
        return True

    def _field(self, record: PeerRecord) -> str:
        return f"{record.peer_id.hex()}:{record.family.value}"

    def _keys(self, hex_hash: str) -> dict[str, str]:
        p = self.prefix
        return {
            "peers": f"{p}peers:{hex_hash}",
            "changes": f"{p}changes:{hex_hash}",
            "totals": f"{p}totals:{hex_hash}",
            "events": f"{p}events:{hex_hash}",
            "swarm_seq": f"{p}swarm_seq",
            "seq": f"{p}seq",
        }

    async def open(self) -> None:
        """Check that Redis answers (raises redis.ConnectionError if not)."""
        await self._redis.ping()

    async def _read(self, info_hash: bytes, since: int) -> tuple[int, list[PeerRecord]]:
        keys = self._keys(info_hash.hex())
        top, raw = await self._load_script(keys=[keys["peers"], keys["changes"]], args=[since])
        return int(top), [record_from_json(data) for data in json.loads(raw)]

    def _remember(self, info_hash: bytes, position: int) -> None:
        if len(self._positions) >= MAX_POSITIONS and info_hash not in self._positions:
            self._positions.clear()
        self._positions[info_hash] = position

    async def load_swarm(self, info_hash: bytes) -> list[PeerRecord]:
        """One swarm's records as every instance last wrote them (all of them)."""
        top, records = await self._read(info_hash, -1)
        self._remember(info_hash, top)
        return records

    async def load_changes(self, info_hash: bytes) -> tuple[bool, list[PeerRecord]]:
        """(whole, records): the records of one swarm written since this store last
        read it, or every record (``whole``) the first time. Costs what changed."""
        since = self._positions.get(info_hash, -1)
        top, records = await self._read(info_hash, since)
        self._remember(info_hash, top)
        return since < 0, records

    async def changed_swarms(self) -> list[bytes]:
        """The swarms written to since the last call (every swarm on the first)."""
        key = f"{self.prefix}swarm_seq"
        since = self._refreshed_to
        low = "-inf" if since < 0 else f"({since}"
        got: list[tuple[bytes, float]] = await self._redis.zrangebyscore(
            key, low, "+inf", withscores=True
        )
        for _member, score in got:
            self._refreshed_to = max(self._refreshed_to, int(score))
        return [bytes.fromhex(member.decode()) for member, _score in got]

    async def load_all(self) -> list[PeerRecord]:
        """Every record of every swarm."""
        members: list[bytes] = await self._redis.zrange(f"{self.prefix}swarm_seq", 0, -1)
        records: list[PeerRecord] = []
        for hex_hash in members:
            records.extend(await self.load_swarm(bytes.fromhex(hex_hash.decode())))
        return records

    async def load_totals(self) -> dict[bytes, ForgottenTotals]:
        """What the forgotten records of each live swarm added up to."""
        members: list[bytes] = await self._redis.zrange(f"{self.prefix}swarm_seq", 0, -1)
        totals: dict[bytes, ForgottenTotals] = {}
        for hex_hash in members:
            raw: dict[bytes, bytes] = await self._redis.hgetall(
                f"{self.prefix}totals:{hex_hash.decode()}"
            )
            if not raw:
                continue
            got = {k.decode(): int(v) for k, v in raw.items()}
            rules = tuple(
                sorted((k[len("rule:") :], v) for k, v in got.items() if k.startswith("rule:"))
            )
            totals[bytes.fromhex(hex_hash.decode())] = ForgottenTotals(
                peers=got.get("peers", 0),
                uploaded_bytes=got.get("uploaded", 0),
                downloaded_bytes=got.get("downloaded", 0),
                completed=got.get("completed", 0),
                left_by_rule=rules,
            )
        return totals

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
            since = self._positions.get(info_hash, -1)
            args: list[object] = [hex_hash, len(swarm_records), since]
            fields = {}
            for record in swarm_records:
                field = self._field(record)
                fields[field] = record
                args += [field, json.dumps(record_to_json(record)), record.version]
            for event in swarm_events:
                args.append(json.dumps(_event_json(event, hex_hash)))
            k = self._keys(hex_hash)
            keys = [k["peers"], k["swarm_seq"], k["events"], k["changes"], k["seq"]]
            seq, alone, *answer = await self._save_script(keys=keys, args=args)
            if int(seq) and int(alone) and since >= 0:
                # nobody else wrote to this swarm since our last read: what we just
                # wrote is all there is to read, and we have it
                self._remember(info_hash, int(seq))
            refused.extend(fields[field.decode()] for field in answer)
        return refused

    async def forget(self, records: Sequence[PeerRecord], swarms: Sequence[bytes] = ()) -> None:
        """Delete forgotten records (unless another instance wrote a newer version) and
        add them to their swarm's totals; delete ``swarms`` whole."""
        by_swarm: dict[bytes, list[object]] = {}
        for record in records:
            by_swarm.setdefault(record.info_hash, []).extend([self._field(record), record.version])
        for info_hash, pairs in by_swarm.items():
            k = self._keys(info_hash.hex())
            keys = [k["peers"], k["changes"], k["totals"], k["events"], k["swarm_seq"]]
            await self._forget_script(keys=keys, args=[info_hash.hex(), *pairs])
        for info_hash in swarms:
            k = self._keys(info_hash.hex())
            await self._redis.delete(k["peers"], k["changes"], k["totals"], k["events"])
            await self._redis.zrem(k["swarm_seq"], info_hash.hex())
        for info_hash in {*by_swarm, *swarms}:
            self._positions.pop(info_hash, None)

    async def counts(self) -> dict[str, int]:
        """Keys and fields held (for tests and the bench: Redis stays bounded)."""
        members: list[bytes] = await self._redis.zrange(f"{self.prefix}swarm_seq", 0, -1)
        records = 0
        for hex_hash in members:
            records += await self._redis.hlen(f"{self.prefix}peers:{hex_hash.decode()}")
        keys = 0
        async for _key in self._redis.scan_iter(match=f"{self.prefix}*", count=1000):
            keys += 1
        return {"swarms": len(members), "peers": records, "keys": keys}

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


def _event_json(event: TrackerEvent, hex_hash: str) -> dict[str, Any]:
    return {
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
