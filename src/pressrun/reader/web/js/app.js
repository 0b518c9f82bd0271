// The reader's UI: the library (covers, sizes, progress, delete) and the background
// work (new-issue check, downloads, resume). The reading view is reading.js, the
// settings (and linking devices) settings.js, the notices notices.js.
//
// window.pressrun exposes the app's state for the tests and the benchmark: `ready`
// (a promise), `results` (finished downloads by issue), `errors` (by issue),
// `notices`, `openTimesMs` (open -> page 1 drawn, per opening), `viewerReady` (pdf.js's
// worker is up), `serviceWorkerReady` (its registration done or told), `swarm()` (each issue's swarm figures: peers, bytes from peers and
// from web seeds, uploaded, bans, state and the rule it left by).

import { allRecords, deleteRecord, getRecord, getSetting, putSetting, updateIssue } from "./db.js";
import { Download, DownloadError } from "./download.js";
import { checkNewIssues } from "./issues.js";
import { $, element } from "./dom.js";
import { acceptLink } from "./link.js";
import { forReader, note, noticeLog, notesElement, notice } from "./notices.js";
import { deleteIssueFiles, issueBlob, issueBytes, storageEstimate } from "./store.js";
import { openIssue, setUpReading } from "./reading.js";
import { linkAction, setUpSettings } from "./settings.js";
import { prepareDecryption, stillNotSubscribed, subscriberPublicKey } from "./subscription.js";
import { forgetPrefetch, prefetchStatus, unfinishedPrefetches, withPrefetch } from "./prefetch.js";
import { leaveSwarm } from "./swarm.js";
// pdf.js (425 KB) is loaded once the library is on screen, not before it (viewer.js)
const viewer = () => import("./viewer.js");

const state = {
  config: null,
  available: [],
  downloads: new Map(), // issue id -> {controller, progress, waiting}
  notSubscribed: false, // the subscription service said this reader is not a subscriber
  shareUploads: true, // the "Share issues with other readers" setting
  swarm: new Map(), // issue id -> its swarm status (swarm.js SwarmFetch.status())
};
const hooks = { results: {}, errors: {}, notices: noticeLog, openTimesMs: [] };
window.pressrun = hooks;

// -- small helpers

function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KB", "MB", "GB", "TB"];
  let v = n;
  let u = -1;
  do {
    v /= 1000;
    u += 1;
  } while (v >= 1000 && u < units.length - 1);
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

// -- network policy (Wi-Fi only)

function connectionType() {
  return navigator.connection?.type ?? "unknown";
}

async function networkAllowed() {
  if (!(await getSetting("wifi_only", true))) return true;
  // Only where the browser says what the link is (Chrome on Android, ChromeOS):
  // elsewhere the type is unknown and the download goes ahead.
  return connectionType() !== "cellular";
}

// Uploading to peers: only while the setting allows it and the network is not
// metered: the Wi-Fi only rule (a cellular link), and Data Saver (`saveData`), where
// the browser says so.
function metered() {
  return connectionType() === "cellular" || navigator.connection?.saveData === true;
}

function uploadAllowed() {
  return state.shareUploads && !metered();
}

async function waitForNetwork(issueId, signal) {
  while (!(await networkAllowed())) {
    const entry = state.downloads.get(issueId);
    if (entry && !entry.waiting) {
      entry.waiting = true;
      renderLibrary();
      notice(`Waiting for Wi-Fi to download ${issueId}: the "Wi-Fi only" setting is on.`, {
        key: `issue:${issueId}`,
        detail: "navigator.connection.type is cellular",
      });
    }
    await new Promise((resolve, reject) => {
      const done = () => {
        navigator.connection?.removeEventListener("change", done);
        window.removeEventListener("pressrun-settings", done);
        resolve();
      };
      navigator.connection?.addEventListener("change", done);
      window.addEventListener("pressrun-settings", done);
      signal.addEventListener("abort", () => reject(signal.reason), { once: true });
    });
  }
  const entry = state.downloads.get(issueId);
  if (entry?.waiting) {
    entry.waiting = false;
    renderLibrary();
  }
}

