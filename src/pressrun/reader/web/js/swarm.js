// The reader as a swarm peer (issue 26, docs/reader.md "Peers"): when the balancer's
// directive says "swarm", the issue's pieces come from other readers and desktop
// peers over WebRTC (npm webtorrent, the BitTorrent wire protocol on data channels,
// signalled through the tracker's /webtorrent WebSocket), with the origins kept as
// web seeds in the same client for the pieces no peer has.
//
// - The torrent comes from an origin and is checked against the signed manifest's
//   info-hash before anything else (torrent.js).
// - Every piece webtorrent accepts (its SHA-1 from that torrent) is checked again
//   against the manifest's SHA-256 in this store's put(), then decrypted (encrypted
//   issues) and written to the OPFS store (store.js) beside the origin path's pieces:
//   a download moves between the two and resumes with what either stored.
// - A piece that fails webtorrent's SHA-1 names the peers that sent its blocks: one
//   that sent it alone is banned (its connection destroyed, its peer id refused from
//   then on); one of several senders gets a strike, and two strikes ban it.
// - Pieces are picked rarest first (webtorrent's default is in order: readers of a
//   flash crowd then all took the same first pieces from the origins and had nothing
//   to trade), so the readers of a crowd hold different pieces from the start.
// - Web seeds (the origins): whatever the peers cannot give comes from them. They are
//   in from the start with every piece (nothing waits for a peer while the origins
//   have room; "every piece": what no peer holds first, the rest once those are all
//   asked, offerWebSeedPieces); once the peers deliver (WebSeedRule) they offer only
//   the pieces no connected peer holds, so the origins send each reader what the
//   swarm lacks and the peers the rest; every piece again when the peers are slow,
//   stalled or starved.
// - No peer and no byte from a web seed within connect_timeout_s (the web seeds named
//   are all down), or no piece verified or stored for stall_timeout_s while no write
//   is in flight: NoPeers / SwarmStalled,
//   and download.js goes on from the origins as before.
// - Uploads: a peer's request is served only while uploadAllowed() (the setting on,
//   and the network not metered), from the stored pieces (encrypted again for an
//   encrypted issue: the same ciphertext, checked against the manifest before it
//   goes), capped by uploadCapFor (the link: Wi-Fi or Ethernet, or unknown). After the
//   download the reader stays in the swarm while the page is open,
//   until the fair-exit rule lets it go (uploaded >= share_ratio x downloaded and no
//   connected peer still wants a piece from it), or it has seeded max_seed_time_s, or
//   uploading is no longer allowed.
// - Ciphertext only (`download.prefetch`, prefetch.js, issue 35): before an embargoed
//   issue's release the reader joins the prefetchers' swarm with no key. Pieces are
//   checked against the manifest's SHA-256 (the manifest hashes the ciphertext) and
//   kept as they came, through `download.pieceStore` (the prefetch folder) and
//   `download.storeRun`; peers are served the same bytes. No web seed (the origins
//   only through the balancer's paced grant, prefetch.js), no connect or stall
//   timeout (a prefetcher may be alone for a while): it stays until stopped.

import { mixIn } from "./mixin.js";
import { answerTime, leaveRule, silentPeerStep, uploadCapFor, WebSeedRule, windowRate } from "./swarm-rules.js";
import { StoredPieces } from "./store.js";
import { emptyByteTally, hotswapPeers, SwarmBytes } from "./swarm-bytes.js";
import { SwarmPeers } from "./swarm-peers.js";
import { SwarmStatus } from "./swarm-status.js";
import { SwarmPieceStore } from "./swarm-store.js";
import { SwarmWebSeeds } from "./swarm-web-seeds.js";
import { boundPeers, coalesceUpdates, connOf, joinedSends, MAX_PEERS, MAX_PEERS_IN, orderedRarestPick } from "./swarm-load.js";
import { fetchCheckedTorrent } from "./torrent.js";

// the pure rules, for the page's tests and the bench, from here as before
export { answerTime, leaveRule, silentPeerStep, uploadCapFor, WebSeedRule, windowRate };

/** No peer connected in time: download from the origins instead. */
export class NoPeers extends Error {}
/** The swarm stopped delivering (or its torrent is unusable): origins instead. */
export class SwarmStalled extends Error {}

const TAG_BYTES = 16;
const TICK_MS = 250;

let client = null;
/** issue id -> the SwarmFetch in the swarm (downloading or seeding) */
const sessions = new Map();

