//! The Python class `Receiver`: the crate's session for one carousel, every channel
//! fed into it, the receive loop's own decoder (`crate::fast`) and the per-channel
//! counts; the loop itself (`Receiver.receive`) is in `receive_loop`.

mod receive_loop;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use flute::core::UDPEndpoint;
use flute::receiver::{Config as ReceiverConfig, MultiReceiver};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::counts::{ChannelCounts, ChannelMap, SequenceTrack};
use crate::events::{EventQueue, EventWriterBuilder, ObjectEvent};
use crate::fast::FastObjects;
use crate::sequence::sequence_of;
use crate::session_endpoint;
use crate::socket::Batch;

/// A raw pointer the GIL-free closure may carry: the `Receiver` is `unsendable`, so
/// it is only ever used on the thread that made it, which is the one running the
/// closure (releasing the GIL moves nothing to another thread).
struct OnThisThread<T>(*mut T);
// SAFETY: see above: the pointer is dereferenced only on the thread that owns it
unsafe impl<T> Send for OnThisThread<T> {}

/// What `Receiver.receive` read: (per channel (channel, datagrams, socket drops
/// new), object packets pushed, datagrams dropped by the loss emulation, whether a
/// wake descriptor is readable, whether the object ended (events waiting)).
type ReceiveReport = (Vec<(u32, u64, u64)>, u64, u64, bool, bool);

/// A FLUTE receiver for one carousel: push every packet of every channel joined, then
/// take the `ObjectEvent`s. Not thread-safe: use it from the thread that made it.
#[pyclass(unsendable, module = "pressrun_flute")]
pub(crate) struct Receiver {
    inner: MultiReceiver,
    events: EventQueue,
    endpoint: UDPEndpoint,
    packets: u64,
    rejected: u64,
    clock_offset: Duration,
    clock_ahead: bool,
    sequences: ChannelMap<SequenceTrack>,
    counts: ChannelMap<ChannelCounts>,
    batch: Option<Batch>,
    /// the receive loop's own decoder (objects it takes never reach `inner`)
    fast: FastObjects,
    /// (group, port) of a tunnelled datagram -> channel index
    tunnel_map: std::collections::HashMap<(u32, u16), u32>,
    tunnel_messages: Vec<Vec<u8>>,
    md5_check: bool,
    rng: u64,
    /// arrival (kernel stamp, Unix s) of the first datagram read, and of the one
    /// that ended the object
    first_arrival: Option<f64>,
    end_arrival: Option<f64>,
}

#[pymethods]
impl Receiver {
    /// ``directory``: where objects are written (``<toi>.object``);
    /// ``max_cache_bytes``: memory for undecoded blocks per object (the crate's
    /// ``object_max_cache_size``; past it an object fails); ``md5_check``: let the crate
    /// reject an object whose FDT Content-MD5 does not match (off in pressrun, which
    /// checks the signed manifest piece by piece instead); ``clock_offset_s``: this
    /// receiver's clock is that many seconds ahead of the host's (negative: behind),
    /// as on a host whose clock is wrong (tests and emulations of clock skew);
    /// ``record_decodes``: keep the ESIs each RaptorQ block decode was given (64 blocks,
    /// then no more) so that `redecode` can time the crate's decode again on them
    /// (bench/multicast.py).
    #[new]
    #[pyo3(signature = (directory, *, max_cache_bytes=256 * 1024 * 1024, object_timeout_s=None, md5_check=false, clock_offset_s=0.0, record_decodes=false))]
    fn new(
        directory: PathBuf,
        max_cache_bytes: usize,
        object_timeout_s: Option<f64>,
        md5_check: bool,
        clock_offset_s: f64,
        record_decodes: bool,
    ) -> PyResult<Self> {
        if !clock_offset_s.is_finite() {
            return Err(PyValueError::new_err(
                "clock_offset_s must be a finite number",
            ));
        }
        if !directory.is_dir() {
            return Err(PyOSError::new_err(format!(
                "{directory:?} is not a directory"
            )));
        }
        let events: EventQueue = Rc::new(RefCell::new(Vec::new()));
        let fast = FastObjects::new(directory.clone(), max_cache_bytes, record_decodes);
        let writer = Rc::new(EventWriterBuilder {
            dir: directory,
            md5_check,
            events: events.clone(),
        });
        let config = ReceiverConfig {
            object_max_cache_size: Some(max_cache_bytes),
            object_timeout: object_timeout_s.map(Duration::from_secs_f64),
            object_receive_once: true,
            ..Default::default()
        };
        Ok(Self {
            inner: MultiReceiver::new(writer, Some(config), false),
            events,
            endpoint: session_endpoint(),
            packets: 0,
            rejected: 0,
            clock_offset: Duration::from_secs_f64(clock_offset_s.abs()),
            clock_ahead: clock_offset_s >= 0.0,
            sequences: ChannelMap::default(),
            counts: ChannelMap::default(),
            batch: None,
            fast,
            tunnel_map: std::collections::HashMap::new(),
            tunnel_messages: Vec::new(),
            md5_check,
            rng: 0x9E37_79B9_7F4A_7C15,
            first_arrival: None,
            end_arrival: None,
        })
    }

