// The reader's IndexedDB: the library's records, settings and the subscriber's keys.
//
// Stores (database "pressrun-reader", version 1):
//   issues    one record per issue in the library, keyed by issue_id: the signed
//             manifest's text, title, sizes, status ("downloading" | "complete"),
//             the cover (a PNG Blob), bytes per origin, handoffs, failures;
//   settings  small values by name (wifi_only, auto_download, seen_issues,
//             trusted_publishers, ...);
//   keys      the subscriber's key pair; it never leaves the browser.
// The issue's bytes themselves are in the origin private file system (store.js).

const DB_NAME = "pressrun-reader";
const DB_VERSION = 1;
let opened = null;

function promised(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

export function openDb() {
  if (opened === null) {
    const request = indexedDB.open(DB_NAME, DB_VERSION);
    request.onupgradeneeded = () => {
      const db = request.result;
      if (!db.objectStoreNames.contains("issues")) db.createObjectStore("issues", { keyPath: "issue_id" });
      if (!db.objectStoreNames.contains("settings")) db.createObjectStore("settings");
      if (!db.objectStoreNames.contains("keys")) db.createObjectStore("keys");
    };
    opened = promised(request);
  }
  return opened;
}

async function run(store, mode, action) {
  const db = await openDb();
  const tx = db.transaction(store, mode);
  const result = await promised(action(tx.objectStore(store)));
  if (mode === "readwrite") {
    await new Promise((resolve, reject) => {
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
  }
  return result;
}

export const getRecord = (store, key) => run(store, "readonly", (s) => s.get(key));
export const allRecords = (store) => run(store, "readonly", (s) => s.getAll());
export const deleteRecord = (store, key) => run(store, "readwrite", (s) => s.delete(key));
export function putRecord(store, value, key) {
  return run(store, "readwrite", (s) => (key === undefined ? s.put(value) : s.put(value, key)));
}

/** Store ``value`` under ``key`` only if nothing is there yet (ConstraintError if something is). */
export const addRecord = (store, value, key) => run(store, "readwrite", (s) => s.add(value, key));

export async function getSetting(name, fallback) {
  const value = await getRecord("settings", name);
  return value === undefined ? fallback : value;
}
export const putSetting = (name, value) => putRecord("settings", value, name);

/** Update an issue record in place (read, change, write); returns the new record. */
export async function updateIssue(issueId, change) {
  const record = (await getRecord("issues", issueId)) ?? { issue_id: issueId };
  const next = { ...record, ...change };
  await putRecord("issues", next);
  return next;
}
