"""The Chord ring (Stoica et al., SIGCOMM 2001 / ToN 2003) for piece keys.

- `pressrun.chord.ids`: 160-bit SHA-1 identifiers, ring intervals, piece keys.
- `pressrun.chord.events`: the messages between nodes and the effects of the core.
- `pressrun.chord.config`: `ChordConfig`, timers and list sizes with their defaults.
- `pressrun.chord.core`: `ChordNode`, one node's protocol, pure (no socket, no clock).
- `pressrun.chord.routing`: `RoutingTable`, a node's predecessor, successors, fingers.
- `pressrun.chord.inflight`: a node's open requests and lookups in progress.

docs/chord.md has the whole story.
"""
