// Downloading one issue in the browser, as `pressrun get` does (docs/client.md):
//
// 1. ask the balancer for a directive (GET /v1/issues/<id>/directive, CORS);
// 2. fetch manifest.json from the first origin it names and check its Ed25519
//    signature (manifest.js) against the trusted publisher keys (trust on first use
//    when there are none, the key then pinned);
// 3. list the pieces already stored (store.js): a download that was cut resumes with
//    them and never asks for them again;
// 4. run `concurrency` workers; each asks for a fresh directive per section (naming
//    the origins that failed in `?failed=`, the WSDM retry rule), takes the next run
//    of pending pieces (at most the section size: the LVS-CAD section handoff, so a
//    long download may move between origins section by section), fetches it with one
//    Range request and checks each piece's SHA-256 as it completes. A good piece is
//    decrypted (encrypted issues) and kept; kept pieces are written to the origin
//    private file system in runs. A bad piece, an HTTP error, a reset or a stall (no
//    byte for stall_timeout_s) fails the origin for failed_ttl_s and the section's
//    other pieces go back to pending; the next section goes to another origin;
// 5. failures in a row with no piece verified in between end the download after
//    max_attempts_without_progress, with a sentence that says why; what was stored
//    stays for the next try.
//
// Settings come from config.json (the client's mobile profile by default).
//
// Peers (issue 26): the reader tells the balancer it can be a WebRTC peer
// (`?peer=webrtc`); when the directive's mode is "swarm" and names a WebSocket
// tracker, the pieces not stored yet come through the swarm first (swarm.js), the
// origins as web seeds in the same client; no peer within a few seconds, or a swarm
// that stops delivering, and the workers above fetch the rest from the origins. A
// download on the origins that was never in a swarm joins one when a later section's
// directive names it (the sections in flight end first; joinsSwarmNow).

import { getSetting, putSetting, updateIssue } from "./db.js";
import { DownloadDirective } from "./download-directive.js";
import { ManifestError, bytesToHex, parseManifest, pieceOk, pieceSpan, verifyManifest } from "./manifest.js";
import { mixIn } from "./mixin.js";
import { deleteIssueFiles, issueBlob, removeUnfinishedWrites, storedPieces, writeRun } from "./store.js";
import { NoPeers, SwarmFetch, SwarmStalled } from "./swarm.js";

/** A download that cannot go on; the message is one line for a person. */
export class DownloadError extends Error {}

/** Pieces verified and kept are written to storage once this many bytes are waiting. */
const FLUSH_BYTES = 4 * 1024 * 1024;

/** Runs of one section being written while its next bytes are read. */
const MAX_WRITES_AHEAD = 2;

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });

/** A fetch error in a few words (download-directive.js too). */
export function describe(err) {
  if (err?.name === "TimeoutError") return "stalled (no bytes within the timeout)";
  if (err instanceof TypeError) return "the connection failed or was cut";
  return String(err?.message ?? err);
}

/** The section size in bytes, as ClientConfig.section_size_for computes it. */
export function sectionBytesFor(cfg, sizeBytes, pieceBytes) {
  let wanted;
  if (cfg.section_bytes != null) {
    wanted = cfg.section_bytes;
  } else {
    wanted = Math.max(pieceBytes, Math.ceil(sizeBytes / cfg.max_sections));
    if (cfg.max_section_bytes != null) {
      const capped = Math.floor(cfg.max_section_bytes / pieceBytes) * pieceBytes;
      wanted = Math.min(wanted, Math.max(pieceBytes, capped));
    }
  }
  return Math.max(1, Math.ceil(wanted / pieceBytes)) * pieceBytes;
}