// -- downloads

export async function startDownload(issueId) {
  if (state.downloads.has(issueId)) return state.downloads.get(issueId).promise;
  const controller = new AbortController();
  const entry = { controller, progress: null, waiting: false, promise: null };
  state.downloads.set(issueId, entry);
  if (navigator.storage?.persist && !(await navigator.storage.persisted())) {
    // ask once per download: a browser may grant it later (e.g. once installed)
    await navigator.storage.persist().catch(() => false);
  }
  const download = new Download({
    issueId,
    config: state.config,
    signal: controller.signal,
    // an embargoed issue's ciphertext comes in the background before its release
    prepareDecryption: withPrefetch(prepareDecryption, {
      config: state.config,
      note: (text) => note(issueId, text),
      progress: (p) => updateProgress(issueId, p),
      waitForNetwork: (signal) => waitForNetwork(issueId, signal),
      uploadAllowed, // the prefetchers' swarm: joined only where the reader may upload
    }),
    hooks: {
      progress: (p) => {
        entry.progress = p;
        updateProgress(issueId, p);
      },
      notice: (text) => note(issueId, text),
      waitForNetwork: (signal) => waitForNetwork(issueId, signal),
      networkAllowed,
    },
    uploadAllowed,
    onSwarm: (fetcher) => swarmChanged(issueId, fetcher),
  });
  entry.promise = (async () => {
    renderLibrary();
    try {
      const result = await download.run();
      const record = await getRecord("issues", issueId);
      const blob = await issueBlob(issueId, record.num_pieces, "application/pdf");
      try {
        await updateIssue(issueId, { cover: await (await viewer()).renderCover(blob) });
      } catch (err) {
        note(issueId, `no cover: ${err.message}`);
      }
      hooks.results[issueId] = result;
      notice(`${record.title || issueId} is ready to read (${formatBytes(record.size_bytes)}).`, { key: `issue:${issueId}` });
      const fetcher = download.swarmFetch;
      if (fetcher?.state === "seeding") {
        // stay a peer while the page is open, until the fair-exit rule lets it go
        const downloaded =
          fetcher.fromPeers + fetcher.fromWebSeeds + Object.values(result.bytes_by_origin).reduce((a, b) => a + b, 0);
        fetcher.seed(downloaded).catch((err) => note(issueId, `sharing stopped: ${err.message}`));
      }
      return result;
    } catch (err) {
      if (controller.signal.aborted) return null;
      const message = err instanceof DownloadError ? err.message : `${issueId}: ${err.message ?? err}`;
      let record;
      try {
        record = await getRecord("issues", issueId);
        const said = forReader(message, record?.title || issueId);
        if (said.subscribe) await notSubscribed(issueId, said);
        else notice(said.text, { kind: "error", detail: message, key: `issue:${issueId}` });
      } finally {
        // the hook says "failed" only once the reader has been told (tests wait on it)
        hooks.errors[issueId] = message;
      }
      if (record !== undefined && record.status === "downloading") {
        await updateIssue(issueId, { status: "failed", error: message });
      } else if (record !== undefined && record.status === undefined) {
        await deleteRecord("issues", issueId); // nothing of it was accepted
      }
      return null;
    } finally {
      state.downloads.delete(issueId);
      renderLibrary();
    }
  })();
  return entry.promise;
}

/**
 * The subscription service said this reader is not a subscriber: say once (ever) how
 * to subscribe, drop the issue's notices, and offer no downloads until a check finds
 * the reader subscribed (stillNotSubscribed).
 */
async function notSubscribed(issueId, said) {
  state.notSubscribed = true;
  for (const old of document.querySelectorAll(`#notices .notice[data-key="issue:${CSS.escape(issueId)}"]`)) old.remove();
  if (!(await getSetting("told_to_subscribe", false))) {
    await putSetting("told_to_subscribe", true);
    notice(said.text, { kind: "subscribe", detail: said.detail, key: "subscribe" });
  }
}

