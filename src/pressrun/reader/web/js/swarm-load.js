// What the reader's swarm costs the phone's CPU (swarm.js, docs/reader.md "Peers",
// issue 26). Profiled in bench/reader_swarm.py (N = 10, 20 MB, `--profile 3`), a
// reader's page spent most of its busy main thread in three places this module
// changes on the reader's torrent, without changing what webtorrent asks for:
//
// - webtorrent's request pass (`_update`: every wire's requests refilled) ran once
//   per call, and it is called after every block received and every `have` heard
//   (hundreds a second in a crowd), each call its own idle callback: most passes
//   found nothing to do. Here the calls made while a pass is waiting are one pass.
// - its rarest-first pick scans every piece for each piece it tries, and tries again
//   while the piece it found is fully asked for (the usual case in a crowd):
//   O(pieces²) per wire and pass. Here a pick puts the pieces this reader lacks in
//   order of rarity once (ties shuffled, as webtorrent picks among equals at random)
//   and walks that order.
// - a WebTorrent tracker client sends 5 new WebRTC offers at every announce (each an
//   RTCPeerConnection that gathers its candidates, kept 50 s when nobody answers),
//   whatever it is connected to, and answers every offer relayed to it. Here the
//   reader asks for more peers only while it has fewer than `maxPeers`, its offers
//   still out counted as peers coming, and refuses a new connection once it has
//   `maxPeersIn` (webtorrent's own bound is 55).

/** Peers a reader looks for (offers sent while it has fewer connected or connecting). */
export const MAX_PEERS = 8;
/** Peers a reader accepts at most, others' offers included: a newcomer still finds
 * readers with room when every reader has looked for its MAX_PEERS. */
export const MAX_PEERS_IN = 12;
/** webtorrent's offers per announce at most (bittorrent-tracker's websocket client). */
const OFFERS_PER_ANNOUNCE = 5;

/**
 * How many peers to ask the tracker for (pure): the offers an announce carries. None
 * once `peers` (connected or connecting) reaches `maxPeers`; else what is missing, at
 * most OFFERS_PER_ANNOUNCE.
 */
export function announceWant(peers, maxPeers = MAX_PEERS) {
  return Math.max(0, Math.min(OFFERS_PER_ANNOUNCE, maxPeers - peers));
}

/** Whether a new peer connection may be taken (pure): fewer than `maxPeersIn` now. */
export function roomForPeer(peers, maxPeersIn = MAX_PEERS_IN) {
  return peers < maxPeersIn;
}

/**
 * The offers the torrent's WebSocket trackers have out, not answered yet: each is a
 * WebRTC connection (bittorrent-tracker's `peers`, by offer id) kept until it is
 * answered or for 50 s.
 */
export function pendingOffers(torrent) {
  let n = 0;
  for (const tracker of torrent.discovery?.tracker?._trackers ?? []) n += Object.keys(tracker.peers ?? {}).length;
  return n;
}

/** The torrent's peers that are not web seeds, connected or connecting. */
export function peerCount(torrent) {
  let n = 0;
  for (const peer of torrent._peers?.values() ?? []) if (peer.type !== "webSeed" && !peer.destroyed) n += 1;
  return n;
}

/**
 * The torrent's request pass (`_update`) at most once per idle callback: the calls
 * made while one is waiting are that one (the pass reads the state when it runs, so
 * nothing is lost). Returns the counters {asked, passes} for the page and the bench.
 */
export function coalesceUpdates(torrent) {
  const counts = { asked: 0, passes: 0 };
  const pass = () => {
    pending = false;
    counts.passes += 1;
    torrent._updateWireWrapper();
  };
  let pending = false;
  const idle = globalThis.requestIdleCallback;
  torrent._update = () => {
    counts.asked += 1;
    if (pending || torrent.destroyed) return;
    pending = true;
    if (typeof idle === "function") idle(pass, { timeout: 250 });
    else queueMicrotask(pass);
  };
  return counts;
}

/**
 * Pieces `missing` in order of rarity (`availability[i]`: peers holding piece i),
 * ties in random order (pure but for `random`): a counting sort of a shuffle.
 */
export function rarityOrder(missing, availability, random = Math.random) {
  const pieces = missing.slice();
  for (let i = pieces.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [pieces[i], pieces[j]] = [pieces[j], pieces[i]];
  }
  let most = 0;
  for (const i of pieces) most = Math.max(most, availability[i] | 0);
  const buckets = Array.from({ length: most + 1 }, () => []);
  for (const i of pieces) buckets[Math.max(0, availability[i] | 0)].push(i);
  return buckets.flat();
}

