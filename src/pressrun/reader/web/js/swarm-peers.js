// The swarm's peers, one wire each (swarm.js, docs/reader.md "Peers"): SwarmFetch's
// methods that watch a peer's wire (the bytes it sends and is sent, its answer time),
// ban a peer whose blocks fail a piece, ask again what a silent peer leaves
// unanswered, and choke every peer while uploads are not allowed. Written here as the
// methods of SwarmPeers; swarm.js puts them on SwarmFetch's prototype, so `this` is
// the SwarmFetch and they read and write its fields as before.

import { answerTime, silentPeerStep } from "./swarm-rules.js";

const MAX_BANNED = 1000; // peer ids remembered as banned (and with a strike), at most
const MAX_SILENCE_STEP_S = 1; // a peer's silence grows by at most this per tick (silentPeerStep)

const nowS = () => performance.now() / 1000; // swarm.js's clock

const BLOCK = 1 << 14; // webtorrent's block: a peer is asked block by block, from a block's start
const blockKey = (index, offset) => `${index}:${offset}`; // a held block (watchHeld)

/**
 * Whether peer `wire` is silent: its requests were asked again (reaskSilentPeers) and
 * it has sent nothing since. Until it sends again it is asked for nothing (webtorrent
 * gave its re-asked blocks back to it, the first wire with room, so they waited on it
 * again) and holds nothing for the web seeds' rule (swarm-web-seeds.js: its pieces are
 * lacked, it owns none, the reader is starved without it).
 *
 * Why: a desktop peer gone without closing its connection (its process killed or hung,
 * a laptop asleep or off the Wi-Fi) stays a connected, unchoking peer holding every
 * piece until the silent-peer rule disconnects it (3 x its timeout, 9 s at the least)
 * or WebRTC's consent check fails. Held back (the other readers deliver), the readers'
 * web seeds were offered nothing, since a peer held every piece, and the pieces asked
 * of it waited on it: three readers of a 10 MB issue whose desktop seed was killed
 * mid-download ended at 10.9-12.2 s, each after disconnecting it; now at 2.8-8.7 s,
 * none (tests/reader/test_swarm_silent_desktop_browser.py).
 */
export function silentPeer(wire) {
  return wire.reaskedAt !== undefined && wire.type !== "webSeed";
}

/** SwarmFetch's methods about its peers' wires (installed by swarm.js). */
export class SwarmPeers {
  /** webtorrent's request pass asks a silent peer (silentPeer) for nothing. */
  askNoSilentPeer(torrent) {
    const updateWire = torrent._updateWire?.bind(torrent);
    if (typeof updateWire !== "function") return;
    torrent._updateWire = (wire) => (silentPeer(wire) ? false : updateWire(wire));
  }

  onWire(wire) {
    this.watchHeld(wire); // before watchBytes: a web seed's ask reaches it trimmed
    this.watchBytes(wire);
    this.watchHeldAnswers(wire); // after: a held block it takes back is not counted as waste
    if (wire.type === "webSeed") {
      wire.on("piece", (index, offset, buffer) => {
        this.receivedFromWebSeeds += buffer.length;
        this.contributed(index, wire, buffer.length);
      });
      return;
    }
    if (this.banned.has(wire.peerId)) {
      wire.destroy();
      return;
    }
    this.peersSeen.add(wire.peerId);
    this.firstPeer?.();
    // no unchoke while uploads are not allowed, whoever asks for it (webtorrent
    // unchokes a peer the moment it is interested, and its rechoke every 10 s): a
    // metered reader that unchoked a peer and refused its requests left that peer
    // waiting out request_timeout_s for each before it asked elsewhere
    const unchoke = wire.unchoke.bind(wire);
    wire.unchoke = () => {
      if (this.uploadAllowed()) unchoke();
    };
    if (!this.uploadAllowed()) wire.choke();
    // the peer's answer time (silentPeerStep): from the ask (its requests went from
    // none to some) or its answer before, to its next answer
    const request = wire.request.bind(wire);
    wire.request = (...args) => {
      if (wire.requests.length === 0) wire.askedAt = nowS();
      return request(...args);
    };
    wire.answerS = null;
    wire.silentS = 0;
    wire.on("download", (n) => {
      const now = nowS();
      this.receivedFromPeers += n;
      wire.answerS = answerTime(wire.answerS, now - Math.max(wire.lastPayloadAt, wire.askedAt ?? 0));
      this.lastPeerPayloadAt = wire.lastPayloadAt = now;
      wire.silentS = 0;
      wire.reaskedAt = undefined;
    });
    wire.lastPayloadAt = nowS();
    wire.on("upload", (n) => {
      this.uploaded += n;
    });
    wire.on("piece", (index, offset, buffer) => this.contributed(index, wire, buffer.length));
  }