export class Download {
  /**
   * issueId; config: config.json's document; hooks: {progress(p), notice(text),
   * waitForNetwork(signal), networkAllowed()} (all optional); prepareDecryption: subscription.js's
   * (manifest -> null for a plain issue, or the piece decryptor), or null;
   * signal: an AbortSignal that stops the download (pieces stored so far stay);
   * uploadAllowed(): whether a peer may be sent a piece now (swarm.js);
   * onSwarm(swarmFetch): told when the download joins a swarm.
   */
  constructor({ issueId, config, hooks = {}, prepareDecryption = null, signal = null, uploadAllowed = () => false, onSwarm = () => {} }) {
    this.issueId = issueId;
    this.config = config;
    this.cfg = config.download;
    this.hooks = hooks;
    this.prepareDecryption = prepareDecryption;
    this.signal = signal ?? new AbortController().signal;
    this.failed = new Map(); // origin name -> time (ms) until which it is avoided
    this.originUrls = new Map();
    this.bytesByOrigin = {};
    this.failures = 0;
    this.failuresInRow = 0;
    this.handoffs = 0;
    this.sections = 0;
    this.lastOrigin = null;
    this.lastReason = null;
    this.ranges = []; // the Range headers this run sent (for the tests and the log)
    this.uploadAllowed = uploadAllowed;
    this.onSwarm = onSwarm;
    this.swarmInfo = null; // the last directive's swarm, when it sends this reader there
    this.storedHint = null; // {have, size} of the copy stored before this run (copyHint)
    this.swarmFetch = null;
  }

  /** Whether this reader asks to be sent to the swarm (config.json and the browser). */
  peerCapable() {
    return Boolean(this.config.swarm?.enabled) && typeof RTCPeerConnection === "function";
  }

  notice(text) {
    this.hooks.notice?.(text);
  }

  failedNames() {
    const now = performance.now();
    for (const [name, until] of this.failed) if (until <= now) this.failed.delete(name);
    return [...this.failed.keys()].sort();
  }

  failOrigin(name, reason) {
    this.failed.set(name, performance.now() + this.cfg.failed_ttl_s * 1000);
    this.failures += 1;
    this.failuresInRow += 1;
    this.lastReason = `${name}: ${reason}`;
    this.notice(`origin ${name} failed: ${reason}; moving on`);
  }

  /**
   * The wait before the next attempt: the balancer's Retry-After, or the backoff
   * doubling per failure in a row; lengthened at random by up to retry_jitter of
   * itself (config.json, 0.5: up to half again), as ClientConfig.backoff_s does, so
   * that readers refused together do not ask again together (in step, a balancer
   * admitting a few after each status of its origins admits the same early ones
   * every time: docs/results/2026-11-29-soak-retries.md).
   */
  async backoff(retryAfterS = null) {
    const n = Math.max(0, this.failuresInRow - 1);
    const s = retryAfterS ?? Math.min(this.cfg.retry_backoff_s * 2 ** n, this.cfg.retry_backoff_max_s);
    const jitter = this.cfg.retry_jitter ?? 0;
    await sleep(s * (1 + jitter * Math.random()) * 1000, this.signal);
  }

  giveUpIfStuck() {
    if (this.failuresInRow >= this.cfg.max_attempts_without_progress) {
      throw new DownloadError(
        `could not download ${this.issueId} after ${this.failuresInRow} failures in a row ` +
          `(the last: ${this.lastReason}); the pieces stored so far are kept for a resume`,
      );
    }
  }

  // -- balancer: its methods are in download-directive.js, put on this class below

  // -- manifest

  async trustedKeys() {
    if (this.config.publisher_keys?.length) return this.config.publisher_keys;
    const pinned = await getSetting("trusted_publishers", []);
    if (pinned.length) return pinned;
    if (this.config.trust_on_first_use) return null;
    throw new DownloadError(
      "this reader trusts no publisher key: its operator starts it with --publisher-key; nothing was downloaded",
    );
  }

