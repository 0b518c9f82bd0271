// The reader's background prefetch of an embargoed issue (issue 35; the desktop's
// `pressrun get --prefetch` does the same, docs/client.md "Prefetch").
//
// An issue published with `--encrypt --release-at` travels before its release: only
// its key is held back (the subscription service answers 403 "embargoed" with the
// seconds left). While the download waits for the release (subscription.js's
// prepareDecryption), this module fetches the issue's ciphertext in the background:
//
// 1. it starts on the first embargo answer (so a reader who is not a subscriber, or
//    whose wrap is missing, fetches nothing) and only with room on the device (the
//    ciphertext and then the plaintext: twice the issue's size, by the browser's
//    quota);
// 2. it asks the balancer for a prefetch grant (GET /v1/issues/<id>/prefetch?client=,
//    docs/protocols.md): a rate and the origins; a 429 is "no room now, ask again in
//    retry_after_s"; a grant is renewed every renew_s and may be cut (readers first);
// 3. it fetches one piece at a time (HTTP Range, fetch priority "low"), at most at the
//    granted rate averaged over the download (the desktop's PrefetchPace: a piece
//    starts once the pieces before it would have taken their bytes at the rate; no
//    burst builds while idle), each checked against the manifest's SHA-256 and kept
//    as it came (ciphertext) in the origin private file system under
//    prefetch/<issue>.<sha256[:16]>/p<index>, written under a t-name and renamed when
//    whole, so a page closed mid-write leaves no short piece;
// 4. it keeps to the app's network rule: no byte on a cellular link while "Wi-Fi
//    only" is on (the app's waitForNetwork, before each piece);
// 5. at the release (prepareDecryption returns the key), the prefetch stops, every
//    stored ciphertext piece is decrypted with the key and written into the issue's
//    own storage (store.js's runs) and the prefetch folder is removed; the download
//    then finds those pieces stored and fetches only what is missing (nothing, when
//    the prefetch finished). So at the release the reader moves one wrap, not the
//    issue.
//
// 6. the prefetchers' swarm: when the grant names it (`swarm`: the torrent and the
//    tracker's WebSocket, docs/protocols.md) and the reader may upload (the app's
//    rule: the setting, and never on a metered link), the reader joins it as a
//    ciphertext-only peer (swarm.js's prefetch mode): desktop prefetchers
//    (`pressrun get --prefetch`, libtorrent with WebRTC) and other readers send it
//    pieces, checked against the manifest like the origins' and kept in the same
//    folder, and it serves them what it holds. The origins are then asked only for a
//    piece no connected peer holds (nextOriginPiece, as the desktop's
//    next_origin_piece), or the least held one after PEER_PATIENCE_S without a byte
//    from the peers, still at the granted pace; a deferred grant (429) stops only the
//    origins, not the peers. The reader seeds what it has until the release.
//
// A page closed before the release keeps what it fetched and the issue's id in the
// "prefetching" setting; when the app opens again it starts those downloads
// (unfinishedPrefetches(), app.js's resumeUnfinished), whose prefetch goes on from the
// stored pieces; a new version (another SHA-256) starts over. Deleting the issue
// forgets its prefetch (forgetPrefetch()), as does a refusal at the release (no
// longer a subscriber, withdrawn): the ciphertext is of no use then.
//
// window.pressrun.prefetch() gives each issue's prefetch status (app.js), for the
// tests: state, pieces stored, bytes by origin, grants, deferrals, the last rate.
//
// Its pure rules (the origins' pick beside the swarm, a grant's fields) are in
// prefetch-rules.js, the ciphertext's storage (the OPFS folder, the adoption at the
// release) in prefetch-store.js; what this module exported of them it still does.

import { getSetting, putSetting } from "./db.js";
import { checkAnswer } from "./download.js";
import { pieceOk, pieceSpan } from "./manifest.js";
import { nextOriginPiece, seconds, swarmOf } from "./prefetch-rules.js";
import { adoptPrefetched, folder, folderName, keepPiece, removeFolders, storedCiphertext } from "./prefetch-store.js";
import { storageEstimate } from "./store.js";
import { SwarmFetch } from "./swarm.js";