/**
 * webtorrent's rarest-first pick over the pieces this reader lacks, walked in order.
 *
 * webtorrent calls `getRarestPiece(filter)` again with the same filter after each
 * piece it could not ask for (`filter` then refuses that piece), scanning every piece
 * each time. Here the first call with a filter orders the missing pieces by rarity
 * (rarityOrder) and each call walks on from where the last one stopped, once around:
 * a piece the filter refused on the way (webtorrent's speed ranker refuses the first
 * 10 a faster wire holds, then takes any) is looked at again after the end.
 * Pieces held are never offered (before, asked about for every pick: O(pieces²)).
 */
export function orderedRarestPick(torrent) {
  const rarity = torrent._rarityMap;
  if (typeof rarity?.getRarestPiece !== "function" || rarity.ordered) return;
  let current = null; // {filter, order, pos, wrapped}
  rarity.getRarestPiece = (filter) => {
    if (current?.filter !== filter) {
      const missing = [];
      for (let i = 0; i < rarity._numPieces; i++) if (!torrent.bitfield.get(i)) missing.push(i);
      current = { filter, order: rarityOrder(missing, rarity._pieces), pos: 0, wrapped: false };
    }
    const c = current;
    for (;;) {
      for (; c.pos < c.order.length; c.pos++) {
        const i = c.order[c.pos];
        if (torrent.bitfield.get(i) || (filter !== undefined && !filter(i))) continue;
        c.pos += 1; // the caller tries it: the next call starts after it
        return i;
      }
      if (c.wrapped) return -1;
      [c.pos, c.wrapped] = [0, true];
    }
  };
  rarity.ordered = true;
}

/**
 * Bound the reader's peers: the tracker is asked for offers (numwant) only while the
 * reader has fewer than `maxPeers`, and a peer offered or answering once it has
 * `maxPeersIn` is refused before its connection is made (as webtorrent refuses a
 * duplicate). An offer relayed by a WebSocket tracker from a peer already connected,
 * or while the reader has `maxPeersIn`, is dropped before webtorrent's tracker client
 * builds a connection for it (refuseOffers). The offers the reader has out and not
 * answered count as peers coming (pendingOffers). Returns the counters {refused,
 * offers_refused, offers (made)} for the page.
 */
export function boundPeers(torrent, maxPeers = MAX_PEERS, maxPeersIn = MAX_PEERS_IN) {
  const counts = { refused: 0, offers_refused: 0, offers: 0 };
  // the tracker clients exist once the torrent's discovery started (webtorrent starts
  // it just before 'ready'); an offer can only come after their socket opened
  if (torrent.discovery) refuseOffers(torrent, counts, maxPeersIn);
  else torrent.once?.("ready", () => refuseOffers(torrent, counts, maxPeersIn));
  // the offers still out count as peers coming: new ones only for what they leave
  // missing (webtorrent's tracker client makes 5 at every announce and keeps each
  // unanswered one 50 s, so a reader with few peers, at the 2 s announces of a busy
  // tracker, had up to 125 WebRTC connections open for offers nobody answered)
  const own = torrent._getAnnounceOpts;
  torrent._getAnnounceOpts = () => {
    const numwant = announceWant(peerCount(torrent) + pendingOffers(torrent), maxPeers);
    counts.offers += numwant;
    return { ...(own?.() ?? {}), numwant };
  };
  const addPeer = torrent.addPeer.bind(torrent);
  torrent.addPeer = (peer, source) => {
    if (typeof peer !== "string" && !roomForPeer(peerCount(torrent), maxPeersIn)) {
      counts.refused += 1;
      try {
        peer.destroy();
      } catch (err) {
        console.warn(`webtorrent: ${err?.message ?? err}`);
      }
      return false;
    }
    if (typeof peer === "string") return addPeer(peer, source);
    return detachedOnDestroy(torrent, peer, () => addPeer(peer, source));
  };
  return counts;
}

/** A peer id as the tracker protocol sends it (20 bytes as a latin-1 string) in hex,
 * as webtorrent keys its peers (pure). */
export function peerIdHex(binary) {
  let out = "";
  for (let k = 0; k < binary.length; k++) out += (binary.charCodeAt(k) & 0xff).toString(16).padStart(2, "0");
  return out;
}

/**
 * Drop the offers a WebSocket tracker relays to this reader that it would refuse
 * anyway: from a peer already connected or connecting (webtorrent's duplicate), or
 * while it has `maxPeersIn` peers (boundPeers' cap). The rest of the tracker's message
 * (interval, counts, an answer) is handled as before.
 *
 * Why: bittorrent-tracker's websocket client builds a peer (simple-peer: an
 * RTCPeerConnection, its ICE agent and the answer's SDP) for every offer relayed,
 * before webtorrent's addPeer drops a duplicate or boundPeers one past the cap: a
 * connection built and torn down on a page already at its peers, the CPU a crowd on
 * two cores has least of (bench/reader_swarm.py N = 20 at 2dbd9e3: 44 peers refused
 * at the cap after their connection was made).
 */
