// One subscription on several devices: link a new device from one already
// subscribed, or import a key made by `pressrun keys new --subscriber`.
//
// Linking (docs/subscriptions.md "Devices"; src/pressrun/reader/link.py has the
// mailbox): every device keeps its OWN key pair; no private key ever leaves a device.
// The subscribed device proves its key to the subscription service (a sealed
// challenge) and gets a link grant (POST /v1/device-grants): an HMAC of public parts
// that lets one new device join its subscriber within 10 minutes. It draws a
// 12-character code, derives 48 bytes from it with PBKDF2-HMAC-SHA-256
// (LINK_KDF_ITERATIONS, WebCrypto): a secretbox key and a mailbox name, seals
// {grant, the service's URL} with that key (crypto_secretbox, libsodium.js) and puts
// it into the reader service's mailbox (PUT v1/link/<name>). The new device, given the
// code, derives the same, takes the box once (GET) and opens it, then registers its
// own public key under the subscriber with the grant and a token of its own
// (POST /v1/devices). The publisher wraps each issue to every device key; the
// subscription service's limit on devices refuses one too many (409 device_limit).
//
// Importing a key file replaces this device's key with the subscriber's own key.

import { allRecords, getSetting, putRecord, putSetting } from "./db.js";
import { bytesToHex, hexToBytes } from "./manifest.js";
import { sodium, subscriberKeys } from "./subscription.js";

/** The code's letters: no 0/O, 1/I/L, so a code read aloud or typed is not mistaken. */
export const CODE_ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ";
export const CODE_LENGTH = 12;
const SALT_CONTEXT = "pressrun-link-v1";
/** PBKDF2 rounds: about 0.2-0.5 s on a phone, so each guess at a code costs as much. */
export const LINK_KDF_ITERATIONS = 600_000;

/** A code as typed (spaces, dashes, lower case) in its plain form, or null. */
export function normalCode(typed) {
  const code = String(typed).toUpperCase().replace(/[\s-]/g, "");
  if (code.length !== CODE_LENGTH) return null;
  for (const c of code) if (!CODE_ALPHABET.includes(c)) return null;
  return code;
}

/** A code as shown: three groups of four. */
export function shownCode(code) {
  return code.match(/.{1,4}/g).join("-");
}

/** The secretbox key and the mailbox name a code stands for (PBKDF2-SHA-256). */
async function derive(s, code) {
  const base = await crypto.subtle.importKey("raw", s.from_string(code), "PBKDF2", false, ["deriveBits"]);
  const bits = await crypto.subtle.deriveBits(
    { name: "PBKDF2", hash: "SHA-256", salt: s.from_string(SALT_CONTEXT), iterations: LINK_KDF_ITERATIONS },
    base,
    48 * 8,
  );
  const out = new Uint8Array(bits);
  return { key: out.slice(0, 32), mailbox: bytesToHex(out.slice(32, 48)) };
}

/** A random code of CODE_LENGTH letters (rejection sampling: every letter as likely). */
function randomCode(s) {
  let code = "";
  while (code.length < CODE_LENGTH) {
    for (const b of s.randombytes_buf(CODE_LENGTH)) {
      const v = b & 31;
      if (v < CODE_ALPHABET.length && code.length < CODE_LENGTH) code += CODE_ALPHABET[v];
    }
  }
  return code;
}

/** Thrown with a line for the reader (and the operator's detail in `detail`). */
export class LinkError extends Error {
  constructor(text, detail = null) {
    super(text);
    this.detail = detail;
  }
}

/** The reader's words for a refusal of the subscription service's device routes. */
function refusal(status, doc, doing) {
  const detail = `HTTP ${status}: ${doc.error ?? ""}`.trim();
  if (doc.code === "device_limit") {
    const most = Number.isInteger(doc.max_devices) ? `${doc.max_devices} devices, the most` : "the most devices";
    return new LinkError(
      `Your subscription already has ${most} your publisher allows. To link another, ask your publisher to remove a device you no longer use.`,
      detail,
    );
  }
  if (doc.code === "not_subscribed") {
    return new LinkError("This device is not subscribed, so it cannot link another. Link from a device that reads your subscriber issues.", detail);
  }
  if (doc.code === "already_linked") {
    return new LinkError("This device already belongs to another subscription, so it cannot join this one.", detail);
  }
  if (doc.code === "grant_used" || doc.code === "grant_expired" || doc.code === "bad_grant") {
    return new LinkError("This code does not work any more: it was used already or is older than 10 minutes. Make a new one on your other device.", detail);
  }
  return new LinkError(`Could not ${doing}: your publisher's subscription service refused it. Try again later.`, detail);
}

