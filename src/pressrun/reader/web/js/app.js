// The reader's UI: the library (covers, sizes, progress, delete), the reading view,
// the settings, and the background work (new-issue check, downloads, resume).
//
// window.pressrun exposes the app's state for the tests and the benchmark: `ready`
// (a promise), `results` (finished downloads by issue), `errors` (by issue),
// `notices`, `openTimesMs` (open -> page 1 drawn, per opening), `viewerReady` (pdf.js's
// worker is up), `swarm()` (each issue's swarm figures: peers, bytes from peers and
// from web seeds, uploaded, bans, state and the rule it left by).

import { allRecords, deleteRecord, getRecord, getSetting, putSetting, updateIssue } from "./db.js";
import { Download, DownloadError } from "./download.js";
import { checkNewIssues } from "./issues.js";
import { deleteIssueFiles, issueBlob, issueBytes, storageEstimate } from "./store.js";
import { prepareDecryption, subscriberPublicKey } from "./subscription.js";
import { leaveSwarm } from "./swarm.js";
import { openPdf, renderCover, renderPage, warmUp } from "./viewer.js";

const $ = (selector) => document.querySelector(selector);
const state = {
  config: null,
  available: [],
  downloads: new Map(), // issue id -> {controller, progress, waiting}
  reading: null, // {issueId, doc, page, pages}
  shareUploads: true, // the "Share issues with other readers" setting
  swarm: new Map(), // issue id -> its swarm status (swarm.js SwarmFetch.status())
};
const hooks = { results: {}, errors: {}, notices: [], openTimesMs: [] };
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

function notice(text, kind = "info") {
  hooks.notices.push({ text, kind });
  const box = $("#notices");
  const p = document.createElement("p");
  p.className = `notice ${kind}`;
  p.textContent = text;
  box.prepend(p);
  while (box.children.length > 4) box.lastChild.remove();
}

function element(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  Object.assign(el, props);
  for (const c of children) if (c !== null) el.append(c);
  return el;
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
      notice(`${issueId}: waiting for Wi-Fi (the Wi-Fi only setting is on; this is a cellular connection)`);
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
    prepareDecryption,
    hooks: {
      progress: (p) => {
        entry.progress = p;
        updateProgress(issueId, p);
      },
      notice: (text) => notice(`${issueId}: ${text}`),
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
        await updateIssue(issueId, { cover: await renderCover(blob) });
      } catch (err) {
        notice(`${issueId}: no cover (${err.message})`, "error");
      }
      hooks.results[issueId] = result;
      notice(`${record.title || issueId} is ready to read (${formatBytes(record.size_bytes)}, verified)`);
      const fetcher = download.swarmFetch;
      if (fetcher?.state === "seeding") {
        // stay a peer while the page is open, until the fair-exit rule lets it go
        const downloaded =
          fetcher.fromPeers + fetcher.fromWebSeeds + Object.values(result.bytes_by_origin).reduce((a, b) => a + b, 0);
        fetcher.seed(downloaded).catch((err) => notice(`${issueId}: ${err.message}`, "error"));
      }
      return result;
    } catch (err) {
      if (controller.signal.aborted) return null;
      const message = err instanceof DownloadError ? err.message : `${issueId}: ${err.message ?? err}`;
      hooks.errors[issueId] = message;
      notice(message, "error");
      const record = await getRecord("issues", issueId);
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
    renderLibrary();
  }, 500);
}

/** "From origins 1.2 MB · from peers 3.4 MB" for an issue's record (and its swarm). */
function sourcesLine(record, swarm) {
  const origins =
    Object.values(record.bytes_by_origin ?? {}).reduce((a, b) => a + b, 0) + (record.bytes_from_web_seeds ?? 0);
  let text = `From origins ${formatBytes(origins)} · from peers ${formatBytes(record.bytes_from_peers ?? 0)}`;
  const uploaded = swarm?.uploaded_bytes ?? record.uploaded_bytes;
  if (swarm?.state === "seeding") text += ` · sharing (${formatBytes(uploaded)} sent to ${swarm.peers} peer(s))`;
  else if (uploaded) text += ` · shared ${formatBytes(uploaded)}`;
  return text;
}

