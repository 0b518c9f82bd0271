// The background prefetch's pure rules (prefetch.js): which piece the origins are
// asked for beside the prefetchers' swarm, and what a balancer's prefetch grant says
// (its times and rate, the swarm it names). No clock, no network, no storage: callers
// pass what they saw (the tests call nextOriginPiece in the page with explicit values).

/** The most a granted or waiting prefetch waits before it asks the balancer again. */
const MAX_WAIT_S = 300;
/** With every missing piece held by a peer, the origins wait this long without a
 * byte from the peers (clients/prefetch_swarm.py's PEER_PATIENCE_S). */
export const PEER_PATIENCE_S = 3;

/**
 * The piece to ask the origins for next, or null: let the peers bring it (pure;
 * clients/prefetch_swarm.py's next_origin_piece). A piece no connected peer holds
 * first, chosen at random among them (two prefetchers rarely pay the origins for the
 * same piece); when peers hold every missing piece, null unless the peers have sent
 * nothing for PEER_PATIENCE_S: then the least held. `random()` in [0, 1).
 */
export function nextOriginPiece(missing, availability, peersIdleS, random = Math.random) {
  if (!missing.length) return null;
  const held = missing.map((i) => availability[i] ?? 0);
  const nobody = missing.filter((_, k) => held[k] <= 0);
  if (nobody.length) return nobody[Math.floor(random() * nobody.length)];
  if (peersIdleS < PEER_PATIENCE_S) return null;
  const least = Math.min(...held);
  const some = missing.filter((_, k) => held[k] === least);
  return some[Math.floor(random() * some.length)];
}

/** The prefetchers' swarm a grant names ({torrent_url, webtorrent_url}), or null. */
export function swarmOf(doc) {
  const swarm = doc?.swarm;
  const url = (u, schemes) => typeof u === "string" && schemes.some((p) => u.startsWith(p));
  if (!url(swarm?.torrent_url, ["http://", "https://"]) || !url(swarm?.webtorrent_url, ["ws://", "wss://"])) return null;
  return { torrent_url: swarm.torrent_url, webtorrent_url: swarm.webtorrent_url };
}

/** A non-negative finite number of a balancer's answer (times capped), or null. */
export function seconds(doc, key) {
  const v = doc?.[key];
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) return null;
  return key === "rate_bytes_per_s" ? v : Math.min(v, MAX_WAIT_S);
}
