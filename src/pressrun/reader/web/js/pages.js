// Which pages the reading view shows, and the strip of page thumbnails.
//
// Spreads: on a tablet-sized screen held in landscape the reading view shows two
// pages side by side as a printed magazine opens: the cover alone, then 2-3, 4-5, ...
// (an even last page alone). A phone in landscape stays on one page (two pages 390 px
// high would each be under 280 px wide). The rules are pure functions of the page
// number, the page count and the surface's size, so the tests can call them directly.
//
// Thumbnails: "Pages" opens a strip of every page of the issue; a page's picture is
// drawn by pdf.js only when it scrolls into the strip (one at a time, so the strip
// never holds up the page being read), kept while the issue is open, and a tap on it
// turns to that page.


/** The shorter side (CSS px) from which a landscape screen shows spreads: a tablet's
 * (an iPad mini is 744 x 1133, a phone at most about 440 wide). */
export const SPREAD_MIN_SHORT_SIDE_PX = 600;

/** Whether a reading surface `width` x `height` CSS px shows two-page spreads. */
export function showsSpreads(width, height) {
  return width > height && Math.min(width, height) >= SPREAD_MIN_SHORT_SIDE_PX;
}

/** The pages shown together with page `n` (1..pages): [n] on one page, or the spread
 * that holds it ([1], [2, 3], [4, 5], ..., an even last page alone). */
export function shownPages(n, pages, spread) {
  const page = Math.min(Math.max(1, n), pages);
  if (!spread || page === 1) return [page];
  const left = page % 2 === 0 ? page : page - 1;
  return left < pages ? [left, left + 1] : [left];
}

/** The first page shown after the pages shown with `n` (pages + 1 past the end). */
export function nextPage(n, pages, spread) {
  const shown = shownPages(n, pages, spread);
  return shown[shown.length - 1] + 1;
}

/** The first page shown before the pages shown with `n` (0 before the first). */
export function previousPage(n, pages, spread) {
  const first = shownPages(n, pages, spread)[0];
  return first === 1 ? 0 : shownPages(first - 1, pages, spread)[0];
}

/**
 * The strip of page thumbnails in `container` (a <nav>): `open(reading)` shows it for
 * the issue being read ({issueId, doc, pages, page}), `close()` hides it, `onPick(n)`
 * is called with the page tapped. Pictures are made once per open issue.
 */
export class PageStrip {
  constructor(container, { onPick, cssWidth = 96 }) {
    this.container = container;
    this.onPick = onPick;
    this.cssWidth = cssWidth;
    this.issue = null; // the document the strip's pictures are of
    this.urls = new Map(); // page -> object URL of its picture
    this.queue = [];
    this.drawing = false;
    this.observer = new IntersectionObserver((entries) => this.seen(entries), { root: container, rootMargin: "0px 200px" });
  }

  get isOpen() {
    return !this.container.hidden;
  }

  /** Show the strip for `reading`, scrolled to the current page. */
  open(reading) {
    if (this.issue !== reading.doc) this.build(reading);
    for (const b of this.container.querySelectorAll("button")) {
      if (Number(b.dataset.page) === reading.page) b.setAttribute("aria-current", "page");
      else b.removeAttribute("aria-current");
    }
    this.container.hidden = false;
    this.container.querySelector(`button[data-page="${reading.page}"]`)?.scrollIntoView({ inline: "center", block: "nearest" });
  }

  close() {
    this.container.hidden = true;
  }

  /** Forget the issue's pictures (the issue was closed). */
  reset() {
    this.close();
    this.observer.disconnect();
    for (const url of this.urls.values()) URL.revokeObjectURL(url);
    this.urls.clear();
    this.queue = [];
    this.issue = null;
    this.container.replaceChildren();
  }

  build(reading) {
    this.reset();
    this.issue = reading.doc;
    const list = document.createElement("ol");
    for (let n = 1; n <= reading.pages; n += 1) {
      const button = document.createElement("button");
      button.className = "thumbnail";
      button.dataset.page = String(n);
      button.setAttribute("aria-label", `Page ${n}`);
      const picture = document.createElement("img");
      picture.alt = "";
      picture.width = this.cssWidth;
      const label = document.createElement("span");
      label.textContent = String(n);
      label.setAttribute("aria-hidden", "true");
      button.append(picture, label);
      button.onclick = () => this.onPick(n);
      const item = document.createElement("li");
      item.append(button);
      list.append(item);
      this.observer.observe(button);
    }
    this.container.replaceChildren(list);
  }

  seen(entries) {
    for (const e of entries) {
      const n = Number(e.target.dataset.page);
      if (e.isIntersecting && !this.urls.has(n) && !this.queue.includes(n)) this.queue.push(n);
    }
    this.drawNext();
  }

  async drawNext() {
    if (this.drawing) return;
    this.drawing = true;
    try {
      while (this.queue.length) {
        const n = this.queue.shift();
        const doc = this.issue;
        if (doc === null || this.urls.has(n)) continue;
        let url;
        try {
          url = await (await import("./viewer.js")).renderThumbnail(doc, n, this.cssWidth);
        } catch {
          continue; // the issue was closed while drawing; the page keeps its number
        }
        if (this.issue !== doc) {
          URL.revokeObjectURL(url);
          continue;
        }
        this.urls.set(n, url);
        const img = this.container.querySelector(`button[data-page="${n}"] img`);
        if (img) img.src = url;
      }
    } finally {
      this.drawing = false;
    }
  }
}
