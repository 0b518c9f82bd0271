"""The client: ``pressrun get`` and the programmatic `fetch_issue`.

Modules: :mod:`config` (desktop / mobile profiles), :mod:`events` and :mod:`core`
(the pure download plan: sections, handoffs, failed origins, the give-up rule),
:mod:`codec` (directive JSON and the resume state file), :mod:`library` (the local
library: partial downloads, trusted publishers, atomic arrival), :mod:`aio` (the
aiohttp adapter, `fetch_issue`), :mod:`cli` (``pressrun get``).
"""

from __future__ import annotations
