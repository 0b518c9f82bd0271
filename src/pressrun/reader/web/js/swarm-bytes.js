// The swarm's byte accounting (swarm.js, docs/reader.md "Peers", issue 26): every
// block a wire delivers is classed before webtorrent takes it, as a block it needed
// or as waste, by source (each web seed, each peer) and by what made it come twice:
//
// - "hotswap": webtorrent's _hotswap gave a slow wire's blocks to a faster one
//   (cancelling them in the piece, not on the slow wire, which still sends them);
// - "reask": reaskSilentPeers asked a silent peer's blocks of someone else;
// - "choke": the peer choked this reader with the block asked (its request failed
//   here; a peer may still send it);
// - "unrequested": a block no request of this wire names (asked again, cancelled);
// - "race": two requests were out for the block for another reason.
//
// Written here as the methods of SwarmBytes; swarm.js puts them on SwarmFetch's
// prototype, so `this` is the SwarmFetch.

const BLOCK = 1 << 14; // webtorrent's block (torrent-piece BLOCK_LENGTH)
const SPEED_THRESHOLD = 3 * BLOCK; // webtorrent's: a wire this fast is never swapped out
const MAX_SOURCES = 64; // sources named in the readout, at most (the rest: "others")

/** The readout's empty counters (SwarmFetch.status().bytes). */
export function emptyByteTally() {
  return {
    received: 0, // every payload byte a wire delivered (peers and web seeds)
    needed: 0, // ... that filled a block this reader lacked
    wasted: 0, // ... that did not (a block already had, or one no request named)
    wasted_by_cause: { hotswap: 0, reask: 0, choke: 0, unrequested: 0, race: 0 },
    wasted_from_web_seeds: 0,
    wasted_from_peers: 0,
    // hotswaps by who took whose blocks (webtorrent's 'hotswap' event)
    hotswaps: { web_seed_over_peer: 0, web_seed_over_web_seed: 0, peer_over_peer: 0, peer_over_web_seed: 0 },
    // bytes asked of the web seeds for a piece a connected peer that unchokes this
    // reader held at the time of the ask, and for a piece no such peer held
    web_seed_asked_peer_held: 0,
    web_seed_asked_lacked: 0,
    // "web seed <url>" | "peer <id>" -> {received, wasted}; <id>: the peer id's first
    // 12 bytes in hex, its client prefix ("-PR0100-": a desktop, libtorrent; "-WW...":
    // a reader, webtorrent) and 4 bytes of the rest, so peers are told apart
    by_source: {},
  };
}

const kind = (wire) => (wire.type === "webSeed" ? "web_seed" : "peer");

/**
 * webtorrent's hotswap, kept to peers (installed on the torrent as its _hotswap): a
 * peer at least twice as fast as a slow peer (under 48 kB/s) takes the slow peer's
 * blocks of piece `index`, and the slow peer is sent a BitTorrent cancel for each, so
 * it does not send them too. Returns whether `wire` may now reserve blocks of it.
 *
 * - A web seed never takes a peer's blocks: the peer was asked, and gives them soon or
 *   the silent-peer rule (reaskSilentPeers) asks them again of others, with a cancel.
 * - A web seed's blocks are never taken: its HTTP answer comes whole and cannot be
 *   called back, and until it comes its wire reads 0 B/s, so webtorrent swapped out
 *   every web seed that had not answered yet.
 *
 * Why: webtorrent's own hotswap cancels the slow wire's blocks in the piece only (the
 * slow wire still sends them: they come twice), and counts a web seed as slow. In
 * tests/reader/test_swarm_browser_bytes.py a web seed took 3 blocks of a busy peer and
 * the peer sent them anyway; in a crowd of 10 (bench/reader_swarm.py) readers took
 * up to 33 MB for a 20 MB issue.
 */
export function hotswapPeers(torrent, wire, index) {
  if (wire.type === "webSeed") return false;
  const speed = wire.downloadSpeed();
  if (speed < BLOCK) return false;
  const r = torrent._reservations[index];
  if (!r) return false;
  let minWire = null;
  let minSpeed = Infinity;
  for (const other of r) {
    if (!other || other === wire || other.type === "webSeed") continue;
    const otherSpeed = other.downloadSpeed();
    if (otherSpeed >= SPEED_THRESHOLD || 2 * otherSpeed > speed || otherSpeed > minSpeed) continue;
    minWire = other;
    minSpeed = otherSpeed;
  }
  if (minWire === null) return false;
  for (let i = 0; i < r.length; i++) if (r[i] === minWire) r[i] = null;
  torrent.emit("hotswap", minWire, wire, index); // counted (onHotswap) before the cancels
  // each cancel fails its request here, and webtorrent's callback gives the block back
  // to the piece (once: webtorrent's own hotswap did that itself, without the cancel)
  for (const q of minWire.requests.filter((q) => q.piece === index)) minWire.cancel(q.piece, q.offset, q.length);
  return true;
}

