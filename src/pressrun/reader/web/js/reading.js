// The reading view: an issue open in pdf.js, its pages, zoom, spreads and page strip.
//
// The page fits the screen at zoom 1; pinch (two fingers) or double tap zooms in up
// to MAX_ZOOM around the fingers, and the page is drawn again by pdf.js at
// devicePixelRatio x zoom, so text stays sharp. A zoomed page pans by the surface's
// own scrolling (touch-action: pan-x pan-y: the browser scrolls, the app zooms). At
// zoom 1 a swipe or a tap on the outer thirds turns the page; a tap in the middle
// shows or hides the toolbars. On a tablet in landscape two pages are shown side by
// side (pages.js: the cover alone, then 2-3, 4-5, ...) and zoom and turns act on the
// spread; "Pages" opens a strip of page thumbnails. The page an issue was left at is
// kept per issue (settings store, position:<id>).
//
// app.js calls setUpReading once ({hooks, onClose}) and openIssue(id) from the
// library; hooks.openTimesMs and hooks.lastRender are this view's figures.

import { getRecord, getSetting, putSetting } from "./db.js";
import { PageStrip, nextPage, previousPage, showsSpreads, shownPages } from "./pages.js";
import { issueBlob } from "./store.js";

// pdf.js (425 KB) is loaded when first needed (viewer.js)
const viewer = () => import("./viewer.js");
const $ = (selector) => document.querySelector(selector);
let reading = null; // {issueId, doc, page, pages, zoom, drawn, kept}
let hooks = { openTimesMs: [] };
let onClose = async () => {};

const MAX_ZOOM = 5;
const DOUBLE_TAP_STEPS = [1, 2, 4]; // each double tap zooms to the next, then back to 1
const DOUBLE_TAP_MS = 300;

/** Open stored issue `id` in the reading view, at the page it was left at. */
export async function openIssue(id) {
  const started = performance.now();
  const record = await getRecord("issues", id);
  const blob = await issueBlob(id, record.num_pieces, "application/pdf");
  if (reading) await reading.doc.destroy();
  strip.reset();
  const doc = await (await viewer()).openPdf(blob);
  reading = { issueId: id, doc, page: 1, pages: doc.numPages, zoom: 1, drawn: 0 };
  $("#library-view").hidden = true;
  $("#settings-view").hidden = true;
  $("#notices").hidden = true;
  $("#reader-view").hidden = false;
  document.body.classList.add("reading");
  showChrome(true);
  $("#reader-title").textContent = record.title || id;
  // where the reader left this issue (kept per issue, in the settings store)
  const left = Number(await getSetting(`position:${id}`, 1)) || 1;
  await showPage(Math.min(Math.max(1, left), doc.numPages));
  const ms = performance.now() - started;
  hooks.openTimesMs.push(ms);
  $("#reader-view").dataset.openedMs = ms.toFixed(1);
}

/** The CSS width each of the pages `shown` gets at zoom 1: its share of the
 * surface's width, or less so that the whole page fits the surface's height. */
async function fitWidth(shown) {
  const surface = $("#page-surface");
  const width = Math.min(surface.clientWidth || window.innerWidth, 900 * shown.length) / shown.length;
  const height = surface.clientHeight || window.innerHeight;
  const aspect = await (await viewer()).pageAspect(reading.doc, shown[0]);
  return Math.max(100, Math.floor(Math.min(width, height * aspect)));
}

/** Whether the reading view shows two-page spreads now (a tablet in landscape). */
function spreadView() {
  const surface = $("#page-surface");
  return showsSpreads(surface.clientWidth || window.innerWidth, surface.clientHeight || window.innerHeight);
}

/**
 * Draw page `n` at `zoom` into a new canvas that replaces the shown one when it is
 * drawn (so the old page stays on screen meanwhile, and a newer request wins over an
 * older one still drawing). `focus` {x, y, fx, fy}: keep the point at fraction
 * (fx, fy) of the page under the client point (x, y).
 */
