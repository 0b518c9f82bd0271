// The swarm's pure rules (swarm.js): the upload cap for a link, when the web seeds
// (the origins) offer every piece or only what the peers lack, the fair-exit rule and
// a windowed rate. No clock, no network: callers pass `now` and what they saw (the
// tests drive them with explicit values in the page).

/**
 * The upload cap in bytes/s for the link the browser reports (pure; 0: none). On a
 * link it says is Wi-Fi or Ethernet (`navigator.connection.type`, Chrome on Android
 * and ChromeOS), without Data Saver, `unmetered_upload_limit_bytes_per_s` (none by
 * default): a phone on home Wi-Fi whose user lets it share can send far more than the
 * mobile profile's 256 KiB/s, and the crowd's readers need it (with 256 KiB/s the
 * origins sent 0.77-0.83 of N copies, bench/reader_swarm.py). Elsewhere (the type
 * unknown, as on iOS and desktops) `upload_limit_bytes_per_s`. Whether the reader
 * uploads at all is uploadAllowed()'s (the setting, and never on a metered link).
 */
export function uploadCapFor(cfg, connection) {
  const type = connection?.type;
  if ((type === "wifi" || type === "ethernet") && connection?.saveData !== true) {
    return cfg.unmetered_upload_limit_bytes_per_s ?? 0;
  }
  return cfg.upload_limit_bytes_per_s ?? 0;
}

/**
 * Whether the web seeds (the origins) offer every piece (true) or only the pieces no
 * connected peer can give (false) (pure; `now` in seconds). They offer every piece
 * from the first step: a reader in a swarm never waits for peers while the origins
 * have room. They hold back to what the peers lack once the peers deliver: over the
 * last `stallS` the peers sent at least `minPeerRate` bytes/s (`peerRate`, null before
 * a whole window), some connected peer holds a piece this reader lacks and a peer sent
 * a byte within `stallS`, after at least `holdS` and a whole window (`stallS`) of
 * every piece offered, so that the floor below is measured with every piece on
 * (measured over a window that held back too, it ratcheted down: N = 10, 20 MB, the
 * readers were left at 330 KB/s against 1 MB/s origin-only). They offer every piece again when
 * starved (no connected peer holds a piece this reader lacks) for `starvedS`, no byte
 * came from a peer for `stallS`, the peers' rate fell under `minPeerRate`, or the
 * reader's rate (peers and web seeds) fell under 0.9 x what the web seeds alone gave
 * it over the last window before they held back (`webSeedRate`): a reader is never
 * slower than the origins alone made it, the time it would have taken without peers.
 *
 * "Every piece" (true) is applied by swarm.js's offerWebSeedPieces as: the pieces no
 * connected peer holds while one of them is left unasked, then every piece, so that
 * webtorrent's picker asks the peers for theirs (it passes over a slow or new peer
 * for a piece a faster wire, the web seed, offers).
 *
 * Why: with every piece offered all along (d1aeb3f-0314641) each reader took from the
 * web seeds whatever they were fastest at, and the origins sent 0.77-0.83 of N copies
 * to a crowd of 10 (bench/reader_swarm.py); held back to what the peers lack, the
 * origins send the crowd each piece about once and the peers carry the rest. Off
 * altogether (removed, 03fe13b) a reader whose peers were slow waited for them (run 1:
 * 197 s against 26.7 s origin-only).
 */
export class WebSeedRule {
  constructor({ starvedS, stallS, holdS, minPeerRate = 0 }) {
    Object.assign(this, { starvedS, stallS, holdS, minPeerRate });
    this.on = true;
    this.since = null;
    this.starvedSince = null;
    this.floor = 0; // while held back: 0.9 x the web seeds' rate before, shared
    this.minRate = minPeerRate; // while held back: minPeerRate, shared
    this.starting = true; // the first window: the peers not judged yet
    this.widen = true; // on, and beyond the reader's own pieces no peer holds
    // why the web seeds are on: "start", "starved", "stalled", "slow_peers" (the peers
    // under the floor) or "slower" (slower than the web seeds alone); "held" while off
    this.why = "start";
  }

