// The signed manifest (docs/protocols.md, "Signed manifest"): parse, check the
// Ed25519 signature over its canonical bytes, check pieces against their SHA-256.
//
// The canonical bytes are Python's
//   json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
// encoded as UTF-8; canonicalJson() below gives the same text for the values a
// manifest holds (objects, arrays, strings, integers, booleans, null). A float has
// no single spelling across the two languages, so it is refused, as the Python
// parser refuses it.

const HEX_RE = /^[0-9a-f]*$/;
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export class ManifestError extends Error {}

export function canonicalJson(value) {
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) throw new ManifestError(`the manifest holds a number that is not an integer (${value})`);
    return String(value);
  }
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(",")}}`;
  }
  throw new ManifestError(`the manifest holds a value JSON cannot (${typeof value})`);
}

export function hexToBytes(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
  return out;
}

export function bytesToHex(bytes) {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");
}

function want(m, key, type, check, what) {
  const v = m[key];
  const ok = type === "int" ? Number.isSafeInteger(v) : typeof v === type;
  if (!ok || (check && !check(v))) throw new ManifestError(`manifest field ${key} must be ${what}`);
  return v;
}
const isHex = (n) => (s) => s.length === n && HEX_RE.test(s);

/** Parse manifest.json's text; the fields checked, the signature not yet (see verifyManifest). */
export function parseManifest(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new ManifestError(`manifest.json is not JSON (${err.message})`);
  }
  if (doc === null || typeof doc !== "object" || typeof doc.manifest !== "object" || doc.manifest === null) {
    throw new ManifestError("manifest.json has no manifest object");
  }
  const m = doc.manifest;
  const signature = want(doc, "signature", "string", isHex(128), "128 lower-case hex digits");
  want(m, "format", "int", (v) => v >= 1, "a format number");
  want(m, "issue_id", "string", (v) => NAME_RE.test(v), "a valid issue id");
  want(m, "title", "string", null, "a string");
  want(m, "file_name", "string", (v) => NAME_RE.test(v), "a valid file name");
  want(m, "size_bytes", "int", (v) => v >= 0, "an integer >= 0");
  want(m, "piece_size_bytes", "int", (v) => v >= 1, "an integer >= 1");
  want(m, "sha256", "string", isHex(64), "64 lower-case hex digits");
  want(m, "publisher_key", "string", isHex(64), "64 lower-case hex digits");
  if (!Array.isArray(m.piece_sha256) || !m.piece_sha256.every((h) => typeof h === "string" && isHex(64)(h))) {
    throw new ManifestError("manifest field piece_sha256 must be a list of 64-hex-digit hashes");
  }
  const pieces = Math.ceil(m.size_bytes / m.piece_size_bytes);
  if (m.piece_sha256.length !== pieces) {
    throw new ManifestError(`manifest lists ${m.piece_sha256.length} piece hashes for ${pieces} pieces`);
  }
  return { manifest: m, signature, text };
}

async function ed25519Verify(publicKey, signature, data) {
  try {
    const key = await crypto.subtle.importKey("raw", publicKey, { name: "Ed25519" }, false, ["verify"]);
    return await crypto.subtle.verify({ name: "Ed25519" }, key, signature, data);
  } catch (err) {
    if (err.name !== "NotSupportedError") throw err;
    // a browser without Ed25519 in WebCrypto: libsodium.js does the same check
    const { default: sodium } = await import("libsodium-wrappers");
    await sodium.ready;
    return sodium.crypto_sign_verify_detached(signature, data, publicKey);
  }
}

/**
 * Check the signature and the publisher; throws ManifestError with a sentence for a
 * person. trusted: the publisher keys (hex) to accept, or null for trust on first use
 * (any self-consistent manifest passes; the caller then pins its key).
 */
export async function verifyManifest(parsed, issueId, trusted) {
  const m = parsed.manifest;
  const data = new TextEncoder().encode(canonicalJson(m));
  const ok = await ed25519Verify(hexToBytes(m.publisher_key), hexToBytes(parsed.signature), data);
  if (!ok) throw new ManifestError("its signature does not match its content (tampered or corrupted)");
  if (trusted !== null && !trusted.includes(m.publisher_key)) {
    throw new ManifestError(`it is signed by ${m.publisher_key.slice(0, 16)}…, which is not a publisher this reader trusts`);
  }
  if (m.issue_id !== issueId) throw new ManifestError(`it is for issue ${m.issue_id}, not ${issueId}`);
  return m;
}

/** [offset, length] of piece `index` in the file the manifest describes. */
export function pieceSpan(m, index) {
  const offset = index * m.piece_size_bytes;
  return [offset, Math.min(m.piece_size_bytes, m.size_bytes - offset)];
}

/** True if `bytes` is piece `index` as the manifest names it (SHA-256, WebCrypto). */
export async function pieceOk(m, index, bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return bytesToHex(digest) === m.piece_sha256[index];
}
