// The swarm's web seeds, the origins in the same WebTorrent client (swarm.js,
// docs/reader.md "Peers"): SwarmFetch's methods that add and remove them, choose the
// pieces they offer (WebSeedRule's "every piece" or "what no peer holds"), and drop
// one that fails a request. Written here as the methods of SwarmWebSeeds; swarm.js
// puts them on SwarmFetch's prototype, so `this` is the SwarmFetch and they read and
// write its fields as before.

import { silentPeer } from "./swarm-peers.js";
import { ownsPiece, READER_PEER_ID_HEX } from "./swarm-rules.js";

const WEB_SEED_RETRY_S = 10; // a piece a web seed failed is offered again after this (webconn.js)
/** A piece no peer holds that this reader has waited on for its owner (another reader,
 * ownsPiece) this long, in its own running time, is its own too (offerWebSeedPieces). */
export const OWNER_WAIT_S = 8;

const nowS = () => performance.now() / 1000; // swarm.js's clock

/** SwarmFetch's methods about its web seeds (installed by swarm.js). */
export class SwarmWebSeeds {
  /** Whether no connected peer (a silent one not counted: silentPeer) holds a piece
   * this reader lacks. */
  starved() {
    const t = this.torrent;
    const peers = t.wires.filter((w) => w.type !== "webSeed" && !w.destroyed && !silentPeer(w));
    for (let i = 0; i < t.pieces.length; i++) {
      if (t.bitfield.get(i)) continue;
      if (peers.some((w) => w.peerPieces.get(i))) return false;
    }
    return true;
  }

  /** The swarm's downloading peers as this reader sees them, itself included: 1 +
   * the connected peers that lack a piece (WebSeedRule's `leechers`). */
  leechers() {
    const t = this.torrent;
    const n = t.pieces.length;
    const lacking = (w) => {
      for (let i = 0; i < n; i++) if (!w.peerPieces?.get(i)) return true;
      return false;
    };
    return 1 + t.wires.filter((w) => w.type !== "webSeed" && !w.destroyed && lacking(w)).length;
  }

  /** A web seed that fails a request (down, or refusing) leaves this swarm: a dead
   * one kept in the picker slowed the peers' pieces (a reader with a libtorrent peer
   * and a stopped web seed stalled for 10 s in the tests). Its connection (webconn.js,
   * the HTTP side of the web seed's wire) reports each request's error. */
  watchWebSeed(url) {
    const conn = this.torrent._peers?.get(url)?.conn;
    if (typeof conn?.httpRequest !== "function") return;
    const request = conn.httpRequest.bind(conn);
    // (webtorrent's own callback first, on a wire still in the torrent: it gives the
    // failed request's blocks back to the picker. Removing the web seed before it left
    // them reserved, and a reader whose only other source was one peer stopped asking
    // for them: in a parallel run of the suite it took 860 KB of 1.5 MB from its peer,
    // asked for nothing for 10 s, and went to the stopped origins)
    conn.failedUntil = new Map(); // piece -> when it is offered again (webconn.js waits 10 s)
    conn.httpRequest = (index, offset, length, cb) =>
      request(index, offset, length, (err, data) => {
        if (err) conn.failedUntil.set(index, nowS() + WEB_SEED_RETRY_S);
        cb(err, data);
        if (err) setTimeout(() => this.webSeedFailed(url, err), 0);
      });
  }

