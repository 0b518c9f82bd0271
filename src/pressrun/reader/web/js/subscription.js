// Subscribers only (docs/protocols.md, "Encrypted issues" and "Subscriber keys and
// wraps"), in the browser with libsodium.js (npm libsodium-wrappers):
//
// - the reader's X25519 key pair is made here on first use (crypto_box_keypair) and
//   kept in IndexedDB; only the public key ever leaves the browser (to the
//   subscription service, and shown in the settings so the publisher can add it);
// - for an encrypted issue, the reader proves it holds the secret key by opening a
//   sealed challenge (POST /v1/challenge), fetches its wrap with the opened token
//   (GET /v1/issues/<id>/versions/<v>/wrap), opens the wrap (crypto_box_seal_open) and
//   checks the content key against the manifest's key_check (keyed BLAKE2b-256);
// - each piece, once its SHA-256 matched the manifest, is decrypted on its own with
//   XChaCha20-Poly1305 (nonce = nonce_prefix || index, associated data binding the
//   issue, version, index, piece count and plaintext size).
// All of this happens before the first byte of the issue is stored: a reader that
// cannot open the issue stores nothing of it.

import { addRecord, getRecord, getSetting, putSetting } from "./db.js";
import { DownloadError } from "./download.js";
import { bytesToHex, hexToBytes } from "./manifest.js";

const SCHEME = "xchacha20poly1305-pieces-v1";
const TAG_BYTES = 16;
const KEY_CHECK_CONTEXT = "pressrun-key-check-v1";
const PIECE_CONTEXT = "pressrun-piece-v1";
const HEX = (n) => new RegExp(`^[0-9a-f]{${n}}$`);

let sodiumReady = null;
export function sodium() {
  sodiumReady ??= import("libsodium-wrappers").then(async ({ default: s }) => {
    await s.ready;
    return s;
  });
  return sodiumReady;
}

/**
 * This reader's subscriber key pair, made on first use: {publicKey, secretKey} (bytes).
 * The pair is stored only where none is: of callers that ask at once (the settings,
 * the app's start, another tab) the first to store wins and the others read its pair,
 * so a key once shown or sent to a publisher is never replaced by a second one.
 */
export async function subscriberKeys() {
  const stored = await getRecord("keys", "subscriber");
  if (stored !== undefined) return stored;
  const s = await sodium();
  const pair = s.crypto_box_keypair();
  const record = { publicKey: pair.publicKey, secretKey: pair.privateKey, created_at: Date.now() };
  try {
    await addRecord("keys", record, "subscriber");
    return record;
  } catch (error) {
    if (error?.name !== "ConstraintError") throw error;
    return getRecord("keys", "subscriber");
  }
}

/** The public key (64 hex) the publisher adds as a subscriber. */
export async function subscriberPublicKey() {
  return bytesToHex((await subscriberKeys()).publicKey);
}

/**
 * After a refusal for not being subscribed: ask the subscription service again for
 * the refused issue's wrap (a challenge and one GET; no content). True: still not a
 * subscriber; false: subscribed now (or never refused), and the refusal is forgotten;
 * null: the service did not answer.
 */
export async function stillNotSubscribed() {
  const refused = await getSetting("not_subscribed", null);
  if (refused === null) return false;
  try {
    const s = await sodium();
    const { publicKey, secretKey } = await subscriberKeys();
    const challenge = await fetch(`${refused.url}/v1/challenge`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ subscriber: bytesToHex(publicKey) }),
      cache: "no-store",
    });
    const doc = await challenge.json();
    const token = s.crypto_box_seal_open(hexToBytes(doc.sealed_token), publicKey, secretKey);
    const wrap = await fetch(`${refused.url}/v1/issues/${encodeURIComponent(refused.issue_id)}/versions/${refused.version}/wrap`, {
      headers: { Authorization: `Bearer ${bytesToHex(token)}` },
      cache: "no-store",
    });
    if (wrap.status === 403) return (await wrap.json().catch(() => ({})))?.code !== "embargoed";
    if (wrap.status >= 500) return null;
  } catch {
    return null;
  }
  await putSetting("not_subscribed", null);
  return false;
}