    /// Feed one UDP payload; returns its TOI (0 for an FDT packet) or None when the
    /// packet is not ALC/LCT or the session rejects it (counted in ``rejected``).
    fn push(&mut self, packet: &[u8]) -> Option<u128> {
        self.packets += 1;
        let toi = match flute::core::alc::parse_alc_pkt(packet) {
            Ok(alc) => alc.lct.toi,
            Err(_) => {
                self.rejected += 1;
                return None;
            }
        };
        match self.inner.push(&self.endpoint, packet, self.now()) {
            Ok(()) => Some(toi),
            Err(_) => {
                self.rejected += 1;
                None
            }
        }
    }

    /// Feed one UDP payload received on channel ``channel``: as `push`, and its
    /// channel sequence number (if any) counted for that channel.
    fn push_channel(&mut self, channel: u32, packet: &[u8]) -> Option<u128> {
        if let Ok(alc) = flute::core::alc::parse_alc_pkt(packet) {
            if let Some(seq) = sequence_of(packet, &alc.lct) {
                self.sequences.entry(channel).or_default().see(seq);
            }
        }
        self.push(packet)
    }

    /// Per channel, (packets with a sequence number, packets the sequence numbers
    /// say were sent) since the last call; the counts start again from zero.
    fn take_sequence_counts(&mut self) -> Vec<(u32, u64, u64)> {
        let mut out: Vec<(u32, u64, u64)> = self
            .sequences
            .iter_mut()
            .map(|(&ch, track)| {
                let counts = (ch, track.received, track.expected);
                track.received = 0;
                track.expected = 0;
                counts
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Forget channel ``channel``'s sequence numbers (it was left: a later join
    /// starts from the first packet then, the numbers sent meanwhile are not lost).
    fn forget_channel(&mut self, channel: u32) {
        self.sequences.remove(&channel);
        self.counts.remove(&channel);
    }

    /// The receive loop, without the GIL: wait for datagrams on ``channels`` (pairs
    /// of channel index and the socket's descriptor, which stays the caller's), read
    /// them in batches with recvmmsg, count each channel's datagrams, sequence
    /// numbers and socket drops (SO_RXQ_OVFL), and push every one into the session.
    /// After each round that read something it waits ``batch_wait_s`` so the next
    /// round reads that time's datagrams in one go. Returns when the object ends
    /// (its event is waiting: `take_events`), when one of ``wake_fds`` is readable
    /// (the control socket: not read here), or after ``timeout_s``; a
    /// `ReceiveReport`. ``drop_probability`` drops that share of the datagrams at
    /// random (loss emulation for tests and benchmarks; ``seed`` sets the draw).
    /// ``tunnel_fd``: an AMT gateway's UDP socket to its relay (RFC 7450): each
    /// Multicast Data message is unwrapped (IPv4 and UDP headers) and counted on the
    /// channel `set_tunnel_channels` maps its (group, port) to; any other message
    /// (the relay's Membership Query), and Multicast Data of a (group, port) not
    /// mapped (the control channel), is kept for `take_tunnel_messages` (at most 64)
    /// and ends the call as a wake descriptor does.
    #[pyo3(signature = (channels, timeout_s, *, wake_fds=Vec::new(), batch_wait_s=0.02,
        drop_probability=0.0, seed=None, tunnel_fd=None))]
    #[allow(clippy::too_many_arguments)]
    fn receive(
        &mut self,
        py: Python<'_>,
        channels: Vec<(u32, i32)>,
        timeout_s: f64,
        wake_fds: Vec<i32>,
        batch_wait_s: f64,
        drop_probability: f64,
        seed: Option<u64>,
        tunnel_fd: Option<i32>,
    ) -> PyResult<ReceiveReport> {
        if !(timeout_s >= 0.0 && batch_wait_s >= 0.0) {
            return Err(PyValueError::new_err("durations must not be negative"));
        }
        if !(0.0..1.0).contains(&drop_probability) {
            return Err(PyValueError::new_err("drop_probability must be in [0, 1)"));
        }
        if let Some(seed) = seed {
            self.rng = seed | 1;
        }
        let this = OnThisThread(self as *mut Self);
        py.detach(move || {
            let this = this;
            // SAFETY: OnThisThread: this thread owns the receiver, and Python cannot
            // touch it while the call runs (it holds the only &mut)
            let me = unsafe { &mut *this.0 };
            me.receive_loop(
                &channels,
                timeout_s,
                &wake_fds,
                batch_wait_s,
                drop_probability,
                tunnel_fd,
            )
        })
        .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Arrival (the kernel's stamp, Unix seconds) of the first datagram `receive`
    /// read, or None.
    #[getter]
    fn first_arrival(&self) -> Option<f64> {
        self.first_arrival
    }

    /// Arrival of the datagram after which the object ended, or None.
    #[getter]
    fn end_arrival(&self) -> Option<f64> {
        self.end_arrival
    }

    /// The events since the last call, oldest first.
    fn take_events(&mut self) -> Vec<ObjectEvent> {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// Drop expired objects and sessions (call now and then).
    fn cleanup(&mut self) {
        let now = self.now();
        self.inner.cleanup(now);
    }

    #[getter]
    fn packets(&self) -> u64 {
        self.packets
    }

    #[getter]
    fn rejected(&self) -> u64 {
        self.rejected
    }

    /// The channels an AMT tunnel carries: (group, port, channel index) each; a
    /// tunnelled datagram of another (group, port) (the control channel) is kept
    /// whole for `take_tunnel_messages` like the relay's own messages.
    fn set_tunnel_channels(&mut self, channels: Vec<(String, u16, u32)>) -> PyResult<()> {
        let mut map = std::collections::HashMap::new();
        for (group, port, index) in channels {
            let ip: std::net::Ipv4Addr = group
                .parse()
                .map_err(|e| PyValueError::new_err(format!("{group:?} is not IPv4: {e}")))?;
            map.insert((u32::from(ip), port), index);
        }
        self.tunnel_map = map;
        Ok(())
    }

    /// The relay's messages the receive loop read on the tunnel (not Multicast
    /// Data), oldest first.
    fn take_tunnel_messages<'py>(&mut self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        std::mem::take(&mut self.tunnel_messages)
            .iter()
            .map(|m| PyBytes::new(py, m))
            .collect()
    }

    /// Blocks the receive loop's own decoder tried to decode and could not yet
    /// (RaptorQ: rank-deficient, one more symbol then), over the objects it followed.
    #[getter]
    fn decode_retries(&self) -> u64 {
        self.fast.failed_decodes()
    }

    /// RaptorQ block decodes the receive loop's own decoder attempted (blocks that
    /// lacked source symbols when enough symbols came), over the objects it followed;
    /// 0 for a receiver that got every source symbol.
    #[getter]
    fn decodes(&self) -> u64 {
        self.fast.decode_cost().0
    }

    /// The receive thread's CPU seconds those decodes took (CLOCK_THREAD_CPUTIME_ID
    /// around each): the decode's share of the receive path's CPU.
    #[getter]
    fn decode_cpu_s(&self) -> f64 {
        self.fast.decode_cost().1
    }

    /// Of `decode_cpu_s`, the `raptorq` crate's `SourceBlockDecoder::decode` calls
    /// alone (the symbols already copied out for it): the crate's share of the
    /// receive path's CPU, the rest of the decode share (copies, the decoder's set-up)
    /// the binding's.
    #[getter]
    fn crate_decode_cpu_s(&self) -> f64 {
        self.fast.crate_decode_cpu_s()
    }

    /// With ``record_decodes``: the `raptorq` crate's decode timed again, without the
    /// GIL, on every recorded block of a completed object, given the same ESIs (the
    /// symbols made from the object's file by the crate's encoder beforehand, so warm
    /// in cache): (blocks, thread CPU seconds of the decodes alone, whether each
    /// decoded to the file's bytes). The crate's own cost on the data this receiver
    /// decoded, for the bench to set beside the receive path's.
    fn redecode(&self, py: Python<'_>) -> PyResult<(u64, f64, bool)> {
        let fast = &self.fast;
        let this = OnThisThread(fast as *const FastObjects as *mut FastObjects);
        py.detach(move || {
            let this = this;
            // SAFETY: OnThisThread: this thread owns the receiver; only read here
            let fast = unsafe { &*this.0 };
            fast.redecode()
        })
        .map(|r| (r.blocks, r.cpu_s, r.bit_exact))
        .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// The receive thread's CPU seconds spent writing completed blocks to the
    /// objects' files (each block is written at its offset once it is complete).
    #[getter]
    fn write_cpu_s(&self) -> f64 {
        self.fast.write_cost()
    }

    /// The receive thread's CPU seconds spent bringing in the objects' buffers (fresh
    /// memory, populated 256 kB at a time as the symbols first reach it): what a
    /// receiver pays for memory beyond the loop's own work (docs/multicast.md,
    /// "Receiver CPU"); 0 where the kernel cannot populate (before Linux 5.14: the
    /// pages are faulted in by the writes instead, uncounted).
    #[getter]
    fn memory_cpu_s(&self) -> f64 {
        self.fast.memory_cost()
    }

    /// The bytes of object ``toi`` this receiver holds already (pieces it took from
    /// the swarm and checked): ``ranges`` of (start, length) in the file ``path``, at
    /// the same offsets as in the object. When the object's first packet comes, the
    /// receive loop's decoder takes every source symbol wholly inside them as if it
    /// had arrived, so each block needs only the source symbols it lacks from the
    /// network (RaptorQ or no-code objects with EXT_FTI, the carousel's; a file that
    /// cannot be read gives nothing). `known_symbols` counts them.
    fn set_known(&mut self, toi: u128, path: PathBuf, ranges: Vec<(u64, u64)>) {
        self.fast.set_known(toi, path, ranges);
    }

    /// Source symbols taken from the bytes `set_known` named instead of the network.
    #[getter]
    fn known_symbols(&self) -> u64 {
        self.fast.known_symbols
    }
}

impl Receiver {
    /// The receiver's clock: the host's, moved by ``clock_offset_s``.
    fn now(&self) -> SystemTime {
        if self.clock_ahead {
            SystemTime::now() + self.clock_offset
        } else {
            SystemTime::now() - self.clock_offset
        }
    }
}