  /**
   * `leechers`: the downloading peers of the swarm this reader sees, itself included
   * (at least 1). The peers' floor (minPeerRate) and the web seeds' rate are shared
   * among them, as the desktop's rule shares the origins' rate (peer/sources.py
   * origins_share_bps): a rule every reader of a crowd follows alike is judged as if
   * all followed it. Against the whole rate, a crowd of 20 on a 2-core host, whose
   * peers gave each reader about 250 kB/s (20 MB in 80 s), stayed under the 256 KiB/s
   * floor and took what its peers held from the origins (bench/reader_swarm.py at
   * 2dbd9e3: readers 12-20 took 3.8-6.9 MB each of pieces a connected peer held).
   */
  step(now, { starved, lastPeerPayloadAt, peerRate = null, webSeedRate = null, leechers = 1 }) {
    this.since ??= now;
    if (starved) this.starvedSince ??= now;
    else this.starvedSince = null;
    const shared = Math.max(1, leechers);
    const starvedLong = this.starvedSince !== null && now - this.starvedSince >= this.starvedS;
    const stalled = now - lastPeerPayloadAt >= this.stallS;
    const minRate = this.on ? this.minPeerRate / shared : this.minRate;
    const delivering = peerRate !== null && peerRate >= minRate;
    const held = now - this.since >= Math.max(this.holdS, this.stallS);
    this.starting &&= !held;
    if (this.on && delivering && !starved && !stalled && held) {
      this.on = false;
      this.since = now;
      this.minRate = minRate;
      // a little under, so noise alone does not bring them back
      this.floor = ((webSeedRate ?? 0) * 0.9) / shared;
      this.why = "held";
    } else if (!this.on) {
      const slower = peerRate !== null && peerRate + (webSeedRate ?? 0) < this.floor;
      if (starvedLong || stalled || !delivering || slower) {
        this.on = true;
        this.since = now;
        this.why = starvedLong ? "starved" : stalled ? "stalled" : !delivering ? "slow_peers" : "slower";
      }
    }
    // `widen`: in the first window, while connected peers hold pieces the reader
    // lacks, its web seeds take only its own pieces no peer holds (ownsPiece), not the
    // others' nor the peers' pieces: a reader joining a crowd that holds the issue
    // took 1.6-5.2 MB from the origins in its first window (bench/reader_swarm.py
    // N = 10 at 43e5b73, readers 2-10). Starved, stalled, or once the peers are
    // judged (after the window), as `on`
    this.widen = this.on && (!this.starting || starved || stalled);
    return this.on;
  }
}

const idHashes = new Map(); // peer id -> fnv1a (peer ids come from the network: bounded)

/** The 32-bit FNV-1a hash of a string (pure; remembered for up to 1024 ids). */
function fnv1a(text) {
  const known = idHashes.get(text);
  if (known !== undefined) return known;
  let h = 0x811c9dc5;
  for (let k = 0; k < text.length; k++) h = Math.imul(h ^ text.charCodeAt(k), 0x01000193);
  if (idHashes.size >= 1024) idHashes.clear();
  idHashes.set(text, h >>> 0);
  return h >>> 0;
}

