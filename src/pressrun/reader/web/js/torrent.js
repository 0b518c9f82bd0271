// The issue's .torrent, checked against the signed manifest before the reader joins a
// swarm: the torrent comes from an origin (swarm.torrent_url), the manifest is signed,
// and the manifest names the torrent's info-hash (the SHA-1 of the bencoded info
// dictionary, which holds every piece's SHA-1). A torrent whose info-hash is not the
// manifest's is refused; one that matches is rewritten to name only the WebSocket
// tracker the directive gave (a browser cannot announce over HTTP or UDP).

const MAX_TORRENT_BYTES = 16 * 1024 * 1024;
const MAX_DEPTH = 32; // a torrent nests four levels; deeper is refused

export class TorrentError extends Error {}

/** Where the value at `at` ends (bencode), checked; `depth` bounds the nesting. */
function skip(buf, at, depth) {
  if (depth > MAX_DEPTH) throw new TorrentError("the torrent nests too deep");
  const c = buf[at];
  if (c === 0x69) {
    // i<digits>e
    const end = buf.indexOf(0x65, at);
    if (end < 0) throw new TorrentError("the torrent has an unterminated integer");
    return end + 1;
  }
  if (c === 0x6c || c === 0x64) {
    // l...e / d...e
    let pos = at + 1;
    while (buf[pos] !== 0x65) {
      if (pos >= buf.length) throw new TorrentError("the torrent is cut short");
      pos = skip(buf, pos, depth + 1);
    }
    return pos + 1;
  }
  if (c >= 0x30 && c <= 0x39) {
    const colon = buf.indexOf(0x3a, at);
    if (colon < 0 || colon - at > 12) throw new TorrentError("the torrent has a malformed string length");
    const n = Number(new TextDecoder().decode(buf.subarray(at, colon)));
    if (!Number.isSafeInteger(n) || colon + 1 + n > buf.length) throw new TorrentError("the torrent has a string past its end");
    return colon + 1 + n;
  }
  throw new TorrentError(`the torrent is not bencode (byte ${c} at ${at})`);
}

/** The raw bytes of the top-level `info` dictionary of a bencoded torrent. */
export function infoBytes(buf) {
  if (buf[0] !== 0x64) throw new TorrentError("the torrent is not a bencoded dictionary");
  const text = new TextDecoder("latin1");
  let pos = 1;
  while (pos < buf.length && buf[pos] !== 0x65) {
    const keyEnd = skip(buf, pos, 1);
    const key = text.decode(buf.subarray(buf.indexOf(0x3a, pos) + 1, keyEnd));
    const valueEnd = skip(buf, keyEnd, 1);
    if (key === "info") return buf.subarray(keyEnd, valueEnd);
    pos = valueEnd;
  }
  throw new TorrentError("the torrent has no info dictionary");
}

const hex = (bytes) => Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");

/**
 * Fetch the torrent at `url`, check its info-hash against the manifest's, and return
 * a torrent (bytes) naming only `announce`; TorrentError with a sentence otherwise.
 */
export async function fetchCheckedTorrent(url, m, announce, signal) {
  const resp = await fetch(url, { signal, cache: "no-store" });
  if (resp.status !== 200) throw new TorrentError(`GET ${url} answered HTTP ${resp.status}`);
  const raw = new Uint8Array(await resp.arrayBuffer());
  if (raw.length > MAX_TORRENT_BYTES) throw new TorrentError(`the torrent is over ${MAX_TORRENT_BYTES} bytes`);
  const info = infoBytes(raw);
  const infoHash = hex(await crypto.subtle.digest("SHA-1", info));
  if (infoHash !== m.info_hash) {
    throw new TorrentError(`the torrent's info-hash ${infoHash} is not the signed manifest's ${m.info_hash}`);
  }
  const head = new TextEncoder().encode(`d8:announce${new TextEncoder().encode(announce).length}:${announce}4:info`);
  const out = new Uint8Array(head.length + info.length + 1);
  out.set(head, 0);
  out.set(info, head.length);
  out[out.length - 1] = 0x65; // e
  return { torrent: out, infoHash };
}