function updateProgress(issueId, p) {
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
  const info = element("div", { className: "info" }, element("h2", { textContent: r.title || id }));
  const actions = element("div", { className: "actions" });
  if (r.status === "complete" && !active) {
    const stored = await issueBytes(id);
    info.append(element("p", { className: "meta", textContent: `${formatBytes(r.size_bytes)} · on this device (${formatBytes(stored)})` }));
    info.append(element("p", { className: "sources", textContent: sourcesLine(r, state.swarm.get(id)) }));
    actions.append(element("button", { className: "open", textContent: "Read", onclick: () => openIssue(id) }));
  } else if (active) {
    const p = active.progress;
    const swarm = state.swarm.get(id);
    if (swarm && swarm.state !== "left") {
      info.append(
        element("p", {
          className: "sources",
          textContent: `${swarm.peers} peer(s) · from peers ${formatBytes(swarm.bytes_from_peers)} · from origins ${formatBytes(swarm.bytes_from_web_seeds)}`,
        }),
      );
    }
    info.append(
      element("p", {
        className: "status",
        textContent: active.waiting ? "Waiting for Wi-Fi" : p ? `Downloading ${formatBytes(p.done_bytes)} of ${formatBytes(p.total_bytes)}` : "Starting…",
      }),
      element("progress", { max: p?.total_bytes || 1, value: p?.done_bytes ?? 0 }),
    );
    actions.append(element("button", { className: "pause", textContent: "Pause", onclick: () => pauseDownload(id) }));
  } else {
    const text = r.status === "failed" ? `Stopped: ${r.error ?? "failed"}` : "Paused";
    info.append(element("p", { className: `status ${r.status === "failed" ? "error" : ""}`, textContent: text }));
    actions.append(element("button", { className: "resume", textContent: "Resume", onclick: () => startDownload(id) }));
  }
  actions.append(deleteButton(id));
  li.append(coverElement(r), info, actions);
  return li;
}

