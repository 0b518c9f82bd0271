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

/** SwarmFetch's methods about its peers' wires (installed by swarm.js). */
export class SwarmPeers {
  onWire(wire) {
    this.watchBytes(wire);
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
      if (wire.requests.length === 0) {
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
      // each unanswered request is cancelled (a BitTorrent cancel: the peer drops it
      // and does not send the block when it wakes; its callback here fails the
      // request as webtorrent's own timeout would, without its 'timeout' event, which
      // destroys the wire): its blocks are reserved again and asked for at once.
      // Failed here only, a busy peer sent every one of them later, and each came
      // twice (tests/reader/test_swarm_browser_bytes.py)
      for (const r of [...wire.requests]) {
        this.blockCause(r.piece, r.offset, r.length, "reask");
        wire.cancel(r.piece, r.offset, r.length);
        this.reasked += 1;
      }
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
}
