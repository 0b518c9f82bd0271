"""A receiver that reads behind is not a slow sender (issue 28, session 18).

A probe whose own window showed the sequence numbers moving on under 90% of the
announced rate was left as unconfirmed (a slow sender cannot show the link carries the
channel). But the numbers also move on slowly when the receiver's own thread reads
behind (a host short of CPU: the rest waits in its socket, which the link carried):
in flash-crowd-50 at 49b8d26 (28 Nov 19:30, /work/runs/fc50-s18a) fibre-50 readers left
probe after probe at "path loss 0%" and ended on 4-9 of 10 channels while the sender ran
at its full 50 Mbit/s. The sender's own counters (the announcements' packets sent) tell
the two apart: when they say the sender sent at full rate, the probe is judged on its
window's gaps like any window; no channel is joined on such a window. Pure."""

from __future__ import annotations

from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.core import LayerCore
from pressrun.multicast.events import JoinChannel, LeaveChannel


def _window(layers: LayerCore, *, read: int, channels: int) -> None:
    """Each channel held: ``read`` numbers seen, all of them arrived (no gap)."""
    for ch in range(channels):
        layers.handle_sequence(ch, received=read, expected=read)
        layers.handle_packets(ch, read)


def _probe_window(*, sent_share: float) -> list[object]:
    """Four channels of 100 packets/s, windows of 0.5 s: the first window joins
    channel 1; in the probe's window the receiver reads 40 of each channel's 50 (no
    gap), and the sender's counters grow at ``sent_share`` of its rate."""
    layers = LayerCore(LayeringConfig(window_s=0.5, settle_s=0.0, start_channels=1), (100.0,) * 4)
    layers.start(now=0.0)
    layers.handle_applied(now=0.0)
    layers.handle_sent((0, 0, 0, 0), now=0.0)
    _window(layers, read=50, channels=1)
    assert layers.handle_timer(now=0.5) == [JoinChannel(1)]
    layers.handle_applied(now=0.5)
    per = round(50 * sent_share)
    layers.handle_sent((per,) * 4, now=0.5)
    _window(layers, read=40, channels=2)
    layers.handle_sent((2 * per,) * 4, now=1.0)
    effects: list[object] = list(layers.handle_timer(now=1.0))
    effects.append(("held", len(layers.joined), getattr(layers, "behind_windows", None)))
    return effects


def test_a_probe_read_behind_with_the_sender_at_full_rate_is_kept() -> None:
    """The sender's counters at its full rate, the numbers at 80% (the receiver read
    behind), no gap: the probe stays (its window showed no path loss) and nothing is
    joined on that window. On the code before it was left as unconfirmed."""
    effects = _probe_window(sent_share=1.0)
    assert not any(isinstance(e, LeaveChannel) for e in effects), effects
    assert not any(isinstance(e, JoinChannel) for e in effects), effects
    assert effects[-1] == ("held", 2, 1)


def test_a_probe_with_the_sender_short_is_still_left() -> None:
    """The sender's counters at 60% of its rate: the window cannot confirm the probe,
    which is left as before (sessions 17's rule)."""
    effects = _probe_window(sent_share=0.6)
    assert [e for e in effects if isinstance(e, LeaveChannel)] == [LeaveChannel(1, 0.0)]
    assert effects[-1] == ("held", 1, 0)
