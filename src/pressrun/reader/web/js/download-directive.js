// The balancer's directive for a download (download.js, docs/reader.md "Download"):
// Download's methods that ask the balancers in turn for the issue's origins (and its
// swarm, when the directive sends this reader to one), and wait and ask again while
// there is none. Written here as the methods of DownloadDirective; download.js puts
// them on Download's prototype, so `this` is the Download and they read and write its
// fields as before. (DownloadError and describe are download.js's; they are used only
// when a method runs, so the two modules importing each other is safe.)

import { getRecord } from "./db.js";
import { DownloadError, describe } from "./download.js";
import { parseManifest, pieceSpan } from "./manifest.js";
import { storedPieces } from "./store.js";

class Unavailable extends Error {
  constructor(reason, { retryAfterS = null, refused = false } = {}) {
    super(reason);
    this.retryAfterS = retryAfterS;
    this.refused = refused;
  }
}

/** Download's methods about the balancer (installed by download.js). */
export class DownloadDirective {
  /** A directive from the first balancer that answers, starting at the one that last
   * did; a refused connection, a timeout or a 5xx moves to the next (issue 30). */
  async directive() {
    const urls = this.config.balancer_urls?.length ? this.config.balancer_urls : [this.config.balancer_url];
    this.balancerIndex ??= 0;
    let last = null;
    for (let step = 0; step < urls.length; step++) {
      const i = (this.balancerIndex + step) % urls.length;
      try {
        const origins = await this.directiveFrom(urls[i]);
        this.balancerIndex = i;
        return origins;
      } catch (err) {
        if (!(err instanceof Unavailable) || !err.nextBalancer) throw err;
        if (!last?.refused) last = err;
      }
    }
    throw last;
  }

  async directiveFrom(balancerUrl) {
    const failed = this.failedNames();
    const base = `${balancerUrl}/v1/issues/${encodeURIComponent(this.issueId)}/directive`;
    const query = [];
    if (failed.length) query.push(`failed=${failed.map(encodeURIComponent).join(",")}`);
    if (this.peerCapable()) query.push("peer=webrtc");
    const hint = this.copyHint();
    if (hint !== null) query.push(`have=${hint.have}`, `size=${hint.size}`);
    const url = query.length ? `${base}?${query.join("&")}` : base;
    let resp;
    let body;
    try {
      const timeout = AbortSignal.timeout(this.cfg.balancer_timeout_s * 1000);
      resp = await fetch(url, { signal: AbortSignal.any([timeout, this.signal]), cache: "no-store" });
      body = await resp.text();
    } catch (err) {
      if (this.signal.aborted) throw this.signal.reason;
      throw Object.assign(new Unavailable(`the balancer at ${balancerUrl} is unreachable: ${describe(err)}`), {
        nextBalancer: true,
      });
    }
    let doc = null;
    try {
      doc = JSON.parse(body);
    } catch {
      doc = null;
    }
    const message = doc?.error ?? `HTTP ${resp.status}`;
    if (resp.status === 404) {
      throw new DownloadError(`issue ${this.issueId} is unknown to the balancer: ${message}`);
    }
    if (resp.status === 503) {
      const retry = Number(resp.headers.get("Retry-After"));
      const refusal = new Unavailable(`the balancer has no origin for ${this.issueId} now: ${message}`, {
        retryAfterS: Number.isFinite(retry) && retry > 0 ? retry : null,
        refused: true,
      });
      throw Object.assign(refusal, { nextBalancer: true });
    }
    if (resp.status >= 500) {
      throw Object.assign(new Unavailable(`the balancer at ${balancerUrl} answered ${message}`), { nextBalancer: true });
    }
    if (resp.status !== 200 || doc === null || !Array.isArray(doc.origins)) {
      throw new Unavailable(`the balancer answered ${message}`);
    }
    const origins = doc.origins.filter((o) => typeof o?.name === "string" && typeof o?.url === "string");
    if (origins.length === 0) {
      throw new Unavailable(`the balancer's ${doc.mode} directive lists no origin (the reader downloads from origins)`);
    }
    for (const o of origins) this.originUrls.set(o.name, o.url.replace(/\/+$/, ""));
    this.swarmInfo = doc.mode === "swarm" && usableSwarm(doc.swarm) ? doc.swarm : null;
    return origins;
  }

  /**
   * What a resumed download tells the balancer of its copy (`have=`, `size=`: the bytes
   * of the issue's file it holds, the file's size; docs/protocols.md), as a resumed
   * `pressrun get` does, so that the balancer counts what it lacks, not a whole new
   * transfer (under full origins a resume was refused like a new reader). Before the
   * manifest: `storedHint` (`storedCopy`); after it: the pieces stored by now, when the
   * download resumed some. null: it tells nothing (a download begun from nothing).
   */
  copyHint() {
    if (this.resumedPieces === undefined) return this.storedHint ?? null;
    if (this.resumedPieces.length === 0) return null;
    return { have: this.storedBytes, size: this.m.size_bytes };
  }

  /**
   * `{have, size}` of the partial copy this device stores of the issue: the pieces in
   * its folder (store.js) measured in the manifest it stored with them (the issue
   * record's, as fetched: the file on the origins, ciphertext for an encrypted issue);
   * a hint, not checked again yet. null without one (nothing stored, no manifest).
   */
  async storedCopy() {
    const record = await getRecord("issues", this.issueId);
    if (typeof record?.manifest_text !== "string") return null;
    let m;
    try {
      m = parseManifest(record.manifest_text).manifest;
    } catch {
      return null;
    }
    const n = m.piece_sha256.length;
    let have = 0;
    for (const i of await storedPieces(this.issueId)) if (i < n) have += pieceSpan(m, i)[1];
    return have > 0 && m.size_bytes > 0 ? { have, size: m.size_bytes } : null;
  }

  /** A directive, waiting and retrying while there is none; DownloadError when stuck. */
  async origins() {
    for (;;) {
      try {
        return await this.directive();
      } catch (err) {
        if (!(err instanceof Unavailable)) throw err;
        this.failures += 1;
        this.failuresInRow += 1;
        this.lastReason = err.message;
        this.giveUpIfStuck();
        if (err.refused) this.failed.clear(); // nothing else is left: try them again
        await this.backoff(err.retryAfterS);
      }
    }
  }
}

/** Whether a directive's swarm object has what the reader needs to join it. */
function usableSwarm(swarm) {
  return (
    swarm !== null &&
    typeof swarm === "object" &&
    typeof swarm.torrent_url === "string" &&
    /^https?:\/\//.test(swarm.torrent_url) &&
    typeof swarm.webtorrent_url === "string" &&
    /^wss?:\/\//.test(swarm.webtorrent_url)
  );
}
