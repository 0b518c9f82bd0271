// A swarm session's readout (swarm.js, docs/reader.md "Peers"): SwarmFetch's methods
// that say what the page (app.js, prefetch.js) and the tests see of it: its state, its
// peers and web seeds, the bytes by source and cause, what it cost. Written here as the
// methods of SwarmStatus; swarm.js puts them on SwarmFetch's prototype, so `this` is the
// SwarmFetch and they read its fields as before. Nothing here decides anything.

import { silentPeer } from "./swarm-peers.js";
import { DESKTOP_PEER_ID_HEX } from "./swarm-rules.js";

/** SwarmFetch's readout (installed by swarm.js). */
export class SwarmStatus {
  status() {
    return {
      state: this.state,
      peers: this.torrent?.wires.filter((w) => w.type !== "webSeed").length ?? 0,
      // connected peers that let this reader ask them for pieces, and that it lets ask
      peers_unchoking: this.torrent?.wires.filter((w) => w.type !== "webSeed" && !w.destroyed && !w.peerChoking).length ?? 0,
      peers_unchoked: this.torrent?.wires.filter((w) => w.type !== "webSeed" && !w.destroyed && !w.amChoking).length ?? 0,
      peers_seen: this.peersSeen.size,
      // of those, desktop peers (libtorrent, "-PR" ids), connected and unchoking this reader
      desktop_peers: this.desktopWires().length,
      desktop_peers_unchoking: this.desktopWires().filter((w) => !w.peerChoking).length,
      // connected peers silent since their requests were asked again (swarm-peers.js silentPeer)
      peers_silent: this.torrent?.wires.filter((w) => !w.destroyed && silentPeer(w)).length ?? 0,
      // missing pieces the web seeds offer now (offerWebSeedPieces), and requests out to peers
      web_seed_offered: this.webSeedOffered(),
      peer_requests: this.torrent?.wires.reduce((n, w) => n + (w.type !== "webSeed" && !w.destroyed ? w.requests.length : 0), 0) ?? 0,
      bytes_from_peers: this.fromPeers,
      bytes_from_web_seeds: this.fromWebSeeds,
      web_seed_bytes_by_offer: this.webSeedBytesByOffer,
      web_seed_bytes_by_rule: this.webSeedBytesByRule,
      bytes_received_from_peers: this.receivedFromPeers,
      uploaded_bytes: this.uploaded,
      bad_pieces: this.badPieces,
      reasked_requests: this.reasked,
      peer_rate_bytes_per_s: this.peerRate ?? null,
      web_seed_rate_bytes_per_s: this.webSeedRate ?? null,
      banned: this.bans,
      web_seeds_on: this.webSeedsOn,
      web_seeds_all_pieces: this.webSeedsOn && this.webSeedsAll,
      leave_rule: this.leaveRule,
      // every byte received, needed or wasted, by source and cause; hotswaps
      bytes: this.tally,
      // what the swarm cost here (swarm-load.js): webtorrent's request passes asked
      // for and run, peers refused at the cap, reads of stored pieces for peers
      load: { ...this.updates, ...this.peerBound, piece_reads: this.pieceReads, ...this.sends },
    };
  }

  /** The connected desktop peers' wires (libtorrent, DESKTOP_PEER_ID_HEX). */
  desktopWires() {
    return (this.torrent?.wires ?? []).filter(
      (w) => w.type !== "webSeed" && !w.destroyed && typeof w.peerId === "string" && w.peerId.startsWith(DESKTOP_PEER_ID_HEX),
    );
  }

  /** The missing pieces some web seed offers now (its wire's bitfield, offerWebSeedPieces). */
  webSeedOffered() {
    const t = this.torrent;
    if (!t?.pieces) return 0;
    const seeds = t.wires.filter((w) => w.type === "webSeed" && !w.destroyed && w.peerPieces);
    let n = 0;
    for (let i = 0; i < t.pieces.length; i++) if (!t.bitfield.get(i) && seeds.some((w) => w.peerPieces.get(i))) n++;
    return n;
  }
}
