"""The client: ``pressrun get`` and the programmatic `fetch_issue`.

Modules: :mod:`config` (desktop / mobile profiles), :mod:`events` and :mod:`core`
(the pure download plan: sections, handoffs, failed origins, the give-up rule),
:mod:`codec` (directive JSON and the resume state file), :mod:`library` (the local
library: partial downloads, trusted publishers, atomic arrival), :mod:`aio` (the
aiohttp adapter, `fetch_issue`) and its stages: :mod:`session` (shared state, the
balancer's directives), :mod:`manifest_fetch`, :mod:`multicast_receive`,
:mod:`swarm_handoff`, :mod:`sections` (origin Range requests); :mod:`cli`
(``pressrun get``).
"""

from __future__ import annotations