/** SwarmFetch's methods that account for the bytes its wires deliver (installed by swarm.js). */
export class SwarmBytes {
  /** Class every block `wire` delivers (wraps its _onPiece, which runs before webtorrent
   * sees the block), and count web-seed asks by whether a peer held the piece. */
  watchBytes(wire) {
    const onPiece = wire._onPiece.bind(wire);
    wire._onPiece = (index, offset, buffer) => {
      try {
        this.classBlock(wire, index, offset, buffer.length);
      } catch (err) {
        console.warn(`swarm byte tally: ${err?.message ?? err}`);
      }
      return onPiece(index, offset, buffer);
    };
    wire.on("choke", () => {
      // bittorrent-protocol fails every request on a choke (without the fast
      // extension), after this event: a block of them that comes anyway is "choke"
      for (const r of wire.requests) this.blockCause(r.piece, r.offset, r.length, "choke");
    });
    if (wire.type !== "webSeed") return;
    const request = wire.request.bind(wire);
    wire.request = (index, offset, length, cb) => {
      length = this.trimWebSeedAsk(wire, index, offset, length);
      const held = this.torrent.wires.some((w) => w.type !== "webSeed" && !w.destroyed && !w.peerChoking && w.peerPieces?.get(index));
      if (held) this.tally.web_seed_asked_peer_held += length;
      else this.tally.web_seed_asked_lacked += length;
      return request(index, offset, length, cb);
    };
  }

  /**
   * The bytes of piece `index` a web seed is asked for, from `offset`: webtorrent asks
   * a web seed from the first block it may reserve to the piece's end, over blocks
   * another wire was asked for meanwhile and blocks already received (after a re-ask,
   * the piece's free blocks are not one run). The ask ends before the first such
   * block; the free blocks after it go back to the piece (a cancel), to be asked
   * again. (In tests/reader/test_swarm_browser_bytes.py, 3 blocks a peer had been
   * asked again came from both.)
   */
  trimWebSeedAsk(seed, index, offset, length) {
    const t = this.torrent;
    const piece = t.pieces[index];
    if (!piece?._buffer) return length;
    const first = Math.floor(offset / BLOCK);
    const end = Math.ceil((offset + length) / BLOCK);
    const taken = new Set(); // blocks of the piece another wire was asked for
    for (const w of t.wires) {
      if (w === seed || w.destroyed) continue;
      for (const r of w.requests) {
        if (r.piece !== index) continue;
        for (let b = Math.floor(r.offset / BLOCK); b * BLOCK < r.offset + r.length; b++) taken.add(b);
      }
    }
    let stop = first + 1; // the first block is free: webtorrent reserved it for this ask
    while (stop < end && !taken.has(stop) && !piece._buffer[stop]) stop++;
    if (stop === end) return length;
    for (let b = stop; b < end; b++) if (!taken.has(b) && !piece._buffer[b]) piece.cancel(b);
    return Math.min(length, stop * BLOCK - offset);
  }

  /** webtorrent's 'hotswap' (slow wire, fast wire, piece): count it; the slow wire's
   * blocks of the piece still come, and are waste by "hotswap" when they do. */
  onHotswap(slow, fast, index) {
    this.tally.hotswaps[`${kind(fast)}_over_${kind(slow)}`] += 1;
    for (const r of slow.requests) if (r.piece === index) this.blockCause(r.piece, r.offset, r.length, "hotswap");
  }

  /** Remember why blocks of piece `index` from `offset` for `length` bytes may come twice. */
  blockCause(index, offset, length, cause) {
    this.causes ??= new Map(); // "piece:block" -> cause (bounded by the torrent's blocks)
    for (let b = Math.floor(offset / BLOCK); b * BLOCK < offset + length; b++) this.causes.set(`${index}:${b}`, cause);
  }

  /** Class `length` bytes of piece `index` at `offset` that `wire` delivers, before
   * webtorrent takes them (it drops a block no request names, and a block it holds). */
  classBlock(wire, index, offset, length) {
    const t = this.torrent;
    const tally = this.tally;
    const requested = wire.requests.some((r) => r.piece === index && r.offset === offset && r.length === length);
    const piece = t.pieces[index];
    let had = 0; // bytes of blocks this reader already holds
    if (t.bitfield.get(index) || !piece || piece._flushed) had = length;
    else if (piece._buffer) {
      for (let b = Math.floor(offset / BLOCK); b * BLOCK < offset + length; b++) {
        if (piece._buffer[b]) had += Math.min(BLOCK, offset + length - b * BLOCK);
      }
    }
    const waste = requested ? had : length;
    tally.received += length;
    tally.needed += length - waste;
    const name = (wire.tallyName ??= wire.type === "webSeed" ? `web seed ${this.webSeedName(wire)}` : `peer ${String(wire.peerId).slice(0, 24)}`);
    let source = tally.by_source[name];
    if (source === undefined) {
      const full = Object.keys(tally.by_source).length >= MAX_SOURCES;
      source = tally.by_source[full ? "others" : name] ??= { received: 0, wasted: 0 };
    }
    source.received += length;
    if (waste === 0) return;
    tally.wasted += waste;
    source.wasted += waste;
    if (wire.type === "webSeed") tally.wasted_from_web_seeds += waste;
    else tally.wasted_from_peers += waste;
    const cause = this.causes?.get(`${index}:${Math.floor(offset / BLOCK)}`) ?? (requested ? "race" : "unrequested");
    tally.wasted_by_cause[cause] += waste;
  }

  /** A web seed wire's URL (its peer in the torrent's table), for the readout. */
  webSeedName(wire) {
    for (const [id, peer] of this.torrent?._peers ?? []) if (peer.wire === wire) return id;
    return "?";
  }
}
