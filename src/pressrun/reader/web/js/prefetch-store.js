// The background prefetch's storage (prefetch.js): the ciphertext pieces as they came,
// in the origin private file system under prefetch/<issue>.<sha256[:16]>/p<index>
// (written under a t-name and renamed when whole, so a page closed mid-write leaves no
// short piece), and at the release their adoption: decrypted into the issue's own
// storage (store.js's runs), the folder removed.

import { updateIssue } from "./db.js";
import { pieceOk } from "./manifest.js";
import { writeRun } from "./store.js";

/** Decrypted pieces written as one run at the release once this many bytes wait. */
const RUN_BYTES = 4 * 1024 * 1024;

async function prefetchRoot() {
  return (await navigator.storage.getDirectory()).getDirectoryHandle("prefetch", { create: true });
}

export const folderName = (m) => `${m.issue_id}.${m.sha256.slice(0, 16)}`;

export async function folder(m, create) {
  try {
    return await (await prefetchRoot()).getDirectoryHandle(folderName(m), { create });
  } catch (err) {
    if (!create && err.name === "NotFoundError") return null;
    throw err;
  }
}

/** Remove the prefetch folders of `issueId` (all versions, or all but `keep`). */
export async function removeFolders(issueId, keep = null) {
  const root = await prefetchRoot();
  const names = [];
  // exactly <issueId>.<16 hex>: an issue named "a" keeps its hands off "a.b"'s folder
  const ours = (name) => name.length === issueId.length + 17 && name.startsWith(`${issueId}.`) && /^[0-9a-f]{16}$/.test(name.slice(-16));
  for await (const name of root.keys()) if (ours(name) && name !== keep) names.push(name);
  for (const name of names) await root.removeEntry(name, { recursive: true }).catch(() => {});
}

/** The ciphertext pieces stored for this manifest's version: Map index -> handle. */
export async function storedCiphertext(m) {
  const dir = await folder(m, false);
  const found = new Map();
  if (dir === null) return found;
  const n = m.piece_sha256.length;
  for await (const [name, handle] of dir.entries()) {
    const match = /^p(\d+)$/.exec(name);
    if (match !== null && handle.kind === "file" && Number(match[1]) < n) found.set(Number(match[1]), handle);
    else if (/^t\d+$/.test(name)) await dir.removeEntry(name).catch(() => {}); // a write cut short
  }
  return found;
}

export async function keepPiece(dir, index, bytes) {
  const handle = await dir.getFileHandle(`t${index}`, { create: true });
  const writable = await handle.createWritable();
  try {
    await writable.write(bytes);
    await writable.close();
  } catch (err) {
    await writable.abort().catch(() => {});
    throw err;
  }
  await handle.move(`p${index}`);
}

/**
 * At the release: the stored ciphertext of this manifest's version, decrypted with
 * the opener (subscription.js) into the issue's own storage; the prefetch folder
 * removed. Returns the number of pieces moved. A piece that does not decrypt is left
 * to the download (which fetches it again).
 */
export async function adoptPrefetched(m, opener, note = () => {}) {
  const found = await storedCiphertext(m);
  if (found.size === 0) {
    await removeFolders(m.issue_id);
    return 0;
  }
  const indices = [...found.keys()].sort((a, b) => a - b);
  let run = { first: null, chunks: [], bytes: 0, fetched: 0 };
  let moved = 0;
  let fetchedBytes = 0; // ciphertext bytes taken from the origins before the release
  const flush = async () => {
    if (run.chunks.length) await writeRun(m.issue_id, run.first, run.chunks);
    moved += run.chunks.length;
    fetchedBytes += run.fetched;
    run = { first: null, chunks: [], bytes: 0, fetched: 0 };
  };
  for (const index of indices) {
    const bytes = new Uint8Array(await (await found.get(index).getFile()).arrayBuffer());
    let plain;
    try {
      if (!(await pieceOk(m, index, bytes))) throw new Error("does not match the manifest");
      plain = opener.decryptPiece(index, bytes);
    } catch (err) {
      note(`prefetch: piece ${index} on this device is not usable (${err?.message ?? err}); it is fetched again`);
      await flush();
      continue;
    }
    if (run.first !== null && run.first + run.chunks.length !== index) await flush();
    if (run.first === null) run.first = index;
    run.chunks.push(plain);
    run.bytes += plain.length;
    run.fetched += bytes.length;
    if (run.bytes >= RUN_BYTES) await flush();
  }
  await flush();
  await removeFolders(m.issue_id);
  // the library's "From origins" line counts them (app.js sourcesLine)
  await updateIssue(m.issue_id, { prefetched_bytes: fetchedBytes });
  return moved;
}
