"""The swarm peer: a libtorrent session driven from asyncio, the fair-exit rule.

Public API (docs/swarm.md):

- `pressrun.peer.aio.fetch_via_swarm(...) -> SwarmResult`: download an issue from its
  swarm (origins as web seeds), verify it against the manifest, seed it by the
  fair-exit rules, leave; or report a stall with the verified pieces handed over.
- `pressrun.peer.aio.SwarmPeer`: the same, step by step.
- `pressrun.peer.config`: `PeerConfig`, `desktop_profile()`, `mobile_profile()`,
  `profile_config(name, metered=)`.
- `pressrun.peer.core`: the pure decisions (`PeerCore`, `fair_to_leave`).
- `pressrun.peer.uploader`: the uploader-choice hook for the Chord ring.
- `pressrun.peer.loopback`: a whole swarm on 127.0.0.1 for tests, benches and demos.
- `pressrun seed` (`pressrun.peer.cli`).

Only this package imports libtorrent for swarming; `core`, `events` and `config` are
pure (no clock, no I/O).
"""
