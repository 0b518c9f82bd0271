// Showing a stored issue with pdf.js (npm pdfjs-dist, served under vendor/pdfjs/).
//
// The issue is a disk-backed Blob (store.js); pdf.js reads it through a
// PDFDataRangeTransport that answers each range it asks for with blob.slice(), so
// opening an issue reads the trailer, the cross-reference table and page 1's objects,
// not the whole file: the time to page 1 does not grow with the size.

import * as pdfjs from "../vendor/pdfjs/pdf.min.mjs";

const VENDOR = new URL("../vendor/pdfjs/", import.meta.url).href;
pdfjs.GlobalWorkerOptions.workerSrc = `${VENDOR}pdf.worker.min.mjs`;
const FIRST_RANGE_BYTES = 65536;
let sharedWorker = null;

/**
 * Start pdf.js's worker now (the app calls this at start): every document then uses
 * this one worker, so opening an issue does not wait for a worker to load and compile
 * pdf.js's parser.
 */
export function warmUp() {
  sharedWorker ??= new pdfjs.PDFWorker({ name: "pressrun-pdf" });
  return sharedWorker.promise;
}

/** Open a PDF held in a Blob; resolves to pdf.js's document. */
export async function openPdf(blob) {
  const head = new Uint8Array(await blob.slice(0, Math.min(blob.size, FIRST_RANGE_BYTES)).arrayBuffer());
  const transport = new pdfjs.PDFDataRangeTransport(blob.size, head);
  transport.requestDataRange = (begin, end) => {
    blob.slice(begin, end).arrayBuffer().then((buf) => transport.onDataRange(begin, new Uint8Array(buf)));
  };
  warmUp();
  return pdfjs.getDocument({
    worker: sharedWorker,
    range: transport,
    length: blob.size,
    disableAutoFetch: true,
    disableStream: true,
    cMapUrl: `${VENDOR}cmaps/`,
    cMapPacked: true,
    standardFontDataUrl: `${VENDOR}standard_fonts/`,
    wasmUrl: `${VENDOR}wasm/`,
    iccUrl: `${VENDOR}iccs/`,
  }).promise;
}

/** The most canvas pixels a page is drawn with (pdf.js's own default cap, 2^25): at
 * 4x zoom a phone's page (390 CSS px at a pixel ratio of 3) needs about 31 million. */
export const MAX_CANVAS_PIXELS = 2 ** 25;

/**
 * Render page `number` of `doc` into `canvas`, `cssWidth` CSS pixels wide at zoom 1,
 * `zoom` times that on screen; the canvas holds devicePixelRatio x zoom device pixels
 * per CSS pixel of the page (within MAX_CANVAS_PIXELS), so a zoomed page is drawn
 * again sharp rather than stretched. Resolves to the rendered size {width, height,
 * cssWidth, cssHeight}.
 */
export async function renderPage(doc, number, canvas, cssWidth, zoom = 1, maxPixels = MAX_CANVAS_PIXELS) {
  const page = await doc.getPage(number);
  try {
    const base = page.getViewport({ scale: 1 });
    const scale = (cssWidth * zoom) / base.width;
    let ratio = window.devicePixelRatio || 1;
    const pixels = base.width * base.height * (scale * ratio) ** 2;
    if (pixels > maxPixels) ratio *= Math.sqrt(maxPixels / pixels);
    const viewport = page.getViewport({ scale: scale * ratio });
    canvas.width = Math.floor(viewport.width);
    canvas.height = Math.floor(viewport.height);
    const css = page.getViewport({ scale });
    canvas.style.width = `${Math.floor(css.width)}px`;
    canvas.style.height = `${Math.floor(css.height)}px`;
    await page.render({ canvas, viewport }).promise;
    return { width: canvas.width, height: canvas.height, cssWidth: Math.floor(css.width), cssHeight: Math.floor(css.height) };
  } finally {
    page.cleanup();
  }
}

/**
 * Render a two-page spread (`numbers`: [left, right]) into `canvas`, side by side,
 * each page `cssWidth` CSS pixels wide at zoom 1 (as renderPage; the pixel cap is
 * shared between the two). Each page is drawn by pdf.js into a canvas of its own and
 * copied into `canvas` (pdf.js fills its whole viewport with white before drawing, so
 * the second page cannot be drawn into the same canvas at an offset). Resolves to the
 * spread's size {width, height, cssWidth, cssHeight}.
 */
export async function renderSpread(doc, numbers, canvas, cssWidth, zoom = 1) {
  const parts = [];
  for (const n of numbers) {
    const part = document.createElement("canvas");
    parts.push({ part, size: await renderPage(doc, n, part, cssWidth, zoom, MAX_CANVAS_PIXELS / numbers.length) });
  }
  canvas.width = parts.reduce((sum, p) => sum + p.part.width, 0);
  canvas.height = Math.max(...parts.map((p) => p.part.height));
  const cssW = parts.reduce((sum, p) => sum + p.size.cssWidth, 0);
  const cssH = Math.max(...parts.map((p) => p.size.cssHeight));
  canvas.style.width = `${cssW}px`;
  canvas.style.height = `${cssH}px`;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  let x = 0;
  for (const { part } of parts) {
    ctx.drawImage(part, x, 0);
    x += part.width;
    part.width = part.height = 0; // give the memory back at once
  }
  return { width: canvas.width, height: canvas.height, cssWidth: cssW, cssHeight: cssH };
}

/** Page `number` as a small picture for the page strip: a PNG object URL of the
 * page `cssWidth` CSS pixels wide (at the device's pixel ratio). */
export async function renderThumbnail(doc, number, cssWidth = 96) {
  const canvas = document.createElement("canvas");
  await renderPage(doc, number, canvas, cssWidth);
  const blob = await new Promise((resolve, reject) =>
    canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the page's picture could not be encoded"))), "image/png"),
  );
  canvas.width = canvas.height = 0;
  return URL.createObjectURL(blob);
}

/** Page `number`'s width over its height (to fit it to the screen before drawing). */
export async function pageAspect(doc, number) {
  const page = await doc.getPage(number);
  const v = page.getViewport({ scale: 1 });
  return v.width / v.height;
}

/** The cover: page 1 rendered `cssWidth` pixels wide, as a PNG Blob. */
export async function renderCover(blob, cssWidth = 160) {
  const doc = await openPdf(blob);
  try {
    const canvas = document.createElement("canvas");
    await renderPage(doc, 1, canvas, cssWidth);
    return await new Promise((resolve, reject) =>
      canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the cover could not be encoded"))), "image/png"),
    );
  } finally {
    await doc.destroy();
  }
}