  contributed(index, wire, bytes) {
    let who = this.contributors.get(index);
    if (who === undefined) this.contributors.set(index, (who = new Map()));
    who.set(wire, (who.get(wire) ?? 0) + bytes);
  }

  onWarning(err) {
    const bad = /Piece (\d+) failed verification/.exec(String(err?.message ?? err));
    if (bad === null) return;
    const index = Number(bad[1]);
    const who = [...(this.contributors.get(index)?.keys() ?? [])];
    this.contributors.delete(index);
    this.badPieces += 1;
    // a peer banned already sent blocks of it: that explains it, nobody else is blamed
    if (who.some((w) => this.banned.has(w.peerId))) return;
    for (const wire of who) {
      if (wire.type === "webSeed") {
        // an origin sent it: the origins leave this swarm (the origin path checks
        // each origin's pieces and fails the bad one)
        this.webSeedsRefused = true;
        this.setWebSeeds(false);
        this.download.notice(`piece ${index} from an origin (web seed) does not match the torrent; web seeds are dropped`);
        continue;
      }
      const strikes = (this.strikes.get(wire.peerId) ?? 0) + (who.length === 1 ? 2 : 1);
      this.strikes.set(wire.peerId, strikes);
      if (this.strikes.size > MAX_BANNED) this.strikes.delete(this.strikes.keys().next().value);
      if (strikes >= 2) this.ban(wire, index);
    }
  }

  ban(wire, index) {
    if (this.banned.size >= MAX_BANNED) this.banned.delete(this.banned.values().next().value);
    this.banned.add(wire.peerId);
    this.strikes.delete(wire.peerId);
    this.bans.push({ peer: wire.peerId, piece: index });
    wire.destroy();
    // the blocks it sent of pieces not complete yet are thrown away: those pieces
    // start again (as webtorrent does after a failed piece), so no honest sender of
    // their other blocks is blamed for them
    const pieces = this.torrent.pieces;
    for (const [i, who] of this.contributors) {
      if (!who.has(wire)) continue;
      this.contributors.delete(i);
      if (pieces[i]) pieces[i] = new pieces[i].constructor(pieces[i].length);
    }
    this.download.notice(
      `peer ${wire.peerId.slice(0, 12)}… sent piece ${index}, which does not match the signed torrent: it is banned`,
    );
    this.onChange();
  }

  /**
   * Requests a peer has left unanswered are asked again, and a peer silent long after
   * that is disconnected (it can come back through the tracker): silentPeerStep, with
   * request_timeout_s as the least time a peer is given. (Once seen on these machines:
   * a libtorrent peer left the last blocks of two pieces unanswered, and webtorrent
   * waits 30 s before it gives a request up.) A peer's silence grows by the time
   * between two ticks, at most MAX_SILENCE_STEP_S: a page the host left without CPU
   * does not count that time against its peers.
   */
  reaskSilentPeers(now) {
    const step = Math.min(MAX_SILENCE_STEP_S, Math.max(0, now - (this.silenceTick ?? now)));
    this.silenceTick = now;
    const received = this.receivedFromPeers + this.receivedFromWebSeeds;
    for (const wire of this.torrent.wires) {
      if (wire.type === "webSeed" || wire.destroyed) continue;
      if (wire.requests.length === 0 && !silentPeer(wire)) {
        // (a silent peer is asked for nothing: its silence goes on counting until it
        // sends, and the disconnect below comes as it did with its requests held)
        wire.silentS = 0;
        continue;
      }
      wire.silentS = (wire.silentS ?? 0) + step;
      const verdict = silentPeerStep({
        silentS: wire.silentS,
        answerS: wire.answerS,
        baseS: this.cfg.request_timeout_s,
        reasked: wire.reaskedAt !== undefined,
        // bytes from anybody else since the re-ask (the wire's own since then excluded)
        othersDelivered: received - (wire.downloaded ?? 0) > (wire.othersAtReask ?? Infinity),
      });
      if (verdict === "disconnect") {
        this.download.notice(
          `peer ${wire.peerId.slice(0, 12)}… answers no request for ${wire.silentS.toFixed(1)} s while others send: disconnected`,
        );
        wire.destroy();
        continue;
      }
      if (verdict !== "reask") continue;
      wire.reaskedAt = now;
      wire.othersAtReask = received - (wire.downloaded ?? 0);
      // each unanswered request fails here as webtorrent's own timeout would fail it
      // (without its 'timeout' event, which destroys the wire): its block is reserved
      // again and asked for at once, of whoever webtorrent picks. The peer still
      // holds it (held blocks, watchHeld): it is sent a BitTorrent cancel only when
      // another source is asked for the block, and asked for it again itself, it is
      // sent nothing
      for (const r of [...wire.requests]) {
        this.blockCause(r.piece, r.offset, r.length, "reask");
        this.hold(wire, r);
        wire._callback(wire._pull(wire.requests, r.piece, r.offset, r.length), new Error("unanswered: asked again"), null);
        this.reasked += 1;
      }
    }
  }