async function drawPage(wanted, zoom, focus = null) {
  const r = reading;
  if (!r || wanted < 1 || wanted > r.pages) return;
  const ticket = ++r.drawn;
  const shown = shownPages(wanted, r.pages, spreadView());
  const n = shown[0];
  r.page = n;
  r.zoom = zoom;
  const started = performance.now();
  const canvas = document.createElement("canvas");
  const width = await fitWidth(shown);
  const { renderPage, renderSpread } = await viewer();
  const size =
    shown.length === 2 ? await renderSpread(r.doc, shown, canvas, width, zoom) : await renderPage(r.doc, n, canvas, width, zoom);
  if (reading !== r || r.drawn !== ticket) return; // a newer page or zoom won
  const old = $("#page");
  canvas.id = "page";
  canvas.dataset.page = String(n);
  canvas.dataset.pages = shown.join("-");
  canvas.dataset.zoom = String(zoom);
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", shown.length === 2 ? `Pages ${n} and ${n + 1} of ${r.pages}` : `Page ${n} of ${r.pages}`);
  old.replaceWith(canvas);
  const surface = $("#page-surface");
  surface.classList.toggle("zoomed", zoom > 1);
  if (focus) {
    const box = canvas.getBoundingClientRect();
    surface.scrollLeft += box.left + focus.fx * box.width - focus.x;
    surface.scrollTop += box.top + focus.fy * box.height - focus.y;
  } else {
    surface.scrollTo(0, 0);
  }
  $("#page-number").textContent = `${shown.join("–")} / ${r.pages}`;
  if (n !== r.kept) {
    r.kept = n;
    putSetting(`position:${r.issueId}`, n).catch(() => {});
  }
  hooks.lastRender = { page: n, pages: shown, zoom, ...size, ms: performance.now() - started };
}

function showPage(n) {
  return drawPage(n, 1);
}

/** Turn forward (+1) or back (-1): a page, or a spread. */
function turn(direction) {
  const r = reading;
  if (!r) return Promise.resolve();
  const step = direction > 0 ? nextPage : previousPage;
  return showPage(step(r.page, r.pages, spreadView()));
}

const strip = new PageStrip(document.querySelector("#thumbnails"), {
  onPick: (n) => {
    strip.close();
    showPage(n);
  },
});

function togglePages() {
  if (!reading) return;
  if (strip.isOpen) strip.close();
  else strip.open(reading);
  $("#pages-button").setAttribute("aria-expanded", String(strip.isOpen));
}

/** The fraction of the page under client point (x, y), from the canvas as shown. */
function pageFraction(x, y) {
  const box = $("#page").getBoundingClientRect();
  return { x, y, fx: (x - box.left) / box.width, fy: (y - box.top) / box.height };
}

/** Zoom to `zoom` (1..MAX_ZOOM) keeping the page point under (x, y) where it is. */
function zoomTo(zoom, x, y) {
  const r = reading;
  if (!r) return Promise.resolve();
  const z = Math.min(MAX_ZOOM, Math.max(1, zoom));
  return drawPage(r.page, z, z > 1 ? pageFraction(x, y) : null);
}

function showChrome(show) {
  $("#reader-view").classList.toggle("immersive", !show);
  if (!show && strip.isOpen) togglePages();
}

async function closeReader() {
  strip.reset();
  if (reading) await reading.doc.destroy();
  reading = null;
  document.body.classList.remove("reading");
  // an empty page, so the next issue opened does not show this one's page meanwhile
  const blank = document.createElement("canvas");
  blank.id = "page";
  $("#page").replaceWith(blank);
  $("#reader-view").hidden = true;
  $("#library-view").hidden = false;
  $("#notices").hidden = false;
  await onClose();
}

/** Wire the reading view once: `hooks` (window.pressrun) gets the view's figures,
 * `onClose` runs when the reader goes back to the library. */
