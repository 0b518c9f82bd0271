"""The embargo rule of the subscription service (issue 35), pure.

An issue version with a release notice (``pressrun.content.release``) has its wraps
handed out only from the notice's ``release_at`` on, by the **service's** clock: the
publisher's clock only wrote the time, and no reader's clock is asked. Before it,
the answer is ``403 embargoed`` with the release time, the seconds left by the
service's clock (``retry_after_s``, also as ``Retry-After``) and the signed notice,
so a reader that pre-positioned the ciphertext knows when to ask again without
trusting its own clock (docs/protocols.md, "Embargo"). A revoked notice answers
``410 revoked``. No notice: no embargo (every issue published before issue 35).

The caller passes ``now_unix`` (wall-clock Unix seconds, since a release time is a
wall-clock time shared between hosts).
"""

from __future__ import annotations

import math

from pressrun.content.release import SignedRelease
from pressrun.subscriptions.codec import RequestError

__all__ = ["embargo_refusal"]


def embargo_refusal(release: SignedRelease | None, *, now_unix: float) -> RequestError | None:
    """The refusal of a wrap under ``release`` at ``now_unix``, or None to hand it out."""
    if release is None:
        return None
    notice = release.notice
    what = f"{notice.issue_id} version {notice.version}"
    at = notice.release_at_unix
    if at is None:
        return RequestError(
            410,
            "revoked",
            f"{what} was withdrawn by its publisher before its release: no wrap is handed out",
            extra={"release": release.to_json()},
        )
    if now_unix >= at:
        return None
    left_s = at - now_unix
    return RequestError(
        403,
        "embargoed",
        f"{what} is released at {notice.release_at}; ask for the wrap again then "
        f"(in {left_s:.0f} s)",
        extra={
            "release_at": notice.release_at,
            "retry_after_s": round(left_s, 3),
            "release": release.to_json(),
        },
        headers={"Retry-After": str(max(1, math.ceil(left_s)))},
    )