export { nextOriginPiece, PEER_PATIENCE_S } from "./prefetch-rules.js";
export { adoptPrefetched } from "./prefetch-store.js";

/** How often the origin loop looks again while the peers bring the pieces (ms). */
const LOOK_MS = 250;

const statuses = new Map(); // issue id -> its status (prefetchStatus())

/** Each issue's prefetch: {state, stored_pieces, num_pieces, bytes_by_origin, ...}. */
export function prefetchStatus() {
  return Object.fromEntries([...statuses].map(([id, s]) => [id, { ...s, bytes_by_origin: { ...s.bytes_by_origin } }]));
}

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
  });

// -- the prefetch

/** Issue ids whose prefetch has not reached its release (the "prefetching" setting). */
export async function unfinishedPrefetches() {
  const ids = await getSetting("prefetching", []);
  return Array.isArray(ids) ? ids.filter((id) => typeof id === "string") : [];
}

async function markPrefetching(issueId, on) {
  const ids = (await unfinishedPrefetches()).filter((id) => id !== issueId);
  if (on) ids.push(issueId);
  await putSetting("prefetching", ids);
}

/** Forget an issue's prefetch: its stored ciphertext and its place in the list. */
export async function forgetPrefetch(issueId) {
  statuses.delete(issueId);
  await removeFolders(issueId);
  await markPrefetching(issueId, false);
}

/** A random id the balancer counts this reader's prefetches by (kept per device). */
async function clientId() {
  let id = await getSetting("prefetch_client", null);
  if (typeof id !== "string") {
    id = Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
    await putSetting("prefetch_client", id);
  }
  return id;
}

class Prefetch {
  /** m: the verified manifest; config: config.json; rules: withPrefetch's. */
  constructor(m, config, rules) {
    this.m = m;
    this.config = config;
    this.rules = rules;
    this.controller = new AbortController();
    this.balancerIndex = 0;
    this.swarm = null; // the prefetchers' swarm (swarm.js, ciphertext only), when joined
    this.held = new Set();
    this.status = {
      state: "starting",
      num_pieces: m.piece_sha256.length,
      stored_pieces: 0,
      size_bytes: m.size_bytes,
      bytes_by_origin: {},
      bytes_from_peers: 0,
      swarm: null,
      grants: 0,
      deferrals: 0,
      rate_bytes_per_s: 0,
      started_at: Date.now(),
      finished_at: null,
      error: null,
    };
    statuses.set(m.issue_id, this.status);
  }

  note(text) {
    this.rules.note?.(`prefetch: ${text}`);
  }

  /** Run in the background until done or stopped; never throws. */
  start(signal) {
    const stop = signal === null ? this.controller.signal : AbortSignal.any([signal, this.controller.signal]);
    this.done = this.run(stop).catch((err) => {
      this.swarm?.leave("user");
      if (stop.aborted) {
        if (this.status.state !== "done") this.status.state = "stopped";
        return;
      }
      this.status.state = "failed";
      this.status.error = String(err?.message ?? err);
      this.note(`stopped: ${this.status.error}; the rest comes at the release`);
    });
  }

  /** Stop (the release came, or the download ended) and wait for it to let go. */
  async stop() {
    this.controller.abort(new DOMException("the release came", "AbortError"));
    await this.done;
    this.swarm?.leave("release"); // a done prefetch seeds until now
    this.swarmStatus();
  }

  swarmStatus() {
    if (this.swarm) this.status.swarm = this.swarm.status();
  }

  /** Keep piece `index` (checked) in the folder once, whoever brought it; false when
   * it was there already (or being written by the other path). */
  async keep(dir, index, bytes) {
    if (this.held.has(index)) return false;
    const busy = this.writing.get(index);
    if (busy !== undefined) {
      await busy.catch(() => {});
      return false;
    }
    const write = keepPiece(dir, index, bytes);
    this.writing.set(index, write);
    try {
      await write;
    } finally {
      this.writing.delete(index);
    }
    this.held.add(index);
    this.status.stored_pieces += 1;
    return true;
  }