let swarmRender = null;
function swarmChanged(issueId, fetcher) {
  const status = fetcher.status();
  const before = state.swarm.get(issueId);
  state.swarm.set(issueId, status);
  if (status.state === "left" && before?.state !== "left") {
    updateIssue(issueId, { uploaded_bytes: status.uploaded_bytes, leave_rule: status.leave_rule }).catch(() => {});
  }
  // the library's line for the issue, at most every half second
  swarmRender ??= setTimeout(() => {
    swarmRender = null;
    swarmLines();
  }, 500);
}

/** issue id -> what its library item was drawn from: {record, active, swarmState} */
const drawn = new Map();

/**
 * The swarm's figures in the library: each issue's `.sources` line set in place while
 * its item shows what it was drawn for (the same swarm state, still downloading or
 * not); the whole library drawn again only when that changed.
 *
 * Why: the swarm tells its changes every 250 ms while downloading and every 500 ms
 * while sharing, and each drew the whole library: every issue's record from
 * IndexedDB, each stored issue's size from its OPFS runs (a swarm download stores its
 * scattered pieces one file each: 153 files for 20 MB, each asked of the browser
 * process), the storage estimate, and the list's DOM. A page sharing an issue nobody
 * asked for spent 121 CPU ms a second on it against 1.7 for a page that downloaded
 * from the origins (bench/reader_swarm.py --readers 2 --desktops 0 --idle-s 20).
 */
function swarmLines() {
  for (const [id, swarm] of state.swarm) {
    const was = drawn.get(id);
    const item = document.querySelector(`li[data-issue="${CSS.escape(id)}"]`);
    const active = state.downloads.has(id);
    if (item === null) continue; // not in the library (deleted, or not drawn yet)
    if (was === undefined || was.active !== active || was.swarmState !== swarm.state) {
      renderLibrary();
      return;
    }
    const line = item.querySelector(".sources");
    const text = sourcesText(was.record, active, swarm);
    if (line !== null && text !== null && line.textContent !== text) line.textContent = text;
  }
}

/** An issue's `.sources` line: while downloading, its swarm's peers and bytes (none
 * outside a swarm); once stored, where its bytes came from and what it shared; else
 * none (null). */
function sourcesText(record, active, swarm) {
  if (active) {
    if (!swarm || swarm.state === "left") return null;
    return `${swarm.peers} peer(s) · from peers ${formatBytes(swarm.bytes_from_peers)} · from origins ${formatBytes(swarm.bytes_from_web_seeds)}`;
  }
  return record.status === "complete" ? sourcesLine(record, swarm) : null;
}

/** "From origins 1.2 MB · from peers 3.4 MB" for an issue's record (and its swarm). */
function sourcesLine(record, swarm) {
  const origins =
    Object.values(record.bytes_by_origin ?? {}).reduce((a, b) => a + b, 0) +
    (record.bytes_from_web_seeds ?? 0) +
    (record.prefetched_bytes ?? 0); // an embargoed issue's ciphertext, fetched before its release (prefetch.js)
  let text = `From origins ${formatBytes(origins)} · from peers ${formatBytes(record.bytes_from_peers ?? 0)}`;
  const uploaded = swarm?.uploaded_bytes ?? record.uploaded_bytes;
  if (swarm?.state === "seeding") text += ` · sharing (${formatBytes(uploaded)} sent to ${swarm.peers} peer(s))`;
  else if (uploaded) text += ` · shared ${formatBytes(uploaded)}`;
  return text;
}

/** A download's progress bar and line, drawn at most every PROGRESS_MS (the latest
 * figures always drawn): the origin path reports after every chunk its connection
 * reads and the swarm after every piece it stores, tens a second, each a new frame of
 * the page to lay out and paint. */
const PROGRESS_MS = 250;
const progressDue = new Map(); // issue id -> the latest figures not drawn yet (a timer runs)