export function refuseOffers(torrent, counts, maxPeersIn = MAX_PEERS_IN) {
  for (const tracker of torrent.discovery?.tracker?._trackers ?? []) {
    if (typeof tracker._onAnnounceResponse !== "function" || tracker.offersRefused) continue;
    const own = tracker._onAnnounceResponse.bind(tracker);
    tracker._onAnnounceResponse = (data) => {
      if (data?.offer && typeof data.peer_id === "string" && !torrent.destroyed) {
        const known = torrent._peers?.has(peerIdHex(data.peer_id));
        if (known || !roomForPeer(peerCount(torrent), maxPeersIn)) {
          counts.offers_refused += 1;
          const { offer, offer_id, ...rest } = data; // eslint-disable-line no-unused-vars
          return own(rest);
        }
      }
      return own(data);
    };
    tracker.offersRefused = true;
  }
}

/**
 * Add WebRTC connection `conn` (`add()`: webtorrent's addPeer) so that its peer's
 * destroy takes webtorrent's 'connect' and 'error' listeners off the connection.
 *
 * Why: webtorrent (lib/peer.js createWebRTCPeer) waits for a connection's 'connect'
 * or 'error' with listeners that read `peer.conn`, and a peer destroyed meanwhile (no
 * connection within 25 s on a loaded host, the reader leaving the swarm) has set
 * `peer.conn` to null without removing them: a 'connect' or 'error' after that threw
 * "Cannot read properties of null (reading 'removeListener')" in the page (seen once
 * in bench/reader_swarm.py's N = 20 crowd).
 */
export function detachedOnDestroy(torrent, conn, add) {
  const events = ["connect", "error"];
  const listening = typeof conn?.listeners === "function";
  const before = listening ? events.map((ev) => new Set(conn.listeners(ev))) : [];
  const added = add();
  const peer = torrent._peers?.get(conn.id);
  if (!added || !listening || peer?.conn !== conn) return added;
  const theirs = events.flatMap((ev, k) => conn.listeners(ev).filter((f) => !before[k].has(f)).map((f) => [ev, f]));
  const destroy = peer.destroy.bind(peer);
  peer.destroy = (err) => {
    for (const [ev, f] of theirs) conn.removeListener(ev, f);
    return destroy(err);
  };
  return added;
}

/** A data-channel message made of several writes is at most this long (a block and
 * its header, with the small messages written beside them; far under the 64 KiB a
 * libdatachannel peer takes by default). */
export const MESSAGE_BYTES = 32 * 1024;

/** Writes (Uint8Arrays) joined into messages of at most `max` bytes, in order; a
 * write longer than `max` is a message of its own (pure). */
export function joinWrites(chunks, max = MESSAGE_BYTES) {
  const out = [];
  let run = [];
  let size = 0;
  const flush = () => {
    if (!run.length) return;
    if (run.length === 1) out.push(run[0]);
    else {
      const joined = new Uint8Array(size);
      let at = 0;
      for (const c of run) {
        joined.set(c, at);
        at += c.length;
      }
      out.push(joined);
    }
    run = [];
    size = 0;
  };
  for (const c of chunks) {
    if (size + c.length > max) flush();
    run.push(c);
    size += c.length;
  }
  flush();
  return out;
}

/**
 * The writes a WebRTC connection (simple-peer, a streamx Duplex) has queued go out
 * as one data-channel message (joinWrites), not one each: the wire protocol writes a
 * block's 13-byte header and its 16 KiB as two writes, and every message is its own
 * SCTP/DTLS/UDP packet train and its own event on the receiving page's main thread.
 * The byte stream is the same (the BitTorrent wire protocol does not see message
 * boundaries; webtorrent and libtorrent read data channels as streams).
 */
export function joinedSends(conn, counts = { writes: 0, messages: 0 }) {
  if (conn?.joinedSends || typeof conn?._write !== "function" || !conn._writableState) return false;
  const write = conn._write.bind(conn);
  // streamx's own _write: the first queued write and the rest of the queue to _writev
  conn._write = (data, cb) => conn._writableState.autoBatch(data, cb);
  conn._writev = (chunks, cb) => {
    const messages = joinWrites(chunks);
    counts.writes += chunks.length;
    counts.messages += messages.length;
    for (let i = 0; i < messages.length - 1; i++) write(messages[i], () => {});
    write(messages[messages.length - 1], cb);
  };
  conn.joinedSends = true;
  return true;
}

/** The connection (simple-peer) under a peer's wire, or null (a web seed's). */
export function connOf(torrent, wire) {
  for (const peer of torrent._peers?.values() ?? []) if (peer.wire === wire) return peer.conn ?? null;
  return null;
}