  async manifest() {
    for (;;) {
      const origins = await this.origins();
      const origin = origins.find((o) => !this.failed.has(o.name)) ?? origins[0];
      const url = `${this.originUrls.get(origin.name)}/content/${encodeURIComponent(this.issueId)}/manifest.json`;
      let text;
      try {
        const resp = await fetch(url, { signal: this.signal, cache: "no-store" });
        if (resp.status !== 200) throw new Error(`GET manifest.json answered HTTP ${resp.status}`);
        text = await resp.text();
      } catch (err) {
        if (this.signal.aborted) throw this.signal.reason;
        this.failOrigin(origin.name, describe(err));
        this.giveUpIfStuck();
        await this.backoff();
        continue;
      }
      const trusted = await this.trustedKeys();
      let m;
      try {
        m = await verifyManifest(parseManifest(text), this.issueId, trusted);
      } catch (err) {
        if (!(err instanceof ManifestError)) throw err;
        throw new DownloadError(`the manifest of ${this.issueId} from ${origin.name} is rejected: ${err.message}; nothing was saved`);
      }
      if (trusted === null) {
        await putSetting("trusted_publishers", [m.publisher_key]);
        this.notice(`trusting publisher key ${m.publisher_key.slice(0, 16)}… on first use (pinned from now on)`);
      }
      return { m, text };
    }
  }

  // -- the download

  async run() {
    await this.hooks.waitForNetwork?.(this.signal); // Wi-Fi only: not one byte before
    const started = performance.now();
    this.storedHint = await this.storedCopy(); // told in the directive requests (have=, size=)
    const { m, text } = await this.manifest();
    this.m = m;
    const n = m.piece_sha256.length;
    const old = await updateIssue(this.issueId, {});
    if (old.sha256 !== undefined && old.sha256 !== m.sha256) {
      await deleteIssueFiles(this.issueId); // a new version of the issue: start over
    }
    // Decryption first: a reader that cannot open the issue stores nothing of it.
    const opener =
      this.prepareDecryption === null
        ? null
        : await this.prepareDecryption(m, { notice: (text) => this.notice(text), signal: this.signal });
    if (opener === null && m.encryption !== undefined) {
      throw new DownloadError(`issue ${this.issueId} is for subscribers only and this reader cannot decrypt; nothing was saved`);
    }
    await removeUnfinishedWrites(this.issueId);
    const have = await storedPieces(this.issueId);
    this.state = new Uint8Array(n); // 0 pending, 1 in a section, 2 stored
    for (const i of have) if (i < n) this.state[i] = 2;
    this.resumedPieces = [...have].filter((i) => i < n).sort((a, b) => a - b);
    this.storedCount = this.resumedPieces.length;
    this.storedBytes = this.resumedPieces.reduce((s, i) => s + pieceSpan(m, i)[1], 0);
    this.inFlight = new Map();
    this.decrypt = opener === null ? null : (index, bytes) => opener.decryptPiece(index, bytes);
    this.opener = opener;
    await updateIssue(this.issueId, {
      title: m.title,
      file_name: opener === null ? m.file_name : opener.plain_file_name,
      size_bytes: opener === null ? m.size_bytes : opener.plain_size_bytes,
      sha256: m.sha256,
      num_pieces: n,
      manifest_text: text,
      encrypted: opener !== null,
      status: this.storedCount === n ? "complete" : "downloading",
      added_at: old.added_at ?? Date.now(),
      error: null,
    });
    if (this.resumedPieces.length) {
      this.notice(`resuming ${this.issueId}: ${this.resumedPieces.length} of ${n} pieces already stored`);
    }
    this.sectionPieces = sectionBytesFor(this.cfg, m.size_bytes, m.piece_size_bytes) / m.piece_size_bytes;
    this.progress();
    if (this.storedCount < n && this.swarmInfo !== null && this.peerCapable()) await this.viaSwarm();
    for (;;) {
      this.swarmCalled = false;
      const workers = [];
      for (let w = 0; w < this.cfg.concurrency; w++) workers.push(this.worker(w));
      const results = await Promise.allSettled(workers);
      const failure = results.find((r) => r.status === "rejected");
      if (failure !== undefined) throw failure.reason;
      if (!this.swarmCalled || this.storedCount === n) break;
      // a section's directive sent this reader to the swarm (the crowd reached the
      // swarm level after the download began): the sections in flight ended, the
      // pieces left come through the swarm, and from the origins again if it fails
      this.notice(`the balancer sends ${this.issueId} to the swarm now: the ${n - this.storedCount} pieces left come through it`);
      await this.viaSwarm();
    }
    if (this.storedCount !== n) {
      throw new DownloadError(`${this.issueId}: ${n - this.storedCount} pieces are missing after the download`);
    }
    // Every piece matched its hash (and authenticated); the whole file must too.
    const expected = opener === null ? m.sha256 : opener.plain_sha256;
    const blob = await issueBlob(this.issueId, n, "application/octet-stream");
    const whole = bytesToHex(await crypto.subtle.digest("SHA-256", await blob.arrayBuffer()));
    if (whole !== expected) {
      await deleteIssueFiles(this.issueId);
      throw new DownloadError(
        `${this.issueId}: every piece matches but the whole file does not match the manifest's SHA-256 (a publisher error); nothing was kept`,
      );
    }
    const seconds = (performance.now() - started) / 1000;
    const swarm = this.swarmFetch;
    const summary = {
      status: "complete",
      bytes_by_origin: this.bytesByOrigin,
      bytes_from_peers: swarm?.fromPeers ?? 0,
      bytes_from_web_seeds: swarm?.fromWebSeeds ?? 0,
      web_seed_bytes_by_offer: swarm?.webSeedBytesByOffer ?? {},
      web_seed_bytes_by_rule: swarm?.webSeedBytesByRule ?? {},
      peers_seen: swarm?.peersSeen.size ?? 0,
      banned_peers: swarm?.bans.length ?? 0,
      handoffs: this.handoffs,
      sections: this.sections,
      failures: this.failures,
      resumed_pieces: this.resumedPieces.length,
      seconds,
      completed_at: Date.now(),
    };
    await updateIssue(this.issueId, summary);
    return {
      ...summary,
      issue_id: this.issueId,
      size_bytes: opener === null ? m.size_bytes : opener.plain_size_bytes,
      transfer_bytes: m.size_bytes,
      encrypted: opener !== null,
      ranges: this.ranges,
      resumed: this.resumedPieces,
    };
  }