/** fetch() to the subscription service: {status, doc}, or a LinkError in reader words. */
async function serviceCall(url, init, doing) {
  let resp;
  try {
    resp = await fetch(url, { ...init, cache: "no-store" });
  } catch (err) {
    throw new LinkError(`Could not ${doing}: your publisher's subscription service did not answer. Check your connection and try again.`, `${url}: ${err.message}`);
  }
  const doc = await resp.json().catch(() => ({}));
  return { status: resp.status, doc: doc ?? {} };
}

/** A token of the subscription service for this device's own key (a sealed challenge). */
async function deviceToken(s, base, doing) {
  const { publicKey, secretKey } = await subscriberKeys();
  const { status, doc } = await serviceCall(
    `${base}/v1/challenge`,
    { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ subscriber: bytesToHex(publicKey) }) },
    doing,
  );
  if (status !== 200 || typeof doc.sealed_token !== "string") throw refusal(status, doc, doing);
  try {
    return bytesToHex(s.crypto_box_seal_open(hexToBytes(doc.sealed_token), publicKey, secretKey));
  } catch (err) {
    throw new LinkError(`Could not ${doing}: this device's key did not open the service's challenge.`, String(err?.message ?? err));
  }
}

/** The subscription service this device's subscriber issues name (newest first). */
async function subscriptionService() {
  const issues = (await allRecords("issues")).filter((r) => r.encrypted && r.manifest_text);
  issues.sort((a, b) => (b.added_at ?? 0) - (a.added_at ?? 0));
  for (const record of issues) {
    try {
      const url = JSON.parse(record.manifest_text).manifest.encryption.subscriptions_url;
      if (typeof url === "string" && /^https?:\/\//.test(url)) return url.replace(/\/+$/, "");
    } catch {
      // a record without a readable manifest: the next one
    }
  }
  const refused = await getSetting("not_subscribed", null);
  return refused?.url ?? null;
}

/** A name the publisher's device list shows for this device. */
function deviceName() {
  const platform = navigator.userAgentData?.platform || navigator.platform || "";
  const kind = navigator.maxTouchPoints > 0 ? (Math.min(screen.width, screen.height) >= 600 ? "tablet" : "phone") : "computer";
  return `${kind}${platform ? ` (${platform})` : ""}, web reader`.slice(0, 200);
}

/**
 * On the subscribed device: get a link grant from the subscription service and seal
 * it into a new mailbox. Resolves to {code (plain), shown ("ABCD-EFGH-JKMN"), expiresInS}.
 */
export async function offerLink() {
  const s = await sodium();
  const service = await subscriptionService();
  if (service === null) {
    throw new LinkError("This device has no subscriber issue yet, so it does not know your publisher's subscription service. Download an issue for subscribers here first, then make a code.");
  }
  const doing = "make a code";
  const token = await deviceToken(s, service, doing);
  const granted = await serviceCall(`${service}/v1/device-grants`, { method: "POST", headers: { Authorization: `Bearer ${token}` } }, doing);
  if (granted.status !== 200 || typeof granted.doc.grant !== "string") throw refusal(granted.status, granted.doc, doing);
  const code = randomCode(s);
  const { key, mailbox } = await derive(s, code);
  const nonce = s.randombytes_buf(s.crypto_secretbox_NONCEBYTES);
  const plain = s.from_string(JSON.stringify({ v: 2, grant: granted.doc.grant, service }));
  const sealed = s.crypto_secretbox_easy(plain, nonce, key);
  const body = JSON.stringify({ nonce: bytesToHex(nonce), sealed: bytesToHex(sealed) });
  let resp;
  try {
    resp = await fetch(`v1/link/${mailbox}`, { method: "PUT", body, cache: "no-store" });
  } catch (err) {
    throw new LinkError("Could not make a code: the reader's server did not answer. Check your connection and try again.", err.message);
  }
  if (resp.status !== 201) {
    throw new LinkError("Could not make a code: the reader's server refused it. Try again in a minute.", `HTTP ${resp.status}: ${await resp.text()}`);
  }
  const { expires_in_s: expiresInS } = await resp.json();
  return { code, shown: shownCode(code), expiresInS };
}

/**
 * On the new device: take the box the code names, open it and register this device's
 * own key under the subscriber with the grant inside. Resolves to the public key (hex)
 * of this device, now one of the subscriber's devices.
 */
export async function acceptLink(typed) {
  const code = normalCode(typed);
  if (code === null) {
    throw new LinkError(`A code is ${CODE_LENGTH} letters and digits, like ABCD-EFGH-JKMN. Check it and try again.`);
  }
  const s = await sodium();
  const { key, mailbox } = await derive(s, code);
  let resp;
  try {
    resp = await fetch(`v1/link/${mailbox}`, { cache: "no-store" });
  } catch (err) {
    throw new LinkError("Could not reach the reader's server. Check your connection and try again.", err.message);
  }
  if (resp.status === 404) {
    throw new LinkError("This code does not work: it was used already, or is older than 10 minutes, or mistyped. Make a new one on your other device.");
  }
  if (!resp.ok) throw new LinkError("Could not take the code: the reader's server refused it. Try again.", `HTTP ${resp.status}`);
  let offer;
  try {
    const box = await resp.json();
    const plain = s.crypto_secretbox_open_easy(hexToBytes(box.sealed), hexToBytes(box.nonce), key);
    offer = JSON.parse(s.to_string(plain));
  } catch (err) {
    throw new LinkError("This code did not open. Make a new code on your other device.", String(err?.message ?? err));
  }
  if (offer?.v !== 2 || typeof offer.grant !== "string" || !/^https?:\/\//.test(String(offer.service))) {
    throw new LinkError("This code comes from an older version of the reader. Reload the reader on your other device and make a new code.", `box version ${offer?.v}`);
  }
  const doing = "link this device";
  const token = await deviceToken(s, offer.service, doing);
  const joined = await serviceCall(
    `${offer.service}/v1/devices`,
    { method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` }, body: JSON.stringify({ grant: offer.grant, name: deviceName() }) },
    doing,
  );
  if (joined.status !== 201 && joined.status !== 200) throw refusal(joined.status, joined.doc, doing);
  // a refusal said to this device before it joined says nothing now
  await putSetting("not_subscribed", null);
  await putSetting("told_to_subscribe", false);
  return bytesToHex((await subscriberKeys()).publicKey);
}

/** Import the key file `name` holding `text` (reader.key). A reader.key.pub holds 64
 * hex digits too, and any 32 bytes are an X25519 secret key: it is told by its name. */
export async function importKeyFile(name, text) {
  if (/\.pub$/i.test(name)) {
    throw new LinkError("That is the public half of the key (reader.key.pub): choose reader.key, the file beside it.");
  }
  return importSecretKey(text);
}

/**
 * Make `secretHex` (an X25519 secret key: 64 hex, as in `pressrun keys new
 * --subscriber`'s reader.key) this device's subscriber key; `publicHex`, when given,
 * must be its public half. Resolves to the public key (hex).
 */
export async function importSecretKey(secretHex, publicHex = null) {
  const secret = String(secretHex ?? "").trim().toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(secret)) {
    throw new LinkError("That is not a reader key: a reader.key file holds 64 characters 0-9 and a-f. Check you chose reader.key, not reader.key.pub.");
  }
  const s = await sodium();
  const secretKey = hexToBytes(secret);
  const publicKey = s.crypto_scalarmult_base(secretKey);
  if (publicHex !== null && bytesToHex(publicKey) !== String(publicHex).toLowerCase()) {
    throw new LinkError("The key from your other device is damaged. Make a new code there.", "the public key does not match the secret");
  }
  await putRecord("keys", { publicKey, secretKey, created_at: Date.now(), imported_at: Date.now() }, "subscriber");
  // a refusal said to the old key says nothing about this one
  await putSetting("not_subscribed", null);
  await putSetting("told_to_subscribe", false);
  return bytesToHex(publicKey);
}
