//! What the receive loop counts per channel: the sequence numbers' track (`SequenceTrack`)
//! and the datagrams and socket drops (`ChannelCounts`), in maps keyed by channel index
//! (`ChannelMap`).

use crate::sequence::SEQUENCE_MODULO;

/// What a receiver counted on one channel from the sequence numbers: ``received``
/// packets that carried one, and ``expected``, how far the highest number seen moved
/// on (a gap is packets lost before this socket's queue or in it).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SequenceTrack {
    highest: Option<u32>,
    pub(crate) received: u64,
    pub(crate) expected: u64,
}

/// Beyond this many numbers back, a sequence number means the sender restarted (its
/// counters begin again): the track starts over from it.
const SEQUENCE_RESTART_GAP: u32 = 4096;

impl SequenceTrack {
    pub(crate) fn see(&mut self, seq: u32) {
        self.received += 1;
        match self.highest {
            None => {
                self.highest = Some(seq);
                self.expected += 1;
            }
            Some(high) => {
                let ahead = seq.wrapping_sub(high) % SEQUENCE_MODULO;
                if ahead == 0 {
                    // a duplicate: counted received, expects nothing more
                } else if ahead < SEQUENCE_MODULO / 2 {
                    self.highest = Some(seq);
                    self.expected += ahead as u64;
                } else if SEQUENCE_MODULO - ahead > SEQUENCE_RESTART_GAP {
                    self.highest = Some(seq);
                    self.expected += 1;
                }
                // else: late (reordered), already expected
            }
        }
    }
}

/// A hasher for channel indices (small integers this process chose): the receive
/// loop looks its channel up in two maps per datagram, where std's SipHash, made
/// for keys from the network, costs more than the lookup needs.
#[derive(Default)]
pub(crate) struct ChannelHasher(u64);

impl std::hash::Hasher for ChannelHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by channel index.
pub(crate) type ChannelMap<T> =
    std::collections::HashMap<u32, T, std::hash::BuildHasherDefault<ChannelHasher>>;

/// One channel's counts in the receive loop.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ChannelCounts {
    /// datagrams read since the last report
    pub(crate) received: u64,
    /// the socket's SO_RXQ_OVFL count when last seen
    pub(crate) drops_seen: u32,
    /// its growth since the last report
    pub(crate) drops_new: u64,
}