  /**
   * Whether a section's directive sends this download to the swarm now: it names a
   * swarm this reader can join, and the download has not been in one (a download the
   * swarm failed stays on the origins). Before, only the first directive was asked:
   * a phone that began just before its crowd reached the swarm level took the whole
   * issue from the origins (the flash-crowd-50 emulation, issue 26).
   */
  joinsSwarmNow() {
    return this.swarmInfo !== null && this.swarmFetch === null && this.peerCapable();
  }

  /** The swarm first (swarm.js); on NoPeers or SwarmStalled the origins go on. */
  async viaSwarm() {
    const fetcher = new SwarmFetch({
      download: this,
      swarm: this.swarmInfo,
      cfg: this.config.swarm,
      uploadAllowed: this.uploadAllowed,
      onChange: () => this.onSwarm(fetcher),
    });
    this.swarmFetch = fetcher;
    this.onSwarm(fetcher);
    try {
      await fetcher.run();
    } catch (err) {
      if (this.signal.aborted) throw this.signal.reason;
      if (err instanceof DownloadError) throw err;
      if (!(err instanceof NoPeers || err instanceof SwarmStalled)) throw err;
      const left = this.state.length - this.storedCount;
      this.notice(`${err.message}: the ${left} pieces left come from the origins`);
    }
  }

  /**
   * Store pieces first..first+chunks.length-1 (verified, decrypted) as one run and
   * count them; returns the run's file handle. DownloadError when the device is full.
   */
  async storeRun(first, chunks, source, { transfer = false } = {}) {
    let handle;
    try {
      handle = await writeRun(this.issueId, first, chunks, { transfer });
    } catch (err) {
      throw new DownloadError(
        `cannot store ${this.issueId} on this device (${err.name}: ${err.message}); free some space ` +
          "(delete an issue) and download it again: the pieces stored so far are kept",
      );
    }
    for (let k = 0; k < chunks.length; k++) {
      const i = first + k;
      if (this.state[i] !== 2) {
        this.state[i] = 2;
        this.storedCount += 1;
        this.storedBytes += pieceSpan(this.m, i)[1];
      }
    }
    this.progress(source);
    return handle;
  }