/** The page's one WebTorrent client; webtorrent (223 KB) is loaded the first time a
 * download joins a swarm, not when the app starts. */
async function swarmClient(cfg) {
  const { default: WebTorrent } = await import("webtorrent");
  if (client === null || client.destroyed) {
    client = new WebTorrent({
      dht: false,
      lsd: false,
      utPex: false,
      natUpnp: false,
      natPmp: false,
      webSeeds: false, // the torrent's url-list is not used: web seeds come and go by the rule below
      tracker: { rtcConfig: { iceServers: cfg.ice_servers ?? [] } },
    });
    client.uploadCap = undefined;
    client.on("error", (err) => console.warn(`webtorrent: ${err?.message ?? err}`));
  }
  applyUploadCap(client, cfg);
  return client;
}

/** Set the client's upload throttle from the link now (the link may change). */
function applyUploadCap(wt, cfg) {
  const cap = uploadCapFor(cfg, globalThis.navigator?.connection);
  if (cap === wt.uploadCap) return;
  wt.uploadCap = cap;
  wt.throttleUpload(cap > 0 ? cap : -1);
}

const nowS = () => performance.now() / 1000;

/** Piece `index` of the bitfield webtorrent keeps (most significant bit first). */
function bitfieldOf(state) {
  const bytes = new Uint8Array(Math.ceil(state.length / 8));
  for (let i = 0; i < state.length; i++) if (state[i] === 2) bytes[i >> 3] |= 128 >> (i & 7);
  return bytes;
}

export class SwarmFetch {
  /**
   * download: the Download (issue, manifest, piece states, storeRun, notice);
   * swarm: the directive's swarm object; cfg: config.json's "swarm";
   * uploadAllowed(): whether a peer may be sent a piece now.
   */
  constructor({ download, swarm, cfg, uploadAllowed, onChange = () => {} }) {
    this.download = download;
    this.issueId = download.issueId;
    this.m = download.m;
    this.swarm = swarm;
    this.cfg = cfg;
    this.uploadAllowed = uploadAllowed;
    this.onChange = onChange;
    this.encrypt = download.opener?.encryptPiece ?? null;
    this.decrypt = download.decrypt;
    const plainPiece = this.m.piece_size_bytes - (this.encrypt === null ? 0 : TAG_BYTES);
    this.prefetch = download.prefetch === true; // ciphertext only, before the release
    this.stored = download.pieceStore ?? new StoredPieces(this.issueId, plainPiece);
    this.pending = new Map(); // index -> {kept, resolve, reject}: verified, being written
    this.writing = false;
    this.cache = new Map(); // index -> the piece as sent (LRU)
    this.reading = new Map(); // index -> the promise of its read for a peer, while it runs
    this.contributors = new Map(); // index -> Map(wire -> bytes of it sent), until it is verified or failed
    this.strikes = new Map(); // peer id -> strikes
    this.banned = new Set(); // peer ids
    this.bans = []; // [{peer, piece}] for the page and the tests
    this.peersSeen = new Set();
    this.fromPeers = 0; // bytes of pieces stored, sent by peers
    this.fromWebSeeds = 0; // bytes of pieces stored, sent by the origins as web seeds
    // ... by why the piece was offered to them and the web-seed rule's state then
    // (offerWebSeedPieces' offerTags): which rule sends a reader's bytes to the origins
    this.webSeedBytesByOffer = {};
    this.webSeedBytesByRule = {};
    this.receivedFromPeers = 0; // every byte peers sent (refused pieces too)
    this.receivedFromWebSeeds = 0; // every byte the web seeds sent
    this.uploaded = 0;
    this.badPieces = 0;
    this.reasked = 0; // requests asked again of a peer that left them unanswered
    this.verifiedCount = 0; // pieces that passed both checks here (stored, or waiting for their write)
    this.tally = emptyByteTally(); // every byte the wires delivered, needed or wasted (swarm-bytes.js)
    this.webSeedsOn = false; // the web seeds are in the swarm
    this.webSeedsAll = true; // ... offering every piece (false: what no peer can give)
    this.deadWebSeeds = new Set(); // web seed URLs that failed a request: not used again here
    this.state = "joining"; // joining | downloading | seeding | left
    this.leaveRule = null;
    this.torrent = null;
    this.writer = Promise.resolve();
  }