  /** Remember that peer `wire` still holds request `r`, failed here by the re-ask. */
  hold(wire, r) {
    this.heldBlocks ??= new Map(); // "piece:offset" -> {wire, length, resend}
    // a request this peer held once already and was given back to it (watchHeld) is
    // asked for with a message the next time: the peer may have lost it
    this.heldBlocks.set(blockKey(r.piece, r.offset), { wire, length: r.length, resend: r.heldBefore === true });
  }

  /**
   * A silent peer's requests failed by the re-ask (reaskSilentPeers) stay held at
   * the peer, and `wire`'s asks are watched:
   *
   * - another wire (a peer or a web seed) asked for a held block: the peer that
   *   holds it is sent a BitTorrent cancel then, so it does not send the block too
   *   when it wakes (tests/reader/test_swarm_browser_bytes.py);
   * - the peer that holds a block asked for it again (webtorrent gives a failed
   *   block back to the first wire with room, often the same one): the request is
   *   put back in its list without a message, and its answer to the request it
   *   holds fills it;
   * - the block comes from the peer anyway, or it chokes this reader (a peer drops
   *   what it was asked on a choke), or its wire closes: the block is not held.
   *
   * Why: at 9a9f045 the re-ask sent the cancel at once, and webtorrent asked the same
   * peer for the same block a moment later. A webtorrent peer (bittorrent-protocol
   * 5.0.9, every reader's wire) whose read of the first request was still pending
   * lost both: that read's answer takes the first request of the same piece, offset
   * and length from its list (the new one), finds it is not its own, and sends
   * nothing; the new one's answer then finds nothing. In tests/reader/
   * test_swarm_browser.py's busy-peer test, 3 of 18 re-asked blocks never came
   * after the peer woke, the reader's pipeline to it stayed full of them, and the
   * stall rule sent the reader to the origins 10 s later.
   */
  watchHeld(wire) {
    const request = wire.request.bind(wire);
    wire.request = (index, offset, length, cb) => {
      const held = this.heldBlocks;
      if (held === undefined || held.size === 0) return request(index, offset, length, cb);
      const mine = held.get(blockKey(index, offset));
      if (mine?.wire === wire && mine.length === length) {
        held.delete(blockKey(index, offset));
        if (mine.resend || wire.peerChoking) return request(index, offset, length, cb);
        // the peer holds this request: it goes back in the list, no message sent
        const message = wire._message;
        wire._message = () => {};
        try {
          request(index, offset, length, cb);
        } finally {
          wire._message = message;
        }
        const r = wire.requests[wire.requests.length - 1];
        if (r?.piece === index && r.offset === offset) r.heldBefore = true;
        return;
      }
      this.releaseHeld(wire, index, offset, length);
      return request(index, offset, length, cb);
    };
  }