function updateProgress(issueId, p) {
  if (progressDue.has(issueId)) {
    progressDue.set(issueId, p);
    return;
  }
  drawProgress(issueId, p);
  progressDue.set(issueId, null);
  const later = () => {
    const due = progressDue.get(issueId);
    if (due === null || due === undefined) {
      progressDue.delete(issueId);
      return;
    }
    drawProgress(issueId, due);
    progressDue.set(issueId, null);
    setTimeout(later, PROGRESS_MS);
  };
  setTimeout(later, PROGRESS_MS);
}

function drawProgress(issueId, p) {
  const item = document.querySelector(`li[data-issue="${CSS.escape(issueId)}"]`);
  if (!item) return;
  const bar = item.querySelector("progress");
  const label = item.querySelector(".status");
  if (bar) {
    bar.max = p.total_bytes || 1;
    bar.value = p.done_bytes;
  }
  if (label) {
    label.textContent = `Downloading ${formatBytes(p.done_bytes)} of ${formatBytes(p.total_bytes)}`;
  }
}

// -- library

async function renderStorage() {
  const s = await storageEstimate();
  $("#storage").textContent =
    `Storage: ${formatBytes(s.usage)} used, ${formatBytes(Math.max(0, s.quota - s.usage))} available` +
    (s.persisted ? " · kept by the browser" : " · may be cleared by the browser when space runs low");
}

let rendering = Promise.resolve();
function renderLibrary() {
  rendering = rendering.then(drawLibrary, drawLibrary);
  return rendering;
}

async function drawLibrary() {
  const records = (await allRecords("issues")).filter((r) => r.status !== undefined);
  records.sort((a, b) => (b.added_at ?? 0) - (a.added_at ?? 0));
  const known = new Set(records.map((r) => r.issue_id));
  const list = $("#library");
  const items = [];
  for (const r of records) items.push(await issueItem(r));
  for (const id of state.available) {
    if (known.has(id)) continue;
    // a download that has not got its manifest yet (e.g. waiting for Wi-Fi)
    if (state.downloads.has(id)) items.push(await issueItem({ issue_id: id, status: "downloading" }));
    else items.push(availableItem(id));
  }
  list.replaceChildren(...items);
  $("#empty").hidden = items.length > 0;
  await renderStorage();
}

function coverElement(record) {
  if (record.cover instanceof Blob) {
    const img = element("img", { className: "cover", alt: `Cover of ${record.title}` });
    img.src = URL.createObjectURL(record.cover);
    img.onload = () => URL.revokeObjectURL(img.src);
    return img;
  }
  return element("div", { className: "cover placeholder", textContent: "PDF" });
}

async function issueItem(r) {
  const id = r.issue_id;
  const active = state.downloads.get(id);
  const li = element("li", { className: `issue ${active ? "downloading" : r.status}` });
  li.dataset.issue = id;
  const swarm = state.swarm.get(id);
  drawn.set(id, { record: r, active: active !== undefined, swarmState: swarm?.state });
  const sources = sourcesText(r, active !== undefined, swarm);
  const info = element("div", { className: "info" }, element("h2", { textContent: r.title || id }));
  const actions = element("div", { className: "actions" });
  if (r.status === "complete" && !active) {
    const stored = await issueBytes(id);
    info.append(element("p", { className: "meta", textContent: `${formatBytes(r.size_bytes)} · on this device (${formatBytes(stored)})` }));
    info.append(element("p", { className: "sources", textContent: sources }));
    actions.append(element("button", { className: "open", textContent: "Read", onclick: () => openIssue(id) }));
  } else if (active) {
    const p = active.progress;
    if (sources !== null) info.append(element("p", { className: "sources", textContent: sources }));
    info.append(
      element("p", {
        className: "status",
        textContent: active.waiting ? "Waiting for Wi-Fi" : p ? `Downloading ${formatBytes(p.done_bytes)} of ${formatBytes(p.total_bytes)}` : "Starting…",
      }),
      element("progress", { max: p?.total_bytes || 1, value: p?.done_bytes ?? 0 }),
    );
    actions.append(element("button", { className: "pause", textContent: "Pause", onclick: () => pauseDownload(id) }));
  } else {
    const text = r.status === "failed" ? `Stopped: ${forReader(r.error ?? "failed", r.title || id).text}` : "Paused";
    info.append(element("p", { className: `status ${r.status === "failed" ? "error" : ""}`, textContent: text }));
    actions.append(element("button", { className: "resume", textContent: "Resume", onclick: () => startDownload(id) }));
  }
  actions.append(deleteButton(id));
  const details = notesElement(id, r.status === "failed" && !active ? r.error : null);
  if (details) info.append(details);
  li.append(coverElement(r), info, actions);
  return li;
}