  // -- its readout (swarm-status.js), the store webtorrent reads and writes
  // (swarm-store.js), the peers (swarm-peers.js), the web seeds (swarm-web-seeds.js)
  // and the byte accounting (swarm-bytes.js): their methods are put on this class below

  // -- the run

  /** Download what is not stored yet through the swarm; NoPeers / SwarmStalled when
   * the origins should take over (the pieces stored so far stay). */
  async run() {
    const d = this.download;
    const signal = d.signal;
    let torrentBytes;
    // a slow answer (a timeout, a dropped connection) is asked again, each ask with the
    // balancer timeout, until stall_timeout_s: at a crowd's start the origins are
    // busiest, and one 5 s ask sent the last 5 of 20 readers of bench/reader_swarm.py
    // to the origin path for the whole issue ("the issue's torrent is unusable (signal
    // timed out)"). A torrent that is refused (an HTTP error, another info-hash) is
    // not asked again.
    const askUntil = nowS() + Math.max(this.cfg.stall_timeout_s ?? 0, this.download.cfg.balancer_timeout_s);
    for (;;) {
      try {
        const timeout = AbortSignal.timeout(this.download.cfg.balancer_timeout_s * 1000);
        ({ torrent: torrentBytes } = await fetchCheckedTorrent(
          this.swarm.torrent_url,
          this.m,
          this.swarm.webtorrent_url,
          AbortSignal.any([signal, timeout]),
        ));
        break;
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        const slow = err?.name === "TimeoutError" || err?.name === "AbortError" || err instanceof TypeError;
        if (!slow || nowS() >= askUntil) throw new SwarmStalled(`the issue's torrent is unusable (${err.message})`);
        this.download.notice(`the issue's torrent did not come (${err.message}): asked again`);
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    let wt;
    try {
      wt = await swarmClient(this.cfg);
    } catch (err) {
      throw new SwarmStalled(`webtorrent did not load (${err.message})`);
    }
    await this.stored.load();
    sessions.get(this.issueId)?.leave("user");
    sessions.set(this.issueId, this);
    const torrent = (this.torrent = wt.add(torrentBytes, {
      store: this.storeClass(),
      storeCacheSlots: 0, // the pieces are read from OPFS, through the upload check
      bitfield: bitfieldOf(d.state),
      maxWebConns: 8, // pieces in flight per web seed (webtorrent: 4; 2 left the web seeds slower than the origin path)
      // rarest first (webtorrent: in order): the readers of a crowd, all asking the
      // origins for the first pieces first, held the same pieces and had little to trade
      strategy: "rarest",
    }));
    // the CPU a crowd costs (swarm-load.js): one request pass per idle callback, and
    // at most MAX_PEERS looked for, MAX_PEERS_IN taken
    this.updates = coalesceUpdates(torrent);
    this.sends = { writes: 0, messages: 0 }; // the peers' writes and the messages they went in
    this.peerBound = boundPeers(torrent, MAX_PEERS, MAX_PEERS_IN);
    this.askNoSilentPeer(torrent); // a peer silent past its timeout is asked for nothing (swarm-peers.js)
    let fail;
    const failed = new Promise((_, reject) => (fail = reject));
    failed.catch(() => {});
    torrent.on("wire", (wire) => {
      // a peer's queued writes go out as one data-channel message (swarm-load.js)
      if (wire.type !== "webSeed") joinedSends(connOf(torrent, wire), this.sends);
      this.onWire(wire);
    });
    // webtorrent's hotswap, kept to peers and with a cancel to the slow one (swarm-bytes.js)
    torrent._hotswap = (wire, index) => hotswapPeers(torrent, wire, index);
    torrent.on("hotswap", (slow, fast, index) => this.onHotswap(slow, fast, index));
    torrent.on("warning", (err) => this.onWarning(err));
    torrent.on("error", (err) => fail(this.storeError ?? new SwarmStalled(this.failure ?? `webtorrent: ${err?.message ?? err}`)));
    const onAbort = () => fail(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    const started = nowS();
    try {
      // 1. the web seeds (the origins) at once, when the directive names usable ones:
      // whatever the peers cannot give yet comes from them, so nothing waits for a
      // peer; with none usable, a peer within connect_timeout_s, or the origins as before
      const rule = new WebSeedRule({
        starvedS: this.cfg.web_seed_starved_s,
        stallS: this.cfg.web_seed_stall_s,
        holdS: this.cfg.web_seed_hold_s,
        minPeerRate: this.cfg.web_seed_min_peer_rate_bytes_per_s ?? 0,
      });
      // web seeds are added once the torrent is parsed (a web seed's connection needs
      // its info-hash and piece length)
      const ready = new Promise((resolve) => (torrent.ready ? resolve() : torrent.once("ready", resolve)));
      await Promise.race([ready, failed]);
      orderedRarestPick(torrent);
      if (this.prefetch) {
        await this.prefetchRun(torrent, failed);
        return;
      }
      this.lastPeerPayloadAt = nowS();
      this.webSeedsAll = rule.step(nowS(), { starved: true, lastPeerPayloadAt: this.lastPeerPayloadAt });
      this.setWebSeeds(true);
      if (!this.webSeedsOn) {
        const connected = new Promise((resolve) => {
          this.firstPeer = resolve;
          if (this.peersSeen.size) resolve();
        });
        let timer;
        const timeout = new Promise((resolve) => (timer = setTimeout(resolve, this.cfg.connect_timeout_s * 1000, "timeout")));
        const first = await Promise.race([connected, timeout, failed]);
        clearTimeout(timer);
        if (first === "timeout") {
          throw new NoPeers(`no peer connected within ${this.cfg.connect_timeout_s} s`);
        }
        d.notice(`joined the swarm: ${this.peersSeen.size} peer(s) connected`);
      } else {
        d.notice("joined the swarm: the origins as web seeds beside the peers");
      }
      this.state = "downloading";
      this.onChange();
      // 2. pieces from peers and web seeds by the rule, until done or stalled
      this.lastPeerPayloadAt = nowS();
      const samples = [[nowS(), this.receivedFromPeers]]; // (time, bytes from peers), one window
      const seedSamples = [[nowS(), this.receivedFromWebSeeds]]; // the same, web seeds
      // the swarm's progress: pieces stored, and pieces verified that wait for their
      // write (a write in flight is the device's time, not the swarm's): see below
      let storedAt = nowS();
      let progress = d.storedCount + this.verifiedCount;
      while (!torrent.done) {
        await Promise.race([new Promise((r) => setTimeout(r, TICK_MS)), failed]);
        if (torrent.done) break;
        const now = nowS();
        if (d.storedCount + this.verifiedCount !== progress || this.writing) {
          // Before, only a stored piece counted: on a host with both cores busy the
          // OPFS writes of a reader of bench/reader_swarm.py's crowd fell 15 s behind
          // while its peers had sent 18 MB of verified pieces; it left the swarm, the
          // pieces waiting were dropped, and the origin path fetched all 20 MB again
          // (tests/reader/test_swarm_browser_bytes.py, the slow store)
          [progress, storedAt] = [d.storedCount + this.verifiedCount, now];
        }
        if (!this.peersSeen.size && this.receivedFromWebSeeds === 0 && now - started >= this.cfg.connect_timeout_s && !this.webSeedsAlive()) {
          // the web seeds named are all down (each failed a request) and no peer came.
          // A web seed that has not failed is slow, not down: the reader stays (the
          // stall timeout bounds it). Before, one whose first piece took longer than
          // connect_timeout_s sent the reader to the origin path (tests/reader/
          // test_swarm_browser.py, the slow web seed test); at a crowd's start on a
          // loaded host, the likely way 13 of 20 readers of bench/reader_swarm.py left
          // the swarm with every byte from the origins (issue 26)
          throw new NoPeers(`no peer connected within ${this.cfg.connect_timeout_s} s and every web seed failed`);
        }
        if (now - storedAt >= this.cfg.stall_timeout_s) {
          throw new SwarmStalled(`no piece came through the swarm for ${this.cfg.stall_timeout_s} s`);
        }
        if (d.hooks.networkAllowed !== undefined && !(await d.hooks.networkAllowed())) {
          // Wi-Fi only, and the link turned cellular: the origin path waits for Wi-Fi
          throw new SwarmStalled("the link is cellular and Wi-Fi only is on");
        }
        this.applyChoking();
        this.reaskSilentPeers(now);
        const windowS = this.cfg.web_seed_stall_s;
        const peerRate = windowRate(samples, now, this.receivedFromPeers, windowS);
        this.peerRate = peerRate;
        const webSeedRate = windowRate(seedSamples, now, this.receivedFromWebSeeds, windowS);
        this.webSeedRate = webSeedRate;
        const starved = this.starved();
        const leechers = this.leechers();
        this.webSeedsAll = rule.step(now, { starved, lastPeerPayloadAt: this.lastPeerPayloadAt, peerRate, webSeedRate, leechers });
        this.webSeedRuleState = rule.why;
        if (this.webSeedsOn) this.offerWebSeedPieces(this.webSeedsAll && rule.widen, now);
        applyUploadCap(wt, this.cfg);
        this.onChange();
      }
      this.setWebSeeds(false);
      d.notice(
        `through the swarm in ${(nowS() - started).toFixed(1)} s: ${this.fromPeers} bytes from peers, ` +
          `${this.fromWebSeeds} from origins as web seeds`,
      );
    } catch (err) {
      this.leave(err instanceof NoPeers ? "no_peers" : "user");
      await this.writer; // nothing of the swarm is written once the origins take over
      throw err;
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.firstPeer = null;
    }
    this.state = "seeding";
    this.seedingSince = nowS();
    this.onChange();
  }

  /** Ciphertext only (prefetch.js): the peers' pieces until the torrent is done, then
   * seeding until the prefetch leaves (the release, or the page's end). No web seed,
   * no timeout: the origins' share comes through prefetch.js's paced grant. */
  async prefetchRun(torrent, failed) {
    this.download.notice("joined the prefetchers' swarm: the ciphertext from peers beside the origins' paced grant");
    this.state = "downloading";
    this.onChange();
    while (!torrent.done && this.state !== "left") {
      await Promise.race([new Promise((r) => setTimeout(r, TICK_MS)), failed]);
      if (!this.uploadAllowed()) {
        // the link turned metered (or sharing was turned off): this swarm is for
        // trading, so the reader leaves it; prefetch.js's origin loop goes on under
        // the Wi-Fi only rule and joins again at a renewal where it may upload
        this.download.notice("left the prefetchers' swarm: uploading is not allowed on this link now");
        this.leave("metered");
        return;
      }
      this.reaskSilentPeers(nowS());
      applyUploadCap(client, this.cfg);
      this.onChange();
    }
    if (this.state === "left") return;
    this.state = "seeding";
    this.seedingSince = nowS();
    this.onChange();
  }

  /** Stay in the swarm (the page open) until the fair-exit rule lets the reader go. */
  async seed(downloaded) {
    while (this.state === "seeding") {
      const rule = leaveRule({
        now: nowS(),
        seedingSince: this.seedingSince,
        uploaded: this.uploaded,
        downloaded,
        allowed: this.uploadAllowed(),
        ratio: this.cfg.share_ratio,
        maxSeedS: this.cfg.max_seed_time_s,
        needed: this.wanted(),
      });
      if (rule !== null) {
        this.download.notice(`leaving the swarm (${rule}): uploaded ${this.uploaded} bytes, downloaded ${downloaded}`);
        this.leave(rule);
        break;
      }
      this.onChange();
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  /** Whether a connected peer still wants pieces from this reader: it says it is
   * interested (it lacks a piece this reader holds), or it has asked for a block not
   * answered yet. A peer stops being interested once it holds what this one has. */
  wanted() {
    return (this.torrent?.wires ?? []).some(
      (w) => w.type !== "webSeed" && !w.destroyed && (w.peerInterested || w.peerRequests?.length > 0),
    );
  }

  /** Leave the swarm now (the tracker is told "stopped"). */
  leave(rule) {
    if (this.state === "left") return;
    this.state = "left";
    this.leaveRule = rule;
    if (sessions.get(this.issueId) === this) sessions.delete(this.issueId);
    try {
      this.torrent?.destroy();
    } catch (err) {
      console.warn(`webtorrent: ${err?.message ?? err}`);
    }
    for (const [, p] of this.pending) p.reject(new Error("left the swarm"));
    this.pending.clear();
    this.onChange();
  }
}

// the readout's, the store's, the peers', the web seeds' and the byte accounting's
// methods, in their own modules, are SwarmFetch's
mixIn(SwarmFetch, SwarmStatus, SwarmPieceStore, SwarmPeers, SwarmWebSeeds, SwarmBytes);

/** The swarm sessions by issue (downloading or seeding), for the page and the tests. */
export function swarmSessions() {
  return sessions;
}

/** Leave the swarm of an issue (the issue is paused or deleted). */
export function leaveSwarm(issueId, rule = "user") {
  sessions.get(issueId)?.leave(rule);
}
