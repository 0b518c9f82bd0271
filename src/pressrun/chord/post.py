"""One JSON POST for everything that talks to a supernode (supernodes to each other,
peers' ring clients to supernodes): the body out, a JSON object back or None.

None covers every way the other side can fail to answer usefully (not 200, no JSON, a
timeout, a reset): the callers route around a silent supernode (the Chord core's own
retries and ``NodeFailed``; the ring client looks the keys up again), so a failure is
an answer here, not an exception. ``attempts`` > 1 sends again after a connection
error or timeout only, never after an answer that was not 200.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp


async def post_json(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    timeout_s: float,
    attempts: int = 1,
) -> dict[str, Any] | None:
    """POST ``body`` as JSON to ``url``; the answer's JSON object, or None."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    for _ in range(max(1, attempts)):
        try:
            async with http.post(url, json=body, timeout=timeout) as r:
                if r.status != 200:
                    return None
                doc = await r.json(content_type=None)
                return doc if isinstance(doc, dict) else None
        except (json.JSONDecodeError, ValueError):
            return None
        except (aiohttp.ClientError, TimeoutError):
            continue
    return None