  /**
   * What the web seeds offer (WebSeedRule): only the pieces this reader lacks that no
   * connected peer that does not choke it holds and that are this reader's own among
   * the connected readers lacking them too (ownsPiece: each such piece goes to one
   * reader, the others take it from that one, or from the web seeds once they have
   * waited OWNER_WAIT_S for it); with `all`, then the others' of those
   * once its own are all asked, then every piece it lacks once none of those is left
   * unasked (the web seeds then never idle while a piece
   * is missing). A web seed's wire (webconn.js) stands for an origin that has every
   * piece; webtorrent asks a wire only for pieces in its `peerPieces`, so that
   * bitfield is the offer. A piece whose request failed is offered again after
   * WEB_SEED_RETRY_S, as webconn.js does.
   *
   * Why not every piece all along under `all`: webtorrent's picker does not ask a
   * peer whose wire is slower than 48 kB/s (a peer not asked yet is at 0) for a piece
   * a faster wire offers, for the first 10 candidates of each pick. A web seed
   * offering every piece was that faster wire, so a reader asked its peer for nothing
   * while the peer held 10 or fewer of its missing pieces, and often never: in the
   * two-readers test (tests/reader/test_swarm_browser.py) one reader took 43-46 of 46
   * pieces from the origin with its peer unchoking it, 0 requests outstanding to it,
   * and the origin sent 1.46-1.54 copies (3 of 14 runs). Offered only what no peer
   * holds while some such piece is left, the web seed takes the pieces the swarm lacks
   * and the peer's pieces are asked of the peer.
   */
  offerWebSeedPieces(all, now) {
    const t = this.torrent;
    const seeds = t.wires.filter((w) => w.type === "webSeed" && !w.destroyed && w.peerPieces);
    if (!seeds.length) return;
    // a silent peer (silentPeer: asked again, nothing since) holds nothing here: a
    // desktop gone without closing its connection held every piece, and the web seeds
    // were offered none while the pieces asked of it waited
    const peers = t.wires.filter((w) => w.type !== "webSeed" && !w.destroyed && !w.peerChoking && !silentPeer(w));
    const lacked = (i) => !t.bitfield.get(i) && !peers.some((w) => w.peerPieces.get(i));
    // a piece no peer holds is this reader's to take from the web seeds when it is
    // the piece's owner among itself and the connected readers that lack it too
    // (ownsPiece); the others take it from the owner once it has it. A reader that
    // chokes this one is no owner (a metered one sends nothing: it would hold the
    // piece from this reader for good)
    const selfId = t.client?.peerId;
    const readers = peers.filter((w) => typeof w.peerId === "string" && w.peerId.startsWith(READER_PEER_ID_HEX));
    const owned = (i) =>
      typeof selfId !== "string" ||
      ownsPiece(
        selfId,
        readers.filter((w) => !w.peerPieces?.get(i)).map((w) => w.peerId),
        i,
      );
    // An owner connected, unchoking and slow (a page without CPU, or whose web seeds
    // failed) stays the owner: its wire is neither destroyed nor choking. Held back
    // (its peers deliver other pieces) this reader took such a piece only once it was
    // starved or stalled; now a piece it has waited on OWNER_WAIT_S for its owner is
    // its own too. The wait is counted in the reader's running time, at most 1 s a
    // call (a page the host left without CPU did not wait on its peers), and only
    // while the piece is lacked and another reader's: a peer holding it, or the
    // reader having it, ends the wait (indexes only: bounded by the piece count)
    if (this.ownerWait?.torrent !== t) this.ownerWait = { torrent: t, at: now, waited: new Map() };
    const waited = this.ownerWait.waited;
    const tick = Math.min(1, Math.max(0, now - this.ownerWait.at));
    this.ownerWait.at = now;
    const own = new Array(t.pieces.length).fill(false); // lacked and this reader's
    const ownerWaited = new Array(t.pieces.length).fill(false); // ... after OWNER_WAIT_S
    for (let i = 0; i < t.pieces.length; i++) {
      if (!lacked(i) || owned(i)) {
        waited.delete(i);
        own[i] = lacked(i);
      } else {
        const w = (waited.get(i) ?? 0) + tick;
        waited.set(i, w);
        own[i] = ownerWaited[i] = w >= OWNER_WAIT_S;
      }
    }
    const mine = (i) => own[i];
    const failedEverywhere = (i) => seeds.every((seed) => (seed.failedUntil?.get(i) ?? 0) > now);
    const asked = (i) => (t._reservations?.[i] ?? []).some((w) => w) || !t.pieces[i] || t.pieces[i].missing === 0;
    // a piece a peer was asked blocks of (a request out): the peer gives them soon, or
    // the silent-peer rule asks them again; a web seed given it then fetches from the
    // first block not reserved to the piece's end (webconn.js), the peer's blocks too
    const peerAsked = (i) => (t._reservations?.[i] ?? []).some((w) => w && w.type !== "webSeed" && !w.destroyed && !silentPeer(w));
    // with `all`: this reader's own pieces no peer holds, then (once those are all
    // asked) every piece no peer holds, then (once those are) every piece
    let widen = all;
    for (let i = 0; widen && i < t.pieces.length; i++) {
      if (lacked(i) && !asked(i) && !failedEverywhere(i) && mine(i)) widen = false;
    }
    let everything = widen;
    for (let i = 0; everything && i < t.pieces.length; i++) {
      if (lacked(i) && !asked(i) && !failedEverywhere(i)) everything = false;
    }
    // why each piece offered now is offered (offerTag: counted in the web seeds' bytes
    // of the piece once it is verified, swarm.js put): "owner" (no connected peer holds
    // it, this reader its owner), "waited_owner" (another reader's, waited on for
    // OWNER_WAIT_S), "unheld" (another reader's no peer holds, once this reader's own
    // were all asked), "every_piece" (once every piece no peer holds was asked); with
    // the rule's state when offered (webSeedRuleState: "held", or why they are on)
    this.offerTags ??= new Map(); // piece -> [offer, rule]; indexes only: bounded
    const rule = this.webSeedRuleState ?? "unknown";
    const why = (i) => (lacked(i) && mine(i) ? (ownerWaited[i] ? "waited_owner" : "owner") : lacked(i) && widen ? "unheld" : "every_piece");
    let more = false;
    for (let i = 0; i < t.pieces.length; i++) {
      if (t.bitfield.get(i)) continue;
      const offer = (everything || (lacked(i) && (widen || mine(i)))) && !peerAsked(i);
      if (offer) this.offerTags.set(i, [why(i), rule]);
      for (const seed of seeds) {
        const give = offer && !((seed.failedUntil?.get(i) ?? 0) > now);
        if (seed.peerPieces.get(i) === give) continue;
        seed.peerPieces.set(i, give);
        more ||= give;
      }
    }
    if (more) t._update?.(); // ask for the pieces offered now
  }

