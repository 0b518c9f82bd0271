// One subscription on several devices: link a new device from one already
// subscribed, or import a key made by `pressrun keys new --subscriber`.
//
// Linking (src/pressrun/reader/link.py has the whole design): the subscribed device
// draws a 12-character code, derives 48 bytes from it with PBKDF2-HMAC-SHA-256
// (LINK_KDF_ITERATIONS, WebCrypto; libsodium.js's standard build has no Argon2): a
// secretbox key and a mailbox name. It seals its key pair with that key
// (crypto_secretbox, libsodium.js) and puts the box into the reader service's
// mailbox (PUT v1/link/<name>).
// The new device, given the code, derives the same, takes the box once (GET) and opens
// it. The reader service sees a mailbox name and a ciphertext, never the key or the
// code; the box is gone once taken and after 10 minutes.
//
// Either way the device's subscriber key becomes the imported one (the key this
// browser made for itself is replaced): the subscription service hands it the same
// wraps as the other device, and nothing about the key changes on the service.

import { putRecord, putSetting } from "./db.js";
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

/**
 * On the subscribed device: seal this device's key pair into a new mailbox.
 * Resolves to {code (plain), shown ("ABCD-EFGH-JKMN"), expiresInS}.
 */
export async function offerLink() {
  const s = await sodium();
  const code = randomCode(s);
  const { key, mailbox } = await derive(s, code);
  const { publicKey, secretKey } = await subscriberKeys();
  const nonce = s.randombytes_buf(s.crypto_secretbox_NONCEBYTES);
  const plain = s.from_string(JSON.stringify({ v: 1, secret: bytesToHex(secretKey), public: bytesToHex(publicKey) }));
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
 * On the new device: take the box the code names, open it and make its key pair this
 * device's subscriber key. Resolves to the public key (hex) now in use.
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
  let pair;
  try {
    const box = await resp.json();
    const plain = s.crypto_secretbox_open_easy(hexToBytes(box.sealed), hexToBytes(box.nonce), key);
    pair = JSON.parse(s.to_string(plain));
  } catch (err) {
    throw new LinkError("This code did not open the key it names. Make a new code on your other device.", String(err?.message ?? err));
  }
  return importSecretKey(pair.secret, pair.public);
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