  /**
   * The prefetchers' swarm the grant names (swarm.js, ciphertext only), or null: not
   * named, uploads not allowed here (a metered link, or sharing off), or it could not
   * be joined (a note; the origins alone).
   */
  joinSwarm(grant, dir, signal) {
    const info = grant.swarm;
    if (!info || !this.config.swarm || !(this.rules.uploadAllowed?.() ?? false)) return null;
    const m = this.m;
    const n = m.piece_sha256.length;
    const state = new Uint8Array(n);
    for (const i of this.held) state[i] = 2;
    const self = this;
    const target = {
      issueId: m.issue_id,
      m,
      prefetch: true,
      opener: null,
      decrypt: null,
      signal,
      cfg: { balancer_timeout_s: this.config.download?.balancer_timeout_s ?? 10 },
      hooks: {},
      state,
      get storedCount() {
        return self.held.size;
      },
      notice: (text) => this.note(text),
      pieceStore: {
        load: async () => {},
        add: async () => {},
        read: async (index) => {
          const handle = await dir.getFileHandle(`p${index}`).catch(() => null);
          return handle === null ? null : new Uint8Array(await (await handle.getFile()).arrayBuffer());
        },
      },
      // pieces from peers (checked against the manifest by swarm.js): kept as they came
      storeRun: async (first, chunks) => {
        for (let k = 0; k < chunks.length; k++) {
          state[first + k] = 2;
          if (await this.keep(dir, first + k, chunks[k])) {
            this.status.bytes_from_peers += chunks[k].length;
            this.progressed();
          }
        }
        return null;
      },
    };
    const fetcher = new SwarmFetch({
      download: target,
      swarm: { torrent_url: info.torrent_url, webtorrent_url: info.webtorrent_url, web_seeds: [] },
      cfg: this.config.swarm,
      uploadAllowed: () => this.rules.uploadAllowed?.() ?? false,
      onChange: () => this.swarmStatus(),
    });
    this.swarm = fetcher;
    this.swarmJoinedAt = performance.now() / 1000;
    fetcher.run().catch((err) => {
      if (!signal.aborted) this.note(`the prefetchers' swarm: ${err?.message ?? err}; the origins alone`);
      if (this.swarm === fetcher) this.swarm = null;
      this.swarmStatus();
    });
    return fetcher;
  }

  progressed(origin = null) {
    const m = this.m;
    this.rules.progress?.({
      issue_id: m.issue_id,
      total_bytes: m.size_bytes,
      done_bytes: [...this.held].reduce((s, i) => s + pieceSpan(m, i)[1], 0),
      stored_pieces: this.status.stored_pieces,
      num_pieces: m.piece_sha256.length,
      origin,
    });
  }

