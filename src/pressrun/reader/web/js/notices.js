// The notices: what the reader is told, and the notes kept for operators.
//
// What a reader sees is one line in their terms saying what happened and what they
// can do; the operator's detail (which origin, which HTTP answer) is one tap away in a
// <details>. A notice replaces the one with the same `key` (one per issue, one for the
// new-issue check, ...), so notices do not pile up; each can be dismissed; news goes
// away by itself, errors stay until dismissed or replaced. A download's progress notes
// ("resuming: 51 of 80 pieces stored", "origin x failed; moving on") are for operators:
// they go to the issue's own details in the library, not to the notices.
// noticeLog (window.pressrun.notices) records every notice and note for the tests.

import { $, element } from "./dom.js";

/** Every notice and note ({text, kind, detail}), in order: window.pressrun.notices (app.js). */
export const noticeLog = [];

const MAX_NOTICES = 3;
const NEWS_SHOWN_MS = 10_000;
const NOTES_KEPT = 12;
const notes = new Map(); // issue id -> its last progress notes (operator's words)

/** Show the reader `text`, replacing the notice with the same `key`; `detail` is the operator's words. */
export function notice(text, { kind = "info", detail = null, key = text } = {}) {
  noticeLog.push({ text, kind, detail });
  const box = $("#notices");
  for (const old of box.querySelectorAll(".notice")) if (old.dataset.key === key) old.remove();
  const dismiss = element("button", { className: "dismiss", textContent: "×", title: "Dismiss" });
  dismiss.setAttribute("aria-label", "Dismiss");
  const body = element("div", { className: "body" }, element("p", { className: "text", textContent: text }));
  if (detail && detail !== text) {
    body.append(element("details", {}, element("summary", { textContent: "Details" }), element("p", { textContent: detail })));
  }
  const item = element("div", { className: `notice ${kind}` }, body, dismiss);
  item.dataset.key = key;
  dismiss.onclick = () => item.remove();
  box.prepend(item);
  while (box.children.length > MAX_NOTICES) box.lastChild.remove();
  if (kind !== "error") setTimeout(() => item.remove(), NEWS_SHOWN_MS);
}

/** A download's progress note: kept with the issue (its Details), not shown as a notice. */
export function note(issueId, text) {
  // the one note written for the reader (subscription.js, an embargoed issue) is shown
  if (/^This issue opens at/.test(text)) {
    notice(`${issueId}: ${text}.`, { key: `issue:${issueId}` });
    return;
  }
  noticeLog.push({ text: `${issueId}: ${text}`, kind: "note", detail: null });
  const list = notes.get(issueId) ?? [];
  list.push(text);
  notes.set(issueId, list.slice(-NOTES_KEPT));
}

/**
 * An error of a download (the operator's words, from download.js or subscription.js)
 * in a reader's: {text, detail, subscribe}. `subscribe` is true when the reader is not
 * a subscriber (the app then says once how to become one and offers no downloads).
 */
export function forReader(message, title) {
  const m = String(message);
  const say = (text, extra = {}) => ({ text, detail: m, subscribe: false, ...extra });
  if (/not subscribed|for subscribers only/i.test(m)) {
    return say(`${title} is for subscribers. To subscribe, send your reader key (Settings, Copy key) to your publisher; new issues then open here.`, { subscribe: true });
  }
  if (/\bCORS\b/.test(m)) {
    return say(`${title} cannot be unlocked: the publisher's subscription service does not accept this reader's web address yet. Tell your publisher (the details are for them).`);
  }
  if (/has no key for/.test(m)) return say(`${title} came out before your subscription started, so it cannot be opened here.`);
  if (/embargo/i.test(m)) return say(`${title} is not released yet. Try again later.`);
  if (/subscription service .*unreachable/.test(m)) {
    return say(`${title} could not be unlocked: the subscription service did not answer. Check your connection, then tap Resume.`);
  }
  if (/rejected|does not match|does not decrypt|not the key|sealed for someone else|does not open/.test(m)) {
    return say(`${title} did not pass its authenticity check, so nothing of it was kept. Try again later; if it keeps happening, tell your publisher.`);
  }
  if (/unknown to the balancer/.test(m)) return say(`${title} is no longer available.`);
  return say(`${title} could not be downloaded. Check your connection, then tap Resume.`);
}

/** The operator's notes of an issue's download, one tap away. */
export function notesElement(id, error = null) {
  const list = [...(notes.get(id) ?? []), ...(error ? [error] : [])];
  if (!list.length) return null;
  return element("details", { className: "notes" }, element("summary", { textContent: "Details" }), element("p", { textContent: list.join("\n") }));
}