  progress(origin = null) {
    const partial = [...this.inFlight.values()].reduce((a, b) => a + b, 0);
    this.hooks.progress?.({
      issue_id: this.issueId,
      total_bytes: this.m.size_bytes,
      done_bytes: this.storedBytes + partial,
      stored_pieces: this.storedCount,
      num_pieces: this.m.piece_sha256.length,
      origin,
    });
  }

  /** The next run of pending pieces (at most a section), marked in flight; or null. */
  takeSection() {
    const n = this.state.length;
    let first = this.state.indexOf(0);
    if (first < 0) return null;
    const pieces = [];
    for (let i = first; i < n && this.state[i] === 0 && pieces.length < this.sectionPieces; i++) {
      this.state[i] = 1;
      pieces.push(i);
    }
    return pieces;
  }

  release(pieces) {
    for (const i of pieces) if (this.state[i] === 1) this.state[i] = 0;
  }

  pickOrigin(origins, busy) {
    const usable = origins.filter((o) => !this.failed.has(o.name));
    // prefer an origin no other section of this download is on (two paths at once)
    return usable.find((o) => !busy.has(o.name)) ?? usable[0] ?? null;
  }

  async worker(id) {
    this.busy ??= new Map();
    for (;;) {
      if (this.signal.aborted) throw this.signal.reason;
      if (this.state.indexOf(0) < 0 || this.swarmCalled) return;
      await this.hooks.waitForNetwork?.(this.signal);
      const origins = await this.origins();
      if (this.swarmCalled || this.joinsSwarmNow()) {
        this.swarmCalled = true; // run() joins once every worker's section is done
        return;
      }
      const busy = new Set([...this.busy.values()]);
      const origin = this.pickOrigin(origins, busy);
      if (origin === null) {
        this.failuresInRow += 1;
        this.lastReason = "every origin the balancer offered has failed";
        this.giveUpIfStuck();
        await this.backoff();
        continue;
      }
      const pieces = this.takeSection();
      if (pieces === null) return;
      this.sections += 1;
      if (this.lastOrigin !== null && this.lastOrigin !== origin.name) {
        this.handoffs += 1;
        const [start] = pieceSpan(this.m, pieces[0]);
        this.notice(`handoff: from byte ${start} the issue comes from ${origin.name} (the previous section came from ${this.lastOrigin})`);
      }
      this.lastOrigin = origin.name;
      this.busy.set(id, origin.name);
      try {
        await this.fetchSection(id, origin.name, pieces);
      } finally {
        this.busy.delete(id);
        this.inFlight.delete(id);
      }
      if (this.failuresInRow > 0) {
        this.giveUpIfStuck();
        await this.backoff();
      }
    }
  }