  async run(signal) {
    const m = this.m;
    const n = m.piece_sha256.length;
    await removeFolders(m.issue_id, folderName(m)); // another version's pieces
    const have = await storedCiphertext(m);
    this.status.stored_pieces = have.size;
    if (have.size === n) {
      this.status.state = "done";
      return;
    }
    // room for the ciphertext now and the plaintext at the release
    const { usage, quota } = await storageEstimate();
    const needed = 2 * m.size_bytes - [...have.keys()].reduce((s, i) => s + pieceSpan(m, i)[1], 0);
    if (quota - usage < needed) {
      this.status.state = "no-room";
      this.note(`not enough room on this device (${needed} bytes needed); the issue downloads at the release`);
      return;
    }
    this.held = new Set(have.keys()); // pieces in the folder, from the origins or peers
    this.writing = new Map(); // index -> its write, from either path
    const dir = await folder(m, true);
    const who = await clientId();
    let grant = await this.grant(who, signal);
    this.joinSwarm(grant, dir, signal);
    let freeAt = performance.now(); // the pace: when the next piece may start (ms)
    let origin = 0;
    let failuresInRow = 0;
    let missing = [];
    for (let i = 0; i < n; i++) if (!have.has(i)) missing.push(i);
    this.status.state = "fetching";
    while ((missing = missing.filter((i) => !this.held.has(i))).length) {
      await this.rules.waitForNetwork?.(signal); // "Wi-Fi only": not one byte on cellular
      if (performance.now() >= grant.renewAt) {
        grant = await this.grant(who, signal);
        if (this.swarm === null || this.swarm.state === "left") this.joinSwarm(grant, dir, signal);
      }
      if (grant.rate <= 0) {
        // no room at the origins now: the peers go on meanwhile
        this.status.state = "waiting";
        await sleep(Math.max(0, Math.min(grant.renewAt - performance.now(), this.swarm ? LOOK_MS : Infinity)), signal);
        continue;
      }
      this.status.state = "fetching";
      let index = missing[0];
      if (this.swarm !== null) {
        const idle = performance.now() / 1000 - Math.max(this.swarm.peerPayloadAt, this.swarmJoinedAt);
        index = nextOriginPiece(missing, this.swarm.availability(), idle);
        if (index === null) {
          await sleep(LOOK_MS, signal); // the peers hold every missing piece: theirs
          freeAt = Math.max(freeAt, performance.now() - 1000); // no burst builds while they send
          continue;
        }
      }
      const [offset, length] = pieceSpan(m, index);
      const start = Math.max(performance.now(), freeAt);
      freeAt = start + (length / grant.rate) * 1000;
      await sleep(start - performance.now(), signal);
      if (this.held.has(index) || this.writing.has(index)) {
        freeAt = performance.now(); // a peer brought it meanwhile: nothing was taken
        continue;
      }
      const { name, url } = grant.origins[origin % grant.origins.length];
      const bytes = await this.piece(url, offset, length, signal);
      if (bytes === null || !(await pieceOk(m, index, bytes))) {
        if (bytes !== null) this.note(`piece ${index} from ${name} does not match the manifest; asking another origin`);
        origin += 1;
        failuresInRow += 1;
        freeAt = performance.now(); // nothing was taken
        // every origin failed in turn: a new grant (a new list), after a pause
        if (failuresInRow % grant.origins.length === 0) {
          grant.renewAt = performance.now();
          await sleep(Math.min(1000 * 2 ** Math.min(failuresInRow / grant.origins.length, 5), 30_000), signal);
        }
        continue;
      }
      failuresInRow = 0;
      // the origins' bytes are counted whether or not a peer's copy was written first
      this.status.bytes_by_origin[name] = (this.status.bytes_by_origin[name] ?? 0) + length;
      await this.keep(dir, index, bytes);
      this.swarm?.storedElsewhere(index, bytes); // the other prefetchers may take it from here
      this.progressed(name);
    }
    this.status.state = "done";
    this.status.finished_at = Date.now();
    this.swarmStatus();
    this.note(`the issue's ${n} pieces are on this device; it opens at the release`);
  }

  /** One piece (bytes) from an origin, or null when it failed. */
  async piece(base, offset, length, signal) {
    const m = this.m;
    const url = `${base}/content/${encodeURIComponent(m.issue_id)}/${encodeURIComponent(m.file_name)}`;
    const stall = AbortSignal.timeout((this.config.download?.stall_timeout_s ?? 20) * 1000);
    try {
      const resp = await fetch(url, {
        headers: { Range: `bytes=${offset}-${offset + length - 1}` },
        signal: AbortSignal.any([signal, stall]),
        cache: "no-store",
        priority: "low", // behind anything the reader is waiting for
      });
      const problem = checkAnswer(resp, offset, offset + length, m.size_bytes);
      if (problem !== null) {
        resp.body?.cancel().catch(() => {});
        this.note(`${base} ${problem}`);
        return null;
      }
      const bytes = new Uint8Array(await resp.arrayBuffer());
      return bytes.length === length ? bytes : null;
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      this.note(`${base}: ${err?.message ?? err}`);
      return null;
    }
  }