  /**
   * Peer `wire`'s answers to the requests it holds (watchHeld): a held block it sends
   * that no wire was asked for again is taken as the answer to a request put back
   * now (adoptHeld), not dropped as unrequested. Its choke (a peer drops what it was
   * asked on a choke) and its close end what it holds.
   */
  watchHeldAnswers(wire) {
    if (wire.type === "webSeed") return;
    const forget = () => {
      for (const [key, h] of this.heldBlocks ?? []) if (h.wire === wire) this.heldBlocks.delete(key);
    };
    wire.on("choke", forget);
    wire.once("close", forget);
    const onPiece = wire._onPiece.bind(wire);
    wire._onPiece = (index, offset, buffer) => {
      if (this.heldBlocks?.get(blockKey(index, offset))?.wire === wire) {
        try {
          this.adoptHeld(wire, index, offset, buffer.length);
        } catch (err) {
          console.warn(`swarm held block: ${err?.message ?? err}`);
        }
        this.heldBlocks.delete(blockKey(index, offset));
      }
      return onPiece(index, offset, buffer);
    };
  }

  /**
   * Peer `wire` sends block `offset` of piece `index`, which it held since a re-ask
   * and nobody was asked for again (the piece lists it free): it is reserved for
   * `wire` as webtorrent reserves a block (its free blocks are taken last first) and
   * asked of it, which watchHeld turns into a request put back without a message, so
   * the block that arrives answers it. Without this, with no other source the peer
   * sent those blocks when it woke, webtorrent dropped them (no request named them)
   * and asked for them again: 230-290 kB of 1.5 MB came twice in the busy-peer test.
   * Not adopted (the piece's pipeline to `wire` is full): dropped as before.
   */
  adoptHeld(wire, index, offset, length) {
    const t = this.torrent;
    const piece = t?.pieces?.[index];
    const block = offset / BLOCK;
    if (wire.requests.some((r) => r.piece === index && r.offset === offset && r.length === length)) return;
    const free = piece?._cancellations;
    const at = free?.indexOf(block) ?? -1;
    if (at === -1 || piece._buffer?.[block] || typeof t._request !== "function") return;
    free.splice(at, 1);
    free.push(block); // piece.reserve() pops the last free block
    this.heldBlocks.get(blockKey(index, offset)).resend = false; // put back, no message
    // the block is here: its request is answered at once and takes no room in the
    // wire's pipeline, which webtorrent's _request checks (full of the other blocks
    // put back, it refused 10 of 18 in the busy-peer test): it sees an empty list
    const [requests, askedAt] = [wire.requests, wire.askedAt];
    wire.requests = [];
    try {
      t._request(wire, index, false);
    } finally {
      requests.push(...wire.requests);
      [wire.requests, wire.askedAt] = [requests, askedAt];
    }
  }

  /** `wire` is asked for piece `index` from `offset` for `length` bytes: each block of
   * it another peer holds is cancelled there (a BitTorrent cancel). */
  releaseHeld(wire, index, offset, length) {
    for (let start = offset; start < offset + length; start += BLOCK) {
      const key = blockKey(index, start);
      const h = this.heldBlocks.get(key);
      if (h === undefined || h.wire === wire) continue;
      this.heldBlocks.delete(key);
      if (!h.wire.destroyed) h.wire.cancel(index, start, h.length);
    }
  }

  /**
   * Choke every peer while uploads are not allowed (the link turned metered, or
   * sharing was turned off), so that no peer asks this reader for a piece it would
   * refuse; once they are allowed again, webtorrent's rechoke unchokes the interested
   * ones at once rather than at its next 10 s round.
   */
  applyChoking() {
    const t = this.torrent;
    if (t === null || t.destroyed) return;
    const allowed = this.uploadAllowed();
    if (!allowed) {
      for (const w of t.wires) if (w.type !== "webSeed" && !w.destroyed && !w.amChoking) w.choke();
    } else if (this.chokedAll) {
      t._rechoke?.();
    }
    this.chokedAll = !allowed;
  }

  /** Pieces held by each connected peer (index -> count; prefetch.js asks the origins
   * first for a piece nobody here holds). */
  availability() {
    const n = this.m.piece_sha256.length;
    const counts = new Array(n).fill(0);
    for (const w of this.torrent?.wires ?? []) {
      if (w.type === "webSeed" || w.destroyed || !w.peerPieces) continue;
      for (let i = 0; i < n; i++) if (w.peerPieces.get(i)) counts[i] += 1;
    }
    return counts;
  }

  /** When a peer last sent payload (seconds, performance.now()'s clock; 0: never):
   * prefetch.js's patience with the peers. */
  get peerPayloadAt() {
    return this.lastPeerPayloadAt ?? 0;
  }
}