function checkEncryption(m) {
  const e = m.encryption;
  const bad = (what) => new DownloadError(`the manifest of ${m.issue_id} is rejected: encryption.${what}; nothing was saved`);
  if (e === null || typeof e !== "object") throw bad("must be an object");
  if (e.scheme !== SCHEME) throw bad(`scheme is ${JSON.stringify(e.scheme)}, which this reader does not know (it knows ${SCHEME})`);
  if (!Number.isSafeInteger(e.version) || e.version < 1) throw bad("version must be an integer >= 1");
  if (typeof e.nonce_prefix !== "string" || !HEX(32).test(e.nonce_prefix)) throw bad("nonce_prefix must be 32 hex digits");
  if (typeof e.key_check !== "string" || !HEX(64).test(e.key_check)) throw bad("key_check must be 64 hex digits");
  if (typeof e.plain_sha256 !== "string" || !HEX(64).test(e.plain_sha256)) throw bad("plain_sha256 must be 64 hex digits");
  if (!Number.isSafeInteger(e.plain_size_bytes) || e.plain_size_bytes < 0) throw bad("plain_size_bytes must be an integer >= 0");
  if (typeof e.subscriptions_url !== "string" || !/^https?:\/\//.test(e.subscriptions_url)) throw bad("subscriptions_url must be an http(s) URL");
  const pieces = m.piece_sha256.length;
  if (m.size_bytes !== e.plain_size_bytes + TAG_BYTES * pieces) {
    throw bad(`plain_size_bytes ${e.plain_size_bytes} does not fit size_bytes ${m.size_bytes} and ${pieces} pieces`);
  }
  return e;
}

async function callService(url, init, what) {
  let resp;
  let doc;
  try {
    resp = await fetch(url, { ...init, cache: "no-store" });
    doc = await resp.json().catch(() => ({}));
  } catch (err) {
    const origin = new URL(url).origin;
    // fetch() says "Failed to fetch" both for a service that is down and for one that
    // answered without allowing this page's origin (CORS): a no-cors request tells them
    // apart (it succeeds, with an opaque answer, when the service is up)
    const reachable = await fetch(`${origin}/`, { mode: "no-cors", cache: "no-store" }).then(() => true, () => false);
    if (reachable) {
      throw new DownloadError(
        `the subscription service at ${origin} refused this reader's web address ${location.origin} (CORS): ` +
          `its --cors-origin must list ${location.origin} exactly; nothing was saved`,
      );
    }
    throw new DownloadError(`the subscription service at ${origin} is unreachable (${err.message}); nothing was saved`);
  }
  return { status: resp.status, doc: doc ?? {}, what };
}

/** u64 big-endian into `view` at `offset`. */
function u64(view, offset, n) {
  view.setBigUint64(offset, BigInt(n), false);
}

/**
 * For a manifest with `encryption`: fetch and open this reader's wrap and return
 * {decryptPiece(index, bytes), plain_sha256, plain_size_bytes, plain_file_name};
 * for a plain manifest: null. DownloadError (one line for a person) when the reader
 * is not subscribed, has no wrap for this version, or the wrap is not for this issue.
 */
export async function prepareDecryption(m, { notice = () => {}, signal = null, onEmbargo = () => {} } = {}) {
  if (m.encryption === undefined) return null;
  const e = checkEncryption(m);
  // an embargoed version (docs/protocols.md "Embargo"): 403 "embargoed" until its
  // release; the wait is the service's retry_after_s counted on this page's own
  // clock (the reader's wall clock is never asked), then a fresh challenge
  for (;;) {
    const opener = await openWrap(m, e);
    if (opener.embargo === undefined) return opener;
    const { releaseAt, waitS } = opener.embargo;
    onEmbargo(opener.embargo); // prefetch.js starts the background prefetch
    notice(`This issue opens at ${releaseAt.toLocaleString()}`);
    await new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, Math.min(waitS, 86400) * 1000);
      signal?.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
    });
  }
}

