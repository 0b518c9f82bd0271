"""Multicast delivery at peak demand: FLUTE carousel channels with RaptorQ.

- `config`: the sender's carousel settings and the receiver's layering thresholds;
- `events`: the channel plan, the control-channel announcement, the cores' effects;
- `core`: pure decisions: which packet goes on which channel (the channel plan), the
  carousel schedule and its pacing, the receiver's join/leave (receiver-driven
  layering), and which announcements a receiver accepts;
- `codec`: the announcement's JSON;
- `control`: signing and checking announcements (Ed25519, PyNaCl);
- `sender`: ``pressrun serve multicast``: the service and its HTTP control API; its
  parts: `carousels` (starting, stopping and upkeep of the carousels), `send` (the send
  thread; the FLUTE packets come from pressrun's binding over the Rust crate
  ``flute``), `announce` (the control channel), `metrics` (``/metrics``), `prepare`
  (passes encoded at publish time), `plans` (groups, ports and TSI), `net` (sockets);
- `receiver`: joining a carousel inside ``pressrun get``.

See docs/multicast.md.
"""