function availableItem(id) {
  const li = element("li", { className: "issue available" });
  li.dataset.issue = id;
  const actions = element("div", { className: "actions" });
  let meta = "Not on this device";
  if (state.notSubscribed) meta = "For subscribers: see Settings to subscribe";
  else actions.append(element("button", { className: "download", textContent: "Download", onclick: () => startDownload(id) }));
  li.append(
    element("div", { className: "cover placeholder", textContent: "NEW" }),
    element("div", { className: "info" }, element("h2", { textContent: id }), element("p", { className: "meta", textContent: meta })),
    actions,
  );
  return li;
}

function deleteButton(id) {
  // two taps, so a stray touch does not delete an issue
  const button = element("button", { className: "delete", textContent: "Delete" });
  button.onclick = async () => {
    if (!button.classList.contains("confirm")) {
      button.classList.add("confirm");
      button.textContent = "Tap to delete";
      setTimeout(() => {
        button.classList.remove("confirm");
        button.textContent = "Delete";
      }, 4000);
      return;
    }
    await deleteIssue(id);
  };
  return button;
}

function pauseDownload(id) {
  state.downloads.get(id)?.controller.abort(new DOMException("paused", "AbortError"));
  leaveSwarm(id);
}

export async function deleteIssue(id) {
  pauseDownload(id);
  await state.downloads.get(id)?.promise;
  await deleteIssueFiles(id);
  await forgetPrefetch(id);
  await deleteRecord("issues", id);
  await deleteRecord("settings", `position:${id}`);
  notice(`${id} deleted from this device.`, { key: `issue:${id}` });
  await renderLibrary();
}

// -- the new-issue check and background work

async function checkForIssues() {
  try {
    const { available, fresh } = await checkNewIssues(state.config.balancer_urls ?? state.config.balancer_url);
    state.available = available;
    if (state.notSubscribed && (await stillNotSubscribed()) === false) {
      state.notSubscribed = false;
      await putSetting("told_to_subscribe", false);
      notice("You are a subscriber now: new issues download here.", { kind: "new", key: "subscribe" });
    }
    // a reader who is not subscribed hears of no new issue it cannot open
    if (!state.notSubscribed) for (const id of fresh) notice(`New issue out: ${id}`, { kind: "new", key: `issue:${id}` });
    if (fresh.length && !state.notSubscribed && (await getSetting("auto_download", true))) {
      for (const id of fresh) startDownload(id);
    }
  } catch (err) {
    if (navigator.onLine) {
      notice("Could not look for new issues: the publisher's server did not answer. The app tries again next time it opens.", {
        kind: "error",
        detail: err.message,
        key: "check",
      });
    }
  }
  await renderLibrary();
}

async function resumeUnfinished() {
  for (const r of await allRecords("issues")) {
    if (r.status === "downloading") startDownload(r.issue_id);
  }
  // an embargoed issue whose ciphertext was being fetched (prefetch.js) goes on
  for (const id of await unfinishedPrefetches()) startDownload(id);
}

/** Waits before the service worker's registration is tried again (ms): a busy device's
 * Chromium refuses a worker it could not start in time ("ServiceWorker cannot be
 * started"), and the next attempt starts it; the reader is told only once every
 * attempt has failed. An insecure origin (SecurityError) is not tried again. */
