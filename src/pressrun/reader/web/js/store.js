// The issues' bytes in the origin private file system (OPFS).
//
// Layout: issues/<issue_id>/r<first>_<count>: a run of <count> consecutive pieces
// starting at piece <first>, already verified (and decrypted, for an encrypted
// issue). A run is written under a temporary name (t<first>_<count>) with one
// createWritable()/close() and renamed to its r-name only once close() has resolved,
// so an r-file is whole: a page closed in the middle of a write leaves a t-file (or
// nothing), never a short or stale r-file. (Measured: the file a createWritable()
// writes exists, with its old or partial content, before close() resolves.) So the
// folder listing *is* the resume state: a download that was cut (the page closed,
// the phone switched off) finds exactly the pieces it had stored and fetches the
// others. The writes run in a dedicated worker (store-worker.js) through sync access
// handles where the browser has them: the window's createWritable() was most of the
// browser download's time (bench/reader.py, docs/reader.md "Measured").

const RUN_RE = /^r(\d+)_(\d+)$/;
const TEMP_RE = /^t\d+_\d+$/;

let issuesFolder = null; // the "issues" folder's handle (a promise), looked up once

/** The "issues" folder (made on first use). Looked up once a page, not once a run:
 * a swarm download stores each of its scattered pieces as a run of its own. */
function issuesRoot() {
  if (issuesFolder === null) {
    const lookup = navigator.storage.getDirectory().then((root) => root.getDirectoryHandle("issues", { create: true }));
    issuesFolder = lookup;
    lookup.catch(() => {
      if (issuesFolder === lookup) issuesFolder = null; // asked again next time
    });
  }
  return issuesFolder;
}

async function issueDir(issueId, create) {
  const root = await issuesRoot();
  try {
    return await root.getDirectoryHandle(issueId, { create });
  } catch (err) {
    if (!create && err.name === "NotFoundError") return null;
    throw err;
  }
}

/** Store pieces first..first+chunks.length-1 (one Uint8Array each) as one run; the
 * r-file's handle. Through the writer worker (store-worker.js: sync access handles,
 * ~5x faster) where the browser has one, else from the window (createWritable).
 * transfer: the caller gives the chunks up (their buffers move to the worker, no copy
 * of the run on the page's thread; they are empty afterwards). */
export async function writeRun(issueId, first, chunks, { transfer = false } = {}) {
  if (writerBroken === null) {
    try {
      await writeInWorker(issueId, first, chunks, transfer);
      // the r-file's handle looked up here: a handle moved in the worker and posted
      // back still names the t-file in Chromium (a peer's read of it then fails)
      const dir = await issueDir(issueId, false);
      return await dir.getFileHandle(`r${first}_${chunks.length}`);
    } catch (err) {
      if (err.name !== "NotSupportedError") throw err;
      writerBroken = err.message; // no worker or no sync access handles: the window writes
    }
  }
  return writeFromWindow(issueId, first, chunks);
}

/** How runs are written here: "worker" (sync access handles) or "window" (createWritable). */
export function writeBackend() {
  return writerBroken === null ? "worker" : "window";
}

let writer = null; // the store-worker.js Worker, started at the first write
let writerBroken = null; // why the worker cannot write (then the window does), or null
let writerProven = false; // the worker has written a run (chunks may move to it)
let nextWrite = 0;
const pendingWrites = new Map(); // id -> {resolve, reject}

function startWriter() {
  if (typeof Worker !== "function") throw new DOMException("no Worker in this browser", "NotSupportedError");
  const w = new Worker(new URL("./store-worker.js", import.meta.url), { name: "pressrun-store" });
  w.onmessage = ({ data }) => {
    const waiting = pendingWrites.get(data.id);
    if (waiting === undefined) return;
    pendingWrites.delete(data.id);
    if (data.error) waiting.reject(new DOMException(data.error.message, data.error.name));
    else {
      writerProven = true;
      waiting.resolve();
    }
  };
  w.onerror = (event) => {
    // the worker could not start (or died): every write waiting on it fails over
    event.preventDefault?.();
    writer = null;
    // before its first run, the window writes instead; after it, the chunks may have
    // moved to the dead worker, so the write fails (the pieces are fetched again)
    const name = writerProven ? "UnknownError" : "NotSupportedError";
    const err = new DOMException(`the store worker failed: ${event.message ?? "error"}`, name);
    for (const waiting of pendingWrites.values()) waiting.reject(err);
    pendingWrites.clear();
  };
  return w;
}

/** The chunks' buffers when each chunk is the whole of its own buffer (so moving them
 * to the worker loses nothing else); else [] (they are copied). */
function ownedBuffers(chunks) {
  const buffers = new Set();
  for (const c of chunks) {
    if (c.byteOffset !== 0 || c.byteLength !== c.buffer.byteLength || buffers.has(c.buffer)) return [];
    buffers.add(c.buffer);
  }
  return [...buffers];
}

