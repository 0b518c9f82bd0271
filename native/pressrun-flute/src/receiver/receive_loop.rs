//! The receive loop (`Receiver.receive`), run without the GIL: wait for the channel
//! sockets, read them in batches, count each channel's datagrams, sequence numbers and
//! socket drops, unwrap an AMT tunnel's Multicast Data, and give each packet to the
//! binding's own decoder (`crate::fast`) or the crate's session.

use std::time::Duration;

use super::{ReceiveReport, Receiver};
use crate::events::ObjectEvent;
use crate::fast::Taken;
use crate::sequence::sequence_of;
use crate::socket::{wait_readable, Batch, BATCH};

/// The channel key of an AMT tunnel's socket in the receive loop.
const TUNNEL_CHANNEL: u32 = u32::MAX;
/// Relay messages kept for Python at most (a relay sends one query per request).
const MAX_TUNNEL_MESSAGES: usize = 64;

/// An AMT Multicast Data message (RFC 7450 section 5.1.6: version 0, type 6, a
/// reserved byte, then a whole IPv4 datagram): (group, UDP destination port, UDP
/// payload) of the UDP datagram it carries; None for any other message or a datagram
/// that is not whole IPv4/UDP.
fn unwrap_multicast_data(data: &[u8]) -> Option<(u32, u16, &[u8])> {
    if data.len() < 2 + 20 + 8 || data[0] != 6 {
        return None;
    }
    let ip = &data[2..];
    if ip[0] >> 4 != 4 || ip[9] != 17 {
        return None;
    }
    let ihl = ((ip[0] & 0x0F) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total < ihl + 8 || total > ip.len() {
        return None;
    }
    let group = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let udp = &ip[ihl..total];
    let port = u16::from_be_bytes([udp[2], udp[3]]);
    let length = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if length < 8 || length > udp.len() {
        return None;
    }
    Some((group, port, &udp[8..length]))
}

impl Receiver {
    fn next_random(&mut self) -> f64 {
        // xorshift64*: the loss emulation needs speed, not quality
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(super) fn receive_loop(
        &mut self,
        channels: &[(u32, i32)],
        timeout_s: f64,
        wake_fds: &[i32],
        batch_wait_s: f64,
        drop_probability: f64,
        tunnel_fd: Option<i32>,
    ) -> std::io::Result<ReceiveReport> {
        let end = std::time::Instant::now() + Duration::from_secs_f64(timeout_s);
        let mut batch = self.batch.take().unwrap_or_else(Batch::new);
        // an AMT tunnel's socket reads as one more channel (TUNNEL_CHANNEL): its
        // Multicast Data is unwrapped to the channel of the inner (group, port)
        let mut all: Vec<(u32, i32)> = channels.to_vec();
        if let Some(fd) = tunnel_fd {
            all.push((TUNNEL_CHANNEL, fd));
        }
        let channels_in = channels;
        let channels = &all[..];
        let mut fds: Vec<i32> = channels.iter().map(|&(_, fd)| fd).collect();
        fds.extend_from_slice(wake_fds);
        let (mut object_packets, mut emulated) = (0u64, 0u64);
        let mut woken = false;
        let mut ended = !self.events.borrow().is_empty();
        let result = (|| -> std::io::Result<()> {
            while !ended && !woken {
                let now = std::time::Instant::now();
                if now >= end {
                    break;
                }
                let ready = wait_readable(&fds, end - now)?;
                woken = ready[channels.len()..].iter().any(|&r| r);
                // one clock reading per round: the session uses it for expiries only
                let clock = self.now();
                let mut read = false;
                for (&(socket_channel, fd), _) in channels.iter().zip(&ready).filter(|(_, r)| **r) {
                    'socket: loop {
                        let n = batch.read(fd)?;
                        read |= n > 0;
                        for i in 0..n {
                            let (mut data, arrived, drops) = batch.datagram(i);
                            // the socket's drop count, kept per socket: the tunnel's
                            // (TUNNEL_CHANNEL) is one count for all the channels it
                            // carries, reported on the base channel below
                            if let Some(drops) = drops {
                                let counts = self.counts.entry(socket_channel).or_default();
                                counts.drops_new += drops.wrapping_sub(counts.drops_seen) as u64;
                                counts.drops_seen = drops;
                            }
                            let mut channel = socket_channel;
                            if socket_channel == TUNNEL_CHANNEL {
                                match unwrap_multicast_data(data) {
                                    Some((group, port, inner)) => {
                                        match self.tunnel_map.get(&(group, port)) {
                                            Some(&mapped) => {
                                                channel = mapped;
                                                data = inner;
                                            }
                                            None => {
                                                // another group (the control channel
                                                // through the tunnel): Python's, whole
                                                if self.tunnel_messages.len() < MAX_TUNNEL_MESSAGES
                                                {
                                                    self.tunnel_messages.push(data.to_vec());
                                                } else {
                                                    self.rejected += 1;
                                                }
                                                woken = true;
                                                continue;
                                            }
                                        }
                                    }
                                    None => {
                                        // a relay's message (a Membership Query): Python's
                                        if self.tunnel_messages.len() < MAX_TUNNEL_MESSAGES {
                                            self.tunnel_messages.push(data.to_vec());
                                        }
                                        woken = true;
                                        continue;
                                    }
                                }
                            }
                            if self.first_arrival.is_none() {
                                self.first_arrival = arrived;
                            }
                            if drop_probability > 0.0 && self.next_random() < drop_probability {
                                emulated += 1;
                                continue;
                            }
                            // looked up again: next_random borrowed self meanwhile
                            self.counts.entry(channel).or_default().received += 1;
                            // one parse for the sequence number and the TOI (the
                            // session parses again: its API takes bytes)
                            self.packets += 1;
                            match flute::core::alc::parse_alc_pkt(data) {
                                Ok(alc) => {
                                    if let Some(seq) = sequence_of(data, &alc.lct) {
                                        self.sequences.entry(channel).or_default().see(seq);
                                    }
                                    let toi = alc.lct.toi;
                                    // object packets to the binding's own decoder (fast.rs);
                                    // the FDT and objects it does not take to the session
                                    let taken = if toi != 0 && !self.md5_check {
                                        self.fast.push(&alc, data)
                                    } else {
                                        Taken::NotMine
                                    };
                                    match taken {
                                        Taken::Kept => object_packets += 1,
                                        Taken::Refused => self.rejected += 1,
                                        Taken::WriteFailed => {
                                            self.events.borrow_mut().push(ObjectEvent {
                                                kind: "error".to_owned(),
                                                toi,
                                                content_location: String::new(),
                                                path: None,
                                                content_length: None,
                                            });
                                        }
                                        Taken::Completed(path, length) => {
                                            object_packets += 1;
                                            self.events.borrow_mut().push(ObjectEvent {
                                                kind: "completed".to_owned(),
                                                toi,
                                                content_location: String::new(),
                                                path: Some(path),
                                                content_length: Some(length),
                                            });
                                        }
                                        Taken::NotMine | Taken::Failed => {
                                            match self.inner.push(&self.endpoint, data, clock) {
                                                Ok(()) if toi != 0 => object_packets += 1,
                                                Ok(()) => {}
                                                Err(_) => self.rejected += 1,
                                            }
                                        }
                                    }
                                }
                                Err(_) => self.rejected += 1,
                            }
                            if !self.events.borrow().is_empty() {
                                // stop at the datagram that ended the object
                                self.end_arrival = arrived;
                                ended = true;
                                break 'socket;
                            }
                        }
                        // a socket that never drains (a thread reading slower than its
                        // channels arrive: a host short of CPU) still gives the call
                        // back by its timeout: before, full batches kept it here until
                        // the object ended, and the layering (Python) got no turn
                        // (flash-crowd-50 at 49b8d26: a dsl-20 reader on 6 channels of a
                        // link that carries 4 ended no window for its last 15 s)
                        if n < BATCH || std::time::Instant::now() >= end {
                            break;
                        }
                    }
                    if ended {
                        break;
                    }
                }
                if read && !ended && !woken {
                    let left = end.saturating_duration_since(std::time::Instant::now());
                    std::thread::sleep(Duration::from_secs_f64(batch_wait_s).min(left));
                }
            }
            Ok(())
        })();
        self.batch = Some(batch);
        result?;
        let mut reported: Vec<u32> = channels_in.iter().map(|&(channel, _)| channel).collect();
        if tunnel_fd.is_some() {
            reported.extend(self.tunnel_map.values().copied());
            reported.sort_unstable();
            reported.dedup();
        }
        // the tunnel socket's drops (SO_RXQ_OVFL on the gateway's socket: a reader
        // starved of CPU overflows it as it would its channel sockets) count as the
        // base (lowest) channel's own drops: which channel's datagrams they were the
        // kernel does not say, and the base channel is always joined
        let mut tunnel_drops = 0u64;
        if tunnel_fd.is_some() && !reported.is_empty() {
            if let Some(counts) = self.counts.get_mut(&TUNNEL_CHANNEL) {
                tunnel_drops = std::mem::take(&mut counts.drops_new);
            }
        }
        let mut per_channel: Vec<(u32, u64, u64)> = reported
            .iter()
            .map(|&channel| {
                let counts = self.counts.entry(channel).or_default();
                let report = (channel, counts.received, counts.drops_new);
                counts.received = 0;
                counts.drops_new = 0;
                report
            })
            .collect();
        per_channel.sort_unstable();
        if let Some(base) = per_channel.first_mut() {
            base.2 += tunnel_drops;
        }
        Ok((per_channel, object_packets, emulated, woken, ended))
    }
}
