// The OPFS writer of store.js, in a dedicated worker: a run of pieces is written
// through a FileSystemSyncAccessHandle (synchronous writes at an offset, which only a
// worker may open) instead of the window's createWritable(), whose swap file and
// close() cost ~5x more: 50 MB in 4 MB runs took 500-800 ms with createWritable() and
// 90-160 ms here (Chromium 2026-11-28, docs/reader.md "Measured"). Same rule as
// store.js: written under its t-name, flushed and closed, and only then renamed to its
// r-name, so an r-file is whole.
//
// Message in: {id, issueId, first, chunks: [Uint8Array]}. Out: {id} (written, as
// r<first>_<count>) or {id, error: {name, message}}; {id, error: {name:
// "NotSupportedError"}} when this browser has no sync access handles (store.js then
// writes from the window).

let issuesFolder = null; // the "issues" folder's handle (a promise), looked up once

async function issueDir(issueId) {
  if (issuesFolder === null) {
    const lookup = navigator.storage.getDirectory().then((root) => root.getDirectoryHandle("issues", { create: true }));
    issuesFolder = lookup;
    lookup.catch(() => {
      if (issuesFolder === lookup) issuesFolder = null; // asked again next time
    });
  }
  return (await issuesFolder).getDirectoryHandle(issueId, { create: true });
}

async function writeRun(issueId, first, chunks) {
  const dir = await issueDir(issueId);
  const name = `${first}_${chunks.length}`;
  const handle = await dir.getFileHandle(`t${name}`, { create: true });
  if (typeof handle.createSyncAccessHandle !== "function") {
    throw new DOMException("no sync access handles in this browser", "NotSupportedError");
  }
  const access = await handle.createSyncAccessHandle();
  try {
    access.truncate(0);
    let at = 0;
    for (const chunk of chunks) {
      let done = 0;
      // write() may write less than asked (a full disk): go on from where it stopped
      while (done < chunk.length) {
        const n = access.write(chunk.subarray(done), { at: at + done });
        if (n <= 0) throw new DOMException("the device refused to store more bytes", "QuotaExceededError");
        done += n;
      }
      at += chunk.length;
    }
    access.flush();
  } finally {
    access.close();
  }
  await handle.move(`r${name}`);
}

onmessage = async (event) => {
  const { id, issueId, first, chunks } = event.data;
  try {
    // no handle back: one moved here and posted still names the t-file in Chromium
    await writeRun(issueId, first, chunks);
    postMessage({ id });
  } catch (err) {
    postMessage({ id, error: { name: err?.name ?? "Error", message: String(err?.message ?? err) } });
  }
};