  async fetchSection(worker, origin, pieces) {
    const m = this.m;
    const [start] = pieceSpan(m, pieces[0]);
    const [lastOffset, lastLength] = pieceSpan(m, pieces[pieces.length - 1]);
    const end = lastOffset + lastLength; // exclusive
    const range = `bytes=${start}-${end - 1}`;
    this.ranges.push(range);
    const url = `${this.originUrls.get(origin)}/content/${encodeURIComponent(this.issueId)}/${encodeURIComponent(m.file_name)}`;
    const stall = new AbortController();
    let stallTimer = null;
    const armStall = () => {
      clearTimeout(stallTimer);
      stallTimer = setTimeout(() => stall.abort(new DOMException("stalled", "TimeoutError")), this.cfg.stall_timeout_s * 1000);
    };
    let next = 0; // index into pieces of the piece being received
    let run = { first: null, chunks: [], bytes: 0 };
    // Runs are written while the next bytes are read (store.js writes in a worker):
    // awaiting each 4 MB write here was most of the download's time. At most
    // MAX_WRITES_AHEAD runs of a section are in the writer at once (memory bounded).
    const writes = [];
    const flush = () => {
      if (run.chunks.length === 0) return;
      const done = run;
      run = { first: null, chunks: [], bytes: 0 };
      const write = this.storeRun(done.first, done.chunks, origin, { transfer: true });
      write.catch(() => {}); // awaited below; never an unhandled rejection meanwhile
      writes.push(write);
    };
    const written = async () => {
      flush();
      // every write settled before the section's pieces are released; then the first error
      const results = await Promise.allSettled(writes.splice(0));
      const failure = results.find((r) => r.status === "rejected");
      if (failure !== undefined) throw failure.reason;
    };
    try {
      armStall();
      const resp = await fetch(url, {
        headers: { Range: range },
        signal: AbortSignal.any([stall.signal, this.signal]),
        cache: "no-store",
      });
      const problem = checkAnswer(resp, start, end, m.size_bytes);
      if (problem !== null) {
        resp.body?.cancel().catch(() => {});
        this.failOrigin(origin, problem);
        return;
      }
      const reader = resp.body.getReader();
      let [, length] = pieceSpan(m, pieces[0]);
      let buf = new Uint8Array(length);
      let filled = 0;
      while (next < pieces.length) {
        const { done, value } = await reader.read();
        if (done) break;
        armStall();
        let pos = 0;
        while (pos < value.length && next < pieces.length) {
          const take = Math.min(length - filled, value.length - pos);
          buf.set(value.subarray(pos, pos + take), filled);
          filled += take;
          pos += take;
          this.inFlight.set(worker, filled);
          if (filled < length) break;
          const index = pieces[next];
          if (!(await pieceOk(m, index, buf))) {
            reader.cancel().catch(() => {});
            this.failOrigin(
              origin,
              `piece ${index} does not match the signed manifest (tampered or corrupted); it will come from another origin`,
            );
            return;
          }
          const kept = this.decrypt === null ? buf : await this.decrypt(index, buf);
          if (run.first === null) run.first = index;
          run.chunks.push(kept);
          run.bytes += kept.length;
          this.bytesByOrigin[origin] = (this.bytesByOrigin[origin] ?? 0) + length;
          this.failuresInRow = 0;
          next += 1;
          this.inFlight.set(worker, 0);
          if (run.bytes >= FLUSH_BYTES) {
            flush();
            if (writes.length > MAX_WRITES_AHEAD) await writes.shift();
          }
          if (next < pieces.length) {
            [, length] = pieceSpan(m, pieces[next]);
            buf = new Uint8Array(length);
            filled = 0;
          }
        }
        this.progress(origin);
      }
      if (next < pieces.length) this.failOrigin(origin, "the answer ended early (a short body)");
    } catch (err) {
      if (this.signal.aborted) throw this.signal.reason;
      if (err instanceof DownloadError) throw err;
      this.failOrigin(origin, describe(err));
    } finally {
      clearTimeout(stallTimer);
      try {
        await written();
      } finally {
        this.release(pieces); // what was not stored goes back to pending
      }
    }
  }
}

// the balancer's methods, in their own module, are Download's
mixIn(Download, DownloadDirective);

/** Why an origin's answer to a Range request is unusable, or null. */
export function checkAnswer(resp, start, end, size) {
  if (resp.status === 416) return `answered 416 to bytes=${start}-${end - 1} (its copy is not the ${size}-byte file of the manifest)`;
  if (resp.status === 200 && start === 0 && end === size) return null;
  if (resp.status !== 206) return `answered HTTP ${resp.status} to bytes=${start}-${end - 1}`;
  const expected = `bytes ${start}-${end - 1}/${size}`;
  const got = (resp.headers.get("Content-Range") ?? "").trim();
  return got === expected ? null : `answered Content-Range "${got}", expected "${expected}"`;
}