  webSeedFailed(url, err) {
    if (this.deadWebSeeds.has(url) || this.state === "left") return;
    // a busy origin (5xx) or a slow answer (timeout) is asked again by webtorrent
    // after 10 s; one that refuses connections or the file (4xx) is gone for good
    const text = String(err?.message ?? err);
    if (/status code 5\d\d/.test(text) || err?.name === "TimeoutError" || /timed? ?out/i.test(text)) return;
    this.deadWebSeeds.add(url);
    this.download.notice(`web seed ${url} failed (${err?.message ?? err}): it leaves this swarm`);
    try {
      this.torrent.removePeer(url);
    } catch (e) {
      console.warn(`webtorrent: ${e?.message ?? e}`);
    }
    this.onChange();
  }

  setWebSeeds(on) {
    const urls = this.webSeedUrls();
    if (on && (this.webSeedsRefused || !urls.length)) on = false;
    if (on === this.webSeedsOn) return;
    this.webSeedsOn = on;
    for (const url of urls) {
      if (on) {
        this.torrent.addWebSeed(url);
        this.watchWebSeed(url);
      } else this.torrent.removePeer(url);
    }
    this.onChange();
  }

  /** Whether a web seed is in the swarm that has not failed (it may be slow). */
  webSeedsAlive() {
    return this.webSeedsOn && !this.webSeedsRefused && this.webSeedUrls().length > 0;
  }

  webSeedUrls() {
    const given = Array.isArray(this.swarm.web_seeds) ? this.swarm.web_seeds : [];
    return given.filter((u) => typeof u === "string" && /^https?:\/\//.test(u) && !this.deadWebSeeds.has(u));
  }
}