function writeInWorker(issueId, first, chunks, transfer) {
  writer ??= startWriter();
  const id = nextWrite++;
  return new Promise((resolve, reject) => {
    pendingWrites.set(id, { resolve, reject });
    // copied unless the caller gives them up (transfer): swarm-store.js still holds its pieces
    // moved only once the worker has written a run: a worker that cannot write
    // answers NotSupportedError and the window then needs the chunks
    writer.postMessage({ id, issueId, first, chunks }, transfer && writerProven ? ownedBuffers(chunks) : []);
  });
}

async function writeFromWindow(issueId, first, chunks) {
  const dir = await issueDir(issueId, true);
  const name = `${first}_${chunks.length}`;
  const handle = await dir.getFileHandle(`t${name}`, { create: true });
  const writable = await handle.createWritable();
  try {
    for (const chunk of chunks) await writable.write(chunk);
    await writable.close();
  } catch (err) {
    await writable.abort().catch(() => {});
    throw err;
  }
  await handle.move(`r${name}`);
  return handle;
}

/** The runs stored for an issue, sorted: [{first, count, handle}]. */
async function runs(issueId) {
  const dir = await issueDir(issueId, false);
  if (dir === null) return [];
  const found = [];
  for await (const [name, handle] of dir.entries()) {
    const m = RUN_RE.exec(name);
    if (m !== null && handle.kind === "file") found.push({ first: Number(m[1]), count: Number(m[2]), handle });
  }
  return found.sort((a, b) => a.first - b.first);
}

/**
 * The stored pieces of one issue, read back to upload them to peers (swarm-store.js).
 * `plainPieceBytes`: a piece's size as stored (the manifest's piece size, less the
 * 16-byte tag for an encrypted issue, whose pieces are stored decrypted). The runs
 * are listed once (`load`) and each new one added as it is written (`add`), so a
 * peer's request reads one slice of one file and never lists the folder.
 */
export class StoredPieces {
  constructor(issueId, plainPieceBytes) {
    this.issueId = issueId;
    this.plainPieceBytes = plainPieceBytes;
    this.runs = []; // [{first, count, file}], sorted by first
  }

  async load() {
    this.runs = [];
    for (const run of await runs(this.issueId)) this.runs.push({ first: run.first, count: run.count, file: await run.handle.getFile() });
  }

  async add(first, count, handle) {
    this.runs.push({ first, count, file: await handle.getFile() });
    this.runs.sort((a, b) => a.first - b.first);
  }

  /** Piece `index` as stored (a Uint8Array), or null when it is not stored. */
  async read(index) {
    const run = this.runs.find((r) => r.first <= index && index < r.first + r.count);
    if (run === undefined) return null;
    const start = (index - run.first) * this.plainPieceBytes;
    const end = Math.min(start + this.plainPieceBytes, run.file.size);
    return new Uint8Array(await run.file.slice(start, end).arrayBuffer());
  }
}

/** Remove the temporary files of writes that were cut short (before a download starts). */
export async function removeUnfinishedWrites(issueId) {
  const dir = await issueDir(issueId, false);
  if (dir === null) return;
  const names = [];
  for await (const name of dir.keys()) if (TEMP_RE.test(name)) names.push(name);
  for (const name of names) await dir.removeEntry(name);
}

/** The set of piece indices stored for an issue. */
export async function storedPieces(issueId) {
  const have = new Set();
  for (const run of await runs(issueId)) {
    for (let i = run.first; i < run.first + run.count; i++) have.add(i);
  }
  return have;
}

/** The whole issue as one Blob (disk-backed: nothing is read until sliced). */
export async function issueBlob(issueId, numPieces, type) {
  const parts = [];
  let next = 0;
  for (const run of await runs(issueId)) {
    if (run.first !== next) break;
    parts.push(await run.handle.getFile());
    next += run.count;
  }
  if (next !== numPieces) {
    throw new Error(`issue ${issueId} is not complete on this device (${next} of ${numPieces} pieces in order)`);
  }
  return new Blob(parts, { type });
}

/** Bytes an issue takes on this device. */
export async function issueBytes(issueId) {
  let total = 0;
  for (const run of await runs(issueId)) total += (await run.handle.getFile()).size;
  return total;
}

/** Remove everything stored for an issue. */
export async function deleteIssueFiles(issueId) {
  const root = await issuesRoot();
  try {
    await root.removeEntry(issueId, { recursive: true });
  } catch (err) {
    if (err.name !== "NotFoundError") throw err;
  }
}

/** Storage used and available for this app (the browser's quota), and persistence. */
export async function storageEstimate() {
  const estimate = await navigator.storage.estimate();
  const persisted = navigator.storage.persisted ? await navigator.storage.persisted() : false;
  return { usage: estimate.usage ?? 0, quota: estimate.quota ?? 0, persisted };
}
