// The reader's service worker (a module worker): the app opens offline, and new
// issues are looked for in the background where the browser offers Periodic
// Background Sync.
//
// - install: the app shell (every file the app needs to start and to show a stored
//   issue: modules, styles, icons, libsodium.js, pdf.js and its worker, config.json)
//   goes into a cache named after the build; the server puts the build hash in place
//   of the placeholder below, so a changed file means a new worker and a new cache;
// - activate: older caches are deleted;
// - fetch: same-origin GETs come from the cache first (config.json from the network
//   first, so a changed balancer address is seen when online); pdf.js's fonts and
//   CMaps are cached as they are first used; requests to the balancer and the
//   origins (other origins) are not touched;
// - periodicsync "pressrun-new-issues": ask the balancer which issues there are and
//   tell the open pages (they download new ones, by the Wi-Fi setting), or show a
//   notification when none is open and notifications are allowed.

import { checkNewIssues } from "./js/issues.js";

const BUILD = "__BUILD__";
const SHELL_CACHE = `pressrun-shell-${BUILD}`;
const RUNTIME_CACHE = `pressrun-runtime-${BUILD}`;
const SHELL = [
  "./",
  "index.html",
  "app.css",
  "app.webmanifest",
  "config.json",
  "icons/icon-192.png",
  "icons/icon-512.png",
  "js/app.js",
  "js/db.js",
  "js/dom.js",
  "js/download.js",
  "js/download-directive.js",
  "js/issues.js",
  "js/link.js",
  "js/manifest.js",
  "js/mixin.js",
  "js/notices.js",
  "js/pages.js",
  "js/prefetch.js",
  "js/prefetch-rules.js",
  "js/prefetch-store.js",
  "js/reading.js",
  "js/settings.js",
  "js/store.js",
  "js/store-worker.js",
  "js/subscription.js",
  "js/swarm.js",
  "js/swarm-bytes.js",
  "js/swarm-load.js",
  "js/swarm-peers.js",
  "js/swarm-rules.js",
  "js/swarm-status.js",
  "js/swarm-store.js",
  "js/swarm-web-seeds.js",
  "js/torrent.js",
  "js/viewer.js",
  "vendor/libsodium.mjs",
  "vendor/libsodium-wrappers.mjs",
  "vendor/pdfjs/pdf.min.mjs",
  "vendor/pdfjs/pdf.worker.min.mjs",
  "vendor/webtorrent.min.js",
];

self.addEventListener("install", (event) => {
  event.waitUntil(
    caches
      .open(SHELL_CACHE)
      .then((cache) => cache.addAll(SHELL.map((path) => new Request(path, { cache: "reload" }))))
      .then(() => self.skipWaiting()),
  );
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((names) =>
        Promise.all(names.filter((n) => n.startsWith("pressrun-") && !n.endsWith(BUILD)).map((n) => caches.delete(n))),
      )
      .then(() => self.clients.claim()),
  );
});

async function networkFirst(request) {
  const cache = await caches.open(SHELL_CACHE);
  try {
    const response = await fetch(request);
    if (response.ok) await cache.put(request, response.clone());
    return response;
  } catch (err) {
    const cached = await cache.match(request);
    if (cached) return cached;
    throw err;
  }
}

async function cacheFirst(request) {
  const cached = await caches.match(request, { ignoreSearch: true });
  if (cached) return cached;
  const response = await fetch(request);
  if (response.ok && new URL(request.url).pathname.includes("/vendor/")) {
    const cache = await caches.open(RUNTIME_CACHE);
    await cache.put(request, response.clone());
  }
  return response;
}

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (request.method !== "GET" || url.origin !== self.location.origin) return;
  if (url.pathname.includes("/v1/link/")) return; // a linking mailbox: the network only
  if (url.pathname.endsWith("/config.json")) {
    event.respondWith(networkFirst(request));
  } else if (request.mode === "navigate") {
    event.respondWith(caches.match("index.html").then((cached) => cached ?? fetch(request)));
  } else {
    event.respondWith(cacheFirst(request));
  }
});

async function lookForNewIssues() {
  const cache = await caches.open(SHELL_CACHE);
  const cached = await cache.match("config.json");
  if (!cached) return;
  const config = await cached.json();
  const { fresh } = await checkNewIssues(config.balancer_urls ?? config.balancer_url);
  if (fresh.length === 0) return;
  const pages = await self.clients.matchAll({ type: "window" });
  for (const page of pages) page.postMessage({ type: "new-issues", issues: fresh });
  if (pages.length === 0 && self.Notification?.permission === "granted") {
    await self.registration.showNotification("New issue out", { body: fresh.join(", "), icon: "icons/icon-192.png" });
  }
}

self.addEventListener("periodicsync", (event) => {
  if (event.tag === "pressrun-new-issues") event.waitUntil(lookForNewIssues());
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(self.clients.openWindow("./"));
});