function availableItem(id) {
  const li = element("li", { className: "issue available" });
  li.dataset.issue = id;
  li.append(
    element("div", { className: "cover placeholder", textContent: "NEW" }),
    element("div", { className: "info" }, element("h2", { textContent: id }), element("p", { className: "meta", textContent: "Not on this device" })),
    element("div", { className: "actions" }, element("button", { className: "download", textContent: "Download", onclick: () => startDownload(id) })),
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
  await deleteRecord("issues", id);
  notice(`${id} deleted from this device`);
  await renderLibrary();
}

// -- reading

export async function openIssue(id) {
  const started = performance.now();
  const record = await getRecord("issues", id);
  const blob = await issueBlob(id, record.num_pieces, "application/pdf");
  if (state.reading) await state.reading.doc.destroy();
  const doc = await openPdf(blob);
  state.reading = { issueId: id, doc, page: 1, pages: doc.numPages };
  $("#library-view").hidden = true;
  $("#settings-view").hidden = true;
  $("#notices").hidden = true;
  $("#reader-view").hidden = false;
  $("#reader-title").textContent = record.title || id;
  await showPage(1);
  const ms = performance.now() - started;
  hooks.openTimesMs.push(ms);
  $("#reader-view").dataset.openedMs = ms.toFixed(1);
}

async function showPage(n) {
  const r = state.reading;
  if (!r || n < 1 || n > r.pages) return;
  r.page = n;
  const canvas = $("#page");
  const width = Math.min($("#reader-view").clientWidth || window.innerWidth, 900);
  await renderPage(r.doc, n, canvas, width);
  $("#page-number").textContent = `${n} / ${r.pages}`;
  canvas.dataset.page = String(n);
}

async function closeReader() {
  if (state.reading) await state.reading.doc.destroy();
  state.reading = null;
  $("#reader-view").hidden = true;
  $("#library-view").hidden = false;
  $("#notices").hidden = false;
  await renderLibrary();
}

function setUpReaderGestures() {
  const surface = $("#page-surface");
  let touchStart = null;
  surface.addEventListener("touchstart", (e) => {
    touchStart = { x: e.touches[0].clientX, y: e.touches[0].clientY };
  }, { passive: true });
  surface.addEventListener("touchend", (e) => {
    if (!touchStart || !state.reading) return;
    const dx = e.changedTouches[0].clientX - touchStart.x;
    touchStart = null;
    if (Math.abs(dx) > 50) showPage(state.reading.page + (dx < 0 ? 1 : -1));
  });
  // a tap on the right third turns the page forward, on the left third back
  surface.addEventListener("click", (e) => {
    if (!state.reading) return;
    const third = surface.clientWidth / 3;
    if (e.offsetX > 2 * third) showPage(state.reading.page + 1);
    else if (e.offsetX < third) showPage(state.reading.page - 1);
  });
  $("#next-page").onclick = () => state.reading && showPage(state.reading.page + 1);
  $("#previous-page").onclick = () => state.reading && showPage(state.reading.page - 1);
  $("#back").onclick = closeReader;
}

// -- settings

async function setUpSettings() {
  const wifi = $("#wifi-only");
  const auto = $("#auto-download");
  const share = $("#share-uploads");
  wifi.checked = await getSetting("wifi_only", true);
  auto.checked = await getSetting("auto_download", true);
  share.checked = state.shareUploads = await getSetting("share_uploads", true);
  share.onchange = async () => {
    state.shareUploads = share.checked;
    await putSetting("share_uploads", share.checked);
  };
  wifi.onchange = async () => {
    await putSetting("wifi_only", wifi.checked);
    window.dispatchEvent(new Event("pressrun-settings"));
  };
  auto.onchange = () => putSetting("auto_download", auto.checked);
  $("#connection").textContent = navigator.connection?.type
    ? `This connection: ${navigator.connection.type}`
    : "This browser does not say whether the connection is Wi-Fi; downloads go ahead.";
  $("#settings-button").onclick = () => {
    $("#settings-view").hidden = !$("#settings-view").hidden;
  };
  $("#check-now").onclick = () => checkForIssues();
  const key = await subscriberPublicKey();
  $("#subscriber-key").textContent = key;
  $("#subscription").dataset.key = key;
}

// -- the new-issue check and background work

async function checkForIssues() {
  try {
    const { available, fresh } = await checkNewIssues(state.config.balancer_urls ?? state.config.balancer_url);
    state.available = available;
    for (const id of fresh) notice(`New issue out: ${id}`, "new");
    if (fresh.length && (await getSetting("auto_download", true))) {
      for (const id of fresh) startDownload(id);
    }
  } catch (err) {
    if (navigator.onLine) notice(`Could not check for new issues: ${err.message}`, "error");
  }
  await renderLibrary();
}

async function resumeUnfinished() {
  for (const r of await allRecords("issues")) {
    if (r.status === "downloading") startDownload(r.issue_id);
  }
}

async function registerServiceWorker() {
  if (!("serviceWorker" in navigator)) return;
  const registration = await navigator.serviceWorker.register("sw.js", { type: "module", scope: "./" });
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
  hooks.viewerReady = warmUp().catch((err) => notice(`The issue viewer could not start: ${err.message}`, "error"));
  state.config = await loadConfig();
  await setUpSettings();
  setUpReaderGestures();
  await renderLibrary();
  await registerServiceWorker().catch((err) => notice(`Offline use is not available: ${err.message}`, "error"));
  await resumeUnfinished();
  if (navigator.onLine) await checkForIssues();
}

hooks.ready = boot().catch((err) => {
  notice(`The reader could not start: ${err.message}`, "error");
  throw err;
});
hooks.startDownload = startDownload;
hooks.checkForIssues = checkForIssues;
hooks.subscriberPublicKey = subscriberPublicKey;
hooks.openIssue = openIssue;
hooks.deleteIssue = deleteIssue;
hooks.swarm = () => Object.fromEntries(state.swarm);
