// The store webtorrent reads and writes (swarm.js, docs/reader.md "Peers"; webtorrent's
// abstract-chunk-store): SwarmFetch's methods that check a piece webtorrent verified
// (its SHA-1) against the manifest's SHA-256, decrypt it (encrypted issues) and write
// the verified pieces to the OPFS store in runs; that read a stored piece for a peer
// (encrypted again, checked against the manifest, kept ready in a small cache); and
// that give the torrent a piece stored from elsewhere (prefetch.js). Written here as
// the methods of SwarmPieceStore; swarm.js puts them on SwarmFetch's prototype, so
// `this` is the SwarmFetch and they read and write its fields as before.

import { pieceOk } from "./manifest.js";

// pieces kept ready for upload (a piece is asked for block by block): with a crowd of
// peers each asking for another piece, 8 made most blocks a new OPFS read and SHA-256
const PIECE_CACHE = 48;
const MAX_RUN = 64; // pieces written as one OPFS file at most

/** SwarmFetch's store methods (installed by swarm.js). */
export class SwarmPieceStore {
  storeClass() {
    const self = this;
    return class SwarmStore {
      constructor(chunkLength) {
        this.chunkLength = chunkLength;
      }
      put(index, buf, cb) {
        self.put(index, buf).then(() => cb?.(null), (err) => cb?.(err));
      }
      get(index, opts, cb) {
        if (typeof opts === "function") [cb, opts] = [opts, null];
        self.get(index, opts).then((b) => cb(null, b), (err) => cb(err));
      }
      close(cb) {
        queueMicrotask(() => cb?.(null));
      }
      destroy(cb) {
        queueMicrotask(() => cb?.(null));
      }
    };
  }

  /** A piece webtorrent verified (SHA-1): check SHA-256, decrypt, store. */
  async put(index, buf) {
    if (this.state === "left") throw new Error("left the swarm");
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength).slice();
    const who = this.contributors.get(index) ?? new Map();
    this.contributors.delete(index);
    if (!(await pieceOk(this.m, index, bytes))) {
      // the torrent's SHA-1 and the manifest's SHA-256 disagree: a publisher error
      // (the info-hash matched); webtorrent destroys the torrent, origins take over
      this.failure = `piece ${index} passed the torrent's SHA-1 but not the signed manifest's SHA-256`;
      throw new Error(this.failure);
    }
    const kept = this.decrypt === null ? bytes : await this.decrypt(index, bytes);
    if (this.state === "left") throw new Error("left the swarm");
    this.verifiedCount += 1;
    const [offer, rule] = this.offerTags?.get(index) ?? ["before_offer", "start"]; // webtorrent's web seed offers every piece until the first offer
    this.offerTags?.delete(index);
    for (const [wire, n] of who) {
      if (wire.type === "webSeed") {
        this.fromWebSeeds += n;
        this.webSeedBytesByOffer[offer] = (this.webSeedBytesByOffer[offer] ?? 0) + n;
        this.webSeedBytesByRule[rule] = (this.webSeedBytesByRule[rule] ?? 0) + n;
      } else this.fromPeers += n;
    }
    this.remember(index, bytes); // what peers ask for most is what was just verified
    await new Promise((resolve, reject) => {
      this.pending.set(index, { kept, resolve, reject });
      if (!this.writing) this.writer = this.writeQueued();
    });
  }

  /** Write the verified pieces waiting, in runs of consecutive pieces, until none is
   * left (one writer at a time: `this.writer` is its promise). */
  async writeQueued() {
    this.writing = true;
    try {
      while (this.pending.size) {
        const batch = [...this.pending.entries()].sort((a, b) => a[0] - b[0]);
        this.pending.clear();
        let run = [];
        const flush = async () => {
          if (!run.length) return;
          const done = run;
          run = [];
          try {
            const first = done[0][0];
            const handle = await this.download.storeRun(first, done.map(([, p]) => p.kept), "peers");
            await this.stored.add(first, done.length, handle);
            for (const [, p] of done) p.resolve();
          } catch (err) {
            this.storeError ??= err; // the device is full: the download's own error
            for (const [, p] of done) p.reject(err);
          }
        };
        for (const entry of batch) {
          const last = run[run.length - 1];
          if (last && (entry[0] !== last[0] + 1 || run.length >= MAX_RUN)) await flush();
          run.push(entry);
        }
        await flush();
      }
    } finally {
      this.writing = false;
    }
  }

  /**
   * A read of piece `index` as the publisher made it. webtorrent reads whole pieces
   * (no offset) to check a sample of the stored pieces against the torrent at start;
   * a peer's request always names its block's offset, and is served only while
   * uploading is allowed.
   */
  async get(index, opts) {
    const forPeer = typeof opts?.offset === "number";
    if (forPeer && !this.uploadAllowed()) throw new Error("not uploading (a metered network, or sharing is off)");
    let piece = this.cache.get(index);
    if (piece === undefined) {
      // a peer asks for a piece block by block, several at once: one read (and one
      // SHA-256) for them all, not one each (profiled: up to 8 of each piece)
      let reading = this.reading.get(index);
      if (reading === undefined) {
        reading = this.readStored(index).finally(() => this.reading.delete(index));
        this.reading.set(index, reading);
      }
      piece = await reading;
    }
    if (!opts) return piece;
    const offset = opts.offset ?? 0;
    return piece.subarray(offset, offset + (opts.length ?? piece.length - offset));
  }

  /** Stored piece `index` as the publisher made it (encrypted again for an encrypted
   * issue), checked against the manifest, and kept ready for upload. */
  async readStored(index) {
    this.pieceReads = (this.pieceReads ?? 0) + 1;
    const plain = await this.stored.read(index);
    if (plain === null) throw new Error(`piece ${index} is not stored`);
    const piece = this.encrypt === null ? plain : this.encrypt(index, plain);
    if (!(await pieceOk(this.m, index, piece))) throw new Error(`stored piece ${index} does not match the manifest`);
    this.remember(index, piece);
    return piece;
  }

  /** Keep piece `index` (as the publisher made it, verified) ready for upload (LRU). */
  remember(index, piece) {
    this.cache.delete(index);
    this.cache.set(index, piece);
    if (this.cache.size > PIECE_CACHE) this.cache.delete(this.cache.keys().next().value);
  }

  /**
   * Piece `index` (as the publisher made it, checked against the manifest) came from
   * elsewhere (an origin, through prefetch.js) and is stored: the torrent takes it as
   * verified and tells its peers, as webtorrent does for a piece it verified itself.
   */
  storedElsewhere(index, bytes) {
    const t = this.torrent;
    this.remember(index, bytes);
    if (t === null || t.destroyed || !t.ready || t.bitfield.get(index)) return;
    t._markVerified(index);
    for (const wire of t.wires) wire.have(index);
    t._checkDone?.();
    t._update?.();
  }
}