const SW_RETRY_MS = [2000, 4000];

async function registerServiceWorker() {
  if (!("serviceWorker" in navigator)) return;
  let registration;
  for (let attempt = 0; !registration; attempt++) {
    try {
      registration = await navigator.serviceWorker.register("sw.js", { type: "module", scope: "./" });
    } catch (err) {
      if (attempt >= SW_RETRY_MS.length || err?.name === "SecurityError") throw err;
      console.warn(`service worker not registered (${err.message}): trying again`);
      await new Promise((resolve) => setTimeout(resolve, SW_RETRY_MS[attempt]));
    }
  }
  // Periodic Background Sync, where the browser offers it (an installed app in
  // Chromium): the service worker checks for new issues while the app is closed.
  if ("periodicSync" in registration) {
    try {
      const status = await navigator.permissions.query({ name: "periodic-background-sync" });
      if (status.state === "granted") {
        await registration.periodicSync.register("pressrun-new-issues", { minInterval: 6 * 3600 * 1000 });
        $("#periodic").textContent = "New issues are also checked in the background every few hours.";
      }
    } catch {
      // not offered here: the check runs each time the app opens
    }
  }
  navigator.serviceWorker.addEventListener("message", (e) => {
    if (e.data?.type === "new-issues") checkForIssues();
  });
}

async function loadConfig() {
  const resp = await fetch("config.json");
  if (!resp.ok) throw new Error(`config.json answered HTTP ${resp.status}`);
  return resp.json();
}

async function boot() {
  // config.json is fetched while the library is drawn from IndexedDB (it needs none)
  const config = loadConfig();
  state.notSubscribed = (await getSetting("not_subscribed", null)) !== null;
  // a line in the header while the browser says it is offline
  const online = () => {
    $("#offline").hidden = navigator.onLine;
  };
  window.addEventListener("online", online);
  window.addEventListener("offline", online);
  online();
  // the library first: what the reader came for is on screen before anything else loads
  await renderLibrary();
  state.config = await config;
  await setUpSettings({ state, hooks, checkForIssues });
  setUpReading({ hooks, onClose: renderLibrary });
  // then pdf.js and its worker, so an issue opens at once when tapped: when the
  // browser is idle, and only if there is an issue to read (a first visit on a slow
  // phone does not parse 425 KB of pdf.js it has no use for yet; a download's cover
  // or an issue opened loads it when needed)
  hooks.viewerReady = (async () => {
    if (!(await allRecords("issues")).some((r) => r.status === "complete")) return null;
    await new Promise((resolve) => (window.requestIdleCallback ?? setTimeout)(resolve, { timeout: 2000 }));
    return (await viewer()).warmUp();
  })().catch((err) =>
    notice("Issues cannot be shown in this browser (its PDF viewer did not start).", { kind: "error", detail: err.message, key: "viewer" }),
  );
  // the service worker beside the rest: a registration tried again (SW_RETRY_MS) must
  // not hold back the downloads and the check for new issues
  hooks.serviceWorkerReady = registerServiceWorker().catch((err) =>
    notice("This browser will not open the app offline (no service worker): read online, or open it over https.", {
      kind: "error",
      detail: err.message,
      key: "offline",
    }),
  );
  await resumeUnfinished();
  if (navigator.onLine) await checkForIssues();
}

hooks.ready = boot().catch((err) => {
  notice("The reader could not start. Reload the page; if it happens again, tell your publisher.", {
    kind: "error",
    detail: err.message,
    key: "app",
  });
  throw err;
});
hooks.startDownload = startDownload;
hooks.checkForIssues = checkForIssues;
hooks.subscriberPublicKey = subscriberPublicKey;
hooks.acceptLink = (code) => linkAction(() => acceptLink(code));
hooks.openIssue = openIssue;
hooks.deleteIssue = deleteIssue;
hooks.swarm = () => Object.fromEntries(state.swarm);
hooks.prefetch = prefetchStatus;