export function setUpReading({ hooks: appHooks, onClose: closed }) {
  hooks = appHooks;
  onClose = closed;
  const surface = $("#page-surface");
  let swipe = null; // one finger at zoom 1: {x, y}
  let pinch = null; // two fingers: {distance, zoom, focus}
  const spread = (t) => Math.hypot(t[0].clientX - t[1].clientX, t[0].clientY - t[1].clientY);
  const middle = (t) => ({ x: (t[0].clientX + t[1].clientX) / 2, y: (t[0].clientY + t[1].clientY) / 2 });
  surface.addEventListener("touchstart", (e) => {
    if (!reading) return;
    if (e.touches.length === 2) {
      const m = middle(e.touches);
      pinch = { distance: spread(e.touches) || 1, zoom: reading.zoom, focus: pageFraction(m.x, m.y), scale: 1 };
      swipe = null;
    } else if (e.touches.length === 1 && !pinch) {
      swipe = { x: e.touches[0].clientX, y: e.touches[0].clientY };
    }
  }, { passive: true });
  surface.addEventListener("touchmove", (e) => {
    if (!pinch || e.touches.length < 2) return;
    e.preventDefault(); // the app zooms, not the browser
    const zoom = Math.min(MAX_ZOOM, Math.max(1, (pinch.zoom * spread(e.touches)) / pinch.distance));
    pinch.scale = zoom / pinch.zoom;
    const m = middle(e.touches);
    pinch.focus.x = m.x;
    pinch.focus.y = m.y;
    // a preview while the fingers move: the drawn page scaled around the fingers
    const canvas = $("#page");
    canvas.style.transformOrigin = `${pinch.focus.fx * 100}% ${pinch.focus.fy * 100}%`;
    canvas.style.transform = `scale(${pinch.scale})`;
  }, { passive: false });
  surface.addEventListener("touchend", (e) => {
    if (!reading) return;
    if (pinch && e.touches.length < 2) {
      const { zoom, scale, focus } = pinch;
      pinch = null;
      const canvas = $("#page");
      canvas.style.transform = "";
      const target = zoom * scale;
      if (Math.abs(target - zoom) > 0.05) {
        // the page point between the fingers stays between them
        const r = reading;
        drawPage(r.page, Math.min(MAX_ZOOM, Math.max(1, target)), target > 1 ? focus : null);
      }
      return;
    }
    if (!swipe || reading.zoom > 1) return;
    const dx = e.changedTouches[0].clientX - swipe.x;
    const dy = e.changedTouches[0].clientY - swipe.y;
    swipe = null;
    if (Math.abs(dx) > 50 && Math.abs(dx) > Math.abs(dy)) turn(dx < 0 ? 1 : -1);
  });
  // Taps: a single tap waits DOUBLE_TAP_MS to be sure it is not the first of two.
  let lastTap = null;
  let pendingTap = null;
  surface.addEventListener("click", (e) => {
    if (!reading) return;
    const now = performance.now();
    if (lastTap && now - lastTap.at < DOUBLE_TAP_MS && Math.hypot(e.clientX - lastTap.x, e.clientY - lastTap.y) < 40) {
      clearTimeout(pendingTap);
      lastTap = null;
      const zoom = reading.zoom;
      const next = DOUBLE_TAP_STEPS.find((z) => z > zoom + 0.01) ?? 1;
      zoomTo(next, e.clientX, e.clientY);
      return;
    }
    lastTap = { at: now, x: e.clientX, y: e.clientY };
    const x = e.clientX - surface.getBoundingClientRect().left;
    pendingTap = setTimeout(() => {
      if (!reading) return;
      const third = surface.clientWidth / 3;
      const immersive = $("#reader-view").classList.contains("immersive");
      if (strip.isOpen) togglePages();
      else if (reading.zoom === 1 && x > 2 * third) turn(1);
      else if (reading.zoom === 1 && x < third) turn(-1);
      else showChrome(immersive);
    }, DOUBLE_TAP_MS);
  });
  $("#next-page").onclick = () => turn(1);
  $("#previous-page").onclick = () => turn(-1);
  $("#pages-button").onclick = togglePages;
  // a keyboard (a tablet's, a desktop's): arrows and Page Up/Down turn, Escape closes
  document.addEventListener("keydown", (e) => {
    if (!reading || e.target.closest?.("input, textarea")) return;
    if (e.key === "ArrowRight" || e.key === "PageDown") turn(1);
    else if (e.key === "ArrowLeft" || e.key === "PageUp") turn(-1);
    else if (e.key === "Escape" && strip.isOpen) togglePages();
    else return;
    e.preventDefault();
  });
  $("#back").onclick = closeReader;
  window.addEventListener("resize", () => reading && drawPage(reading.page, reading.zoom));
}