  /** A grant: {rate (bytes/s; 0: wait), renewAt (performance.now() ms), origins}. */
  async grant(who, signal) {
    const urls = this.config.balancer_urls?.length ? this.config.balancer_urls : [this.config.balancer_url];
    for (let round = 1; ; round++) {
      for (let step = 0; step < urls.length; step++) {
        const base = urls[(this.balancerIndex + step) % urls.length];
        const url = `${base}/v1/issues/${encodeURIComponent(this.m.issue_id)}/prefetch?client=${who}`;
        let resp;
        let doc;
        try {
          const timeout = AbortSignal.timeout((this.config.download?.balancer_timeout_s ?? 10) * 1000);
          resp = await fetch(url, { signal: AbortSignal.any([signal, timeout]), cache: "no-store" });
          doc = await resp.json().catch(() => null);
        } catch (err) {
          if (signal.aborted) throw signal.reason;
          continue; // the next balancer
        }
        const origins = Array.isArray(doc?.origins)
          ? doc.origins.filter((o) => typeof o?.name === "string" && typeof o?.url === "string").map((o) => ({ name: o.name, url: o.url.replace(/\/+$/, "") }))
          : [];
        this.balancerIndex = (this.balancerIndex + step) % urls.length;
        const renew = seconds(doc, "renew_s");
        if (resp.status === 200 && origins.length && renew !== null) {
          const rate = seconds(doc, "rate_bytes_per_s") ?? 0;
          this.status.grants += 1;
          this.status.rate_bytes_per_s = rate;
          return { rate, renewAt: performance.now() + renew * 1000, origins, swarm: swarmOf(doc) };
        }
        // lengthened at random by up to retry_jitter of itself, as a download's waits
        // (download.js backoff): prefetchers deferred together do not ask again together
        const jitter = 1 + (this.config.download?.retry_jitter ?? 0) * Math.random();
        const wait = (seconds(doc, "retry_after_s") ?? 20) * jitter;
        if (resp.status === 429 && origins.length) {
          this.status.deferrals += 1;
          this.status.rate_bytes_per_s = 0;
          return { rate: 0, renewAt: performance.now() + wait * 1000, origins, swarm: swarmOf(doc) };
        }
        if (resp.status === 429 || resp.status === 404) {
          // no room, naming no origin; or no origin holds the issue yet: ask again
          this.status.deferrals += 1;
          this.status.state = "waiting";
          await sleep(wait * 1000, signal);
          step = -1; // the same round again, from this balancer
          continue;
        }
      }
      // no balancer answered: back off, and try them all again
      this.status.state = "waiting";
      await sleep(Math.min(1000 * 2 ** Math.min(round, 6), 60_000), signal);
    }
  }
}

/**
 * Wrap subscription.js's prepareDecryption for one issue's download: on the first
 * embargo answer the background prefetch starts; when the key comes (the release),
 * the prefetch stops and what it stored is decrypted into the issue's storage before
 * the download looks at what is stored. rules: {issueId, config, note(text),
 * progress(p), waitForNetwork(signal)} (app.js's).
 */
export function withPrefetch(prepare, rules) {
  return async (m, opts = {}) => {
    let prefetch = null;
    const onEmbargo = () => {
      if (prefetch !== null || m.encryption?.release_at == null) return;
      prefetch = new Prefetch(m, rules.config, rules);
      prefetch.start(opts.signal ?? null);
      markPrefetching(m.issue_id, true).catch(() => {});
    };
    let opener;
    try {
      opener = await prepare(m, { ...opts, onEmbargo });
    } catch (err) {
      await prefetch?.stop();
      // a refusal (not a pause): what was fetched can never be opened here
      if (!opts.signal?.aborted) await forgetPrefetch(m.issue_id).catch(() => {});
      throw err;
    }
    await prefetch?.stop();
    if (opener !== null && m.encryption !== undefined) {
      const started = performance.now();
      const moved = await adoptPrefetched(m, opener, rules.note);
      const status = statuses.get(m.issue_id);
      if (status !== undefined) {
        status.state = "opened";
        status.adopted_pieces = moved;
        status.adopt_ms = performance.now() - started;
      }
      if (moved) rules.note?.(`prefetch: ${moved} pieces fetched before the release, decrypted at it`);
      await markPrefetching(m.issue_id, false);
    }
    return opener;
  };
}