/** A peer's weight for piece `index` (pure): its id's hash mixed with the index. */
function pieceWeight(idHash, index) {
  let h = (idHash ^ Math.imul(index + 1, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** The reader's (WebTorrent's) peer id prefix, "-WW", as webtorrent's hex peer ids
 * begin: readers follow the same piece owners; a desktop peer (libtorrent, "-PR")
 * fills from the origins by its own rule. */
export const READER_PEER_ID_HEX = "2d5757";
/** A desktop peer's (pressrun's libtorrent, "-PR") peer id prefix, in hex. */
export const DESKTOP_PEER_ID_HEX = "2d5052";

/**
 * Whether this reader (`selfId`) is the one of `ids` (itself and the connected
 * readers that lack piece `index` too) that takes the piece from the web seeds while
 * no peer holds it (pure): the highest weight (rendezvous hashing of the peer ids and
 * the piece), ties to the smaller id. Every reader computes the same from the same
 * ids, so a piece the swarm lacks enters it once, from one reader, and the others
 * take it from that reader.
 *
 * Why: each reader took every piece no connected peer held from the web seeds, and
 * the readers of a crowd took the same pieces at the same time: at N = 10 (bench/
 * reader_swarm.py, 2dbd9e3) the readers' 52.2 MB from the origins were 51 MB of pieces
 * no connected peer held, 2.6 copies of the issue, where one enters the swarm.
 */
export function ownsPiece(selfId, ids, index) {
  const mine = pieceWeight(fnv1a(selfId), index);
  for (const id of ids) {
    if (id === selfId) continue;
    const theirs = pieceWeight(fnv1a(id), index);
    if (theirs > mine || (theirs === mine && id < selfId)) return false;
  }
  return true;
}

/**
 * The fair-exit rule for a reader that finished (pure; seconds): "ratio" once it
 * uploaded share_ratio x what it downloaded and no connected peer still wants a piece
 * from it (`needed`: a peer interested in it, or with a request not answered yet),
 * "max_seed_time" after max_seed_time_s of seeding (whoever still wants pieces),
 * "metered" when uploading is not allowed (a metered network or the setting off);
 * null: stay.
 *
 * Why `needed`: the upload count is what was handed to the peers' data channels, not
 * what reached them, and a peer mid-download may have no other source. A reader that
 * left the moment its count reached its download cut off the only reader that needed
 * it: on a loaded CI host, B had 16 of 24 pieces when A (which had counted all 24 as
 * sent) left, and B fell back to origins that were down (tests/reader/
 * test_swarm_browser.py, the share-ratio test: 8 of 10 runs failed before).
 */
export function leaveRule({ now, seedingSince, uploaded, downloaded, allowed, ratio, maxSeedS, needed = false }) {
  if (!allowed) return "metered";
  if (uploaded >= ratio * downloaded && !needed) return "ratio";
  if (maxSeedS != null && now - seedingSince >= maxSeedS) return "max_seed_time";
  return null;
}

/** Bytes/s over the last `windowS` from (time, total) samples (pure; `samples` is
 * appended to and trimmed to one window); null before a whole window. */
export function windowRate(samples, now, total, windowS) {
  samples.push([now, total]);
  while (samples.length > 2 && now - samples[1][0] >= windowS) samples.shift();
  const [t0, b0] = samples[0];
  return now - t0 >= windowS ? (total - b0) / (now - t0) : null;
}

/** How a peer's answer time is followed (answerTime): each gap pulls it up at once and
 * lets it down by a tenth of the difference, so one slow answer is remembered for a
 * while. A silence longer than ANSWER_FACTOR x that time is unusual for this peer. */
const ANSWER_FACTOR = 3;
const ANSWER_DECAY = 0.1;
/** webtorrent's own request timeout: no peer is given longer than this. */
export const MAX_REQUEST_TIMEOUT_S = 30;

/**
 * A peer's answer time after an answer that came `gapS` after the reader asked (or
 * after the answer before, requests pending all along): the slowest answer seen,
 * let down slowly (pure; seconds; `prevS` null before the first).
 */
export function answerTime(prevS, gapS) {
  if (prevS === null || prevS === undefined || gapS >= prevS) return gapS;
  return prevS - ANSWER_DECAY * (prevS - gapS);
}

/**
 * What to do about a peer that holds requests of this reader and has sent nothing
 * for `silentS` (pure; seconds): "wait", "reask" (its requests are asked again, of
 * whoever has the blocks), or "disconnect".
 *
 * - The time it is given is `baseS` (request_timeout_s) or ANSWER_FACTOR x its own
 *   answer time (`answerS`, null before its first answer), whichever is longer, at
 *   most MAX_REQUEST_TIMEOUT_S: asked again once silent that long, disconnected
 *   once silent three times that long in all (the re-ask, then twice the time).
 * - `silentS` is counted in the reader's own running time (swarm.js adds at most a
 *   second per tick): a page the host left without CPU for 5 s did not see its peers
 *   silent for 5 s.
 * - Disconnected only when, since the re-ask, another source sent this reader bytes
 *   (`othersDelivered`): when nothing came from anybody, the host, the link or the
 *   reader itself is the cause, not this peer, and it is kept.
 *
 * Why: the fixed rule (asked again after 3 s, disconnected after 3 s more) had the
 * readers of a crowd of 20 on a loaded 2-core host (load 29) disconnect each other
 * ("peer ... answers no request: disconnected", bench/reader_swarm.py at d9c712a): a
 * peer serving a dozen others on a saturated CPU answers in seconds, not in 3 s.
 */
export function silentPeerStep({ silentS, answerS = null, baseS, reasked, othersDelivered }) {
  const timeoutS = Math.min(MAX_REQUEST_TIMEOUT_S, Math.max(baseS, ANSWER_FACTOR * (answerS ?? 0)));
  if (!reasked) return silentS >= timeoutS ? "reask" : "wait";
  if (silentS < 3 * timeoutS) return "wait";
  return othersDelivered ? "disconnect" : "wait";
}