/** prepareDecryption's one round: the opener, or {embargo: {releaseAt, waitS}}. */
async function openWrap(m, e) {
  const s = await sodium();
  const { publicKey, secretKey } = await subscriberKeys();
  const subscriber = bytesToHex(publicKey);
  const base = e.subscriptions_url.replace(/\/+$/, "");
  const title = m.title || m.issue_id;

  const challenge = await callService(`${base}/v1/challenge`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ subscriber }),
  });
  if (challenge.status !== 200 || typeof challenge.doc.sealed_token !== "string") {
    throw new DownloadError(`the subscription service refused the challenge: ${challenge.doc.error ?? `HTTP ${challenge.status}`}; nothing was saved`);
  }
  let token;
  try {
    token = s.crypto_box_seal_open(hexToBytes(challenge.doc.sealed_token), publicKey, secretKey);
  } catch {
    throw new DownloadError("the subscription service's challenge does not open with this reader's key; nothing was saved");
  }
  const wrapUrl = `${base}/v1/issues/${encodeURIComponent(m.issue_id)}/versions/${e.version}/wrap`;
  const answer = await callService(wrapUrl, { headers: { Authorization: `Bearer ${bytesToHex(token)}` } });
  const said = answer.doc.error ?? `HTTP ${answer.status}`;
  if (answer.status === 403 && answer.doc.code === "embargoed") {
    const waitS = Number(answer.doc.retry_after_s);
    const releaseAt = new Date(answer.doc.release_at);
    if (Number.isFinite(waitS) && waitS >= 0 && !Number.isNaN(releaseAt.getTime())) {
      return { embargo: { releaseAt, waitS: Math.max(waitS, 0.5) } };
    }
  }
  if (answer.status === 403) {
    // remembered, so the app offers no downloads that can only fail and asks the
    // service (stillNotSubscribed) on each check whether this reader was added since
    await putSetting("not_subscribed", { url: base, issue_id: m.issue_id, version: e.version, at: Date.now() });
    throw new DownloadError(
      `You are not subscribed to ${title}, so this reader cannot open it (the subscription service says: ${said}); ` +
        `give your publisher this reader's key ${subscriber.slice(0, 16)}… (Settings); nothing was saved`,
    );
  }
  if (answer.status === 404) {
    throw new DownloadError(
      `your subscription has no key for ${title} (version ${e.version}): ${said}; an issue published before ` +
        "you subscribed cannot be opened; nothing was saved",
    );
  }
  if (answer.status !== 200 || typeof answer.doc.wrap !== "string" || !HEX(160).test(answer.doc.wrap)) {
    throw new DownloadError(`the subscription service did not hand out the key of ${title}: ${said}; nothing was saved`);
  }
  let key;
  try {
    key = s.crypto_box_seal_open(hexToBytes(answer.doc.wrap), publicKey, secretKey);
  } catch {
    throw new DownloadError(`the key of ${title} from the subscription service was sealed for someone else; nothing was saved`);
  }
  const check = s.crypto_generichash(32, s.from_string(KEY_CHECK_CONTEXT), key);
  if (bytesToHex(check) !== e.key_check) {
    throw new DownloadError(`the key the subscription service handed out is not the key of ${title} version ${e.version}; nothing was saved`);
  }

  const count = m.piece_sha256.length;
  const prefix = hexToBytes(e.nonce_prefix);
  const name = new TextEncoder().encode(m.issue_id);
  const context = new TextEncoder().encode(PIECE_CONTEXT);
  const nonceAndData = (index) => {
    const nonce = new Uint8Array(24);
    nonce.set(prefix, 0);
    u64(new DataView(nonce.buffer), 16, index);
    const ad = new Uint8Array(context.length + 1 + name.length + 32);
    ad.set(context, 0);
    ad[context.length] = name.length;
    ad.set(name, context.length + 1);
    const view = new DataView(ad.buffer);
    let at = context.length + 1 + name.length;
    for (const n of [e.version, index, count, e.plain_size_bytes]) {
      u64(view, at, n);
      at += 8;
    }
    return [nonce, ad];
  };
  return {
    plain_sha256: e.plain_sha256,
    plain_size_bytes: e.plain_size_bytes,
    plain_file_name: e.plain_file_name,
    decryptPiece(index, piece) {
      const [nonce, ad] = nonceAndData(index);
      try {
        return s.crypto_aead_xchacha20poly1305_ietf_decrypt(null, piece, ad, nonce, key);
      } catch {
        throw new DownloadError(`piece ${index} of ${title} matches the manifest but does not decrypt (a publisher error); the pieces stored so far are kept`);
      }
    },
    // The stored (decrypted) piece back to the publisher's ciphertext, to upload it to
    // peers: the nonce and associated data are fixed per piece, so this is the same
    // ciphertext, byte for byte (swarm-store.js checks its SHA-256 before it is sent).
    encryptPiece(index, plain) {
      const [nonce, ad] = nonceAndData(index);
      return s.crypto_aead_xchacha20poly1305_ietf_encrypt(plain, ad, null, nonce, key);
    },
  };
}
