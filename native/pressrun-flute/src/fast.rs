//! The receive loop's own object decoder: each symbol copied once, into place.
//!
//! The crate's receiver session costs 3.5-5.5 us a packet when packets arrive as they
//! do on a carousel (a few dozen every 20 ms, the caches cold between rounds): per
//! packet it parses the ALC header again, copies the symbol into a new `Vec`, hashes
//! its ESI into the RaptorQ decoder, and the first blocks of a fresh thread fault in
//! their pages one by one (glibc's per-thread arena grows and shrinks its heap). Here
//! (docs/multicast.md, "Receiver CPU"):
//!
//! - the object is one buffer of its transfer length (transparent huge pages while
//!   they come cheap, else 4 kB pages; brought in 256 kB at a time as the symbols
//!   first reach them, `Mapping::touch`); a source symbol is copied straight to its
//!   place in it, so a block whose source symbols all arrived needs no decoding and
//!   no further copy;
//! - a repair symbol is copied into the slot of a source symbol that has not come
//!   (a receiver joined after the source symbols fills the buffer with repair
//!   symbols instead of thousands of small allocations in fresh 4 kB pages), or,
//!   past the free slots, into a buffer of its own; the decoder gets copies;
//! - a block is decoded (RaptorQ, RFC 6330, the `raptorq` crate the `flute` crate
//!   uses) once it holds enough distinct symbols (`decode_extra`), and only then;
//! - each block is written to the file at its offset as soon as it is complete: from
//!   the object's buffer when every source symbol came, else straight from the
//!   decoder's output (the rebuilt symbols are not copied into the buffer first), and
//!   the buffer's pages of that block are given back (a 2 GB issue's memory falls as
//!   its blocks complete).
//!
//! It takes objects whose packets carry their FEC Object Transmission Information
//! (EXT_FTI, which the crate's sender adds to every packet), uncompressed, with
//! Compact No-Code FEC or RaptorQ without sub-blocking (N = 1), the FEC schemes
//! pressrun's carousel sends; any other object goes to the crate's session as before.
//!
//! The parts: `object` (one object: its blocks, the symbols into place, the decode
//! and the block writes), `placement` (the object's buffer in memory and its file on
//! disk), `record` (the decodes' inputs kept and timed again); this module holds the
//! objects the loop feeds (`FastObjects`: which packets are whose, the eviction, the
//! known pieces, the counters).

// (by path: examples/receive_cost.rs compiles this file in as a module of its own)
#[path = "fast/object.rs"]
mod object;
#[path = "fast/placement.rs"]
mod placement;
#[path = "fast/record.rs"]
mod record;

use std::fs::File;
use std::path::PathBuf;

use flute::core::alc::AlcPkt;

use object::{raptorq_scheme, FastObject, Fec};
use record::DecodeRecord;

/// Objects followed at once (a carousel's receiver sees one; strangers' TOIs evict
/// the oldest).
const MAX_OBJECTS: usize = 4;
/// Block decodes whose inputs (the ESIs given to the decoder) a receiver that records
/// them keeps (`FastObjects::redecode`; an 8 MiB issue is 7 blocks): an object that
/// comes gets what is left of this, so at most this many for objects that come one
/// after another, at most MAX_OBJECTS times it for objects received at once.
const MAX_DECODE_RECORDS: usize = 64;

/// CPU time of the calling thread, in seconds (CLOCK_THREAD_CPUTIME_ID): the
/// decode's share of the receive thread's CPU, which the bench prints beside the
/// whole (docs/multicast.md, "Receiver CPU").
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A fixed-size set of small integers.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    /// Set bit ``i``; whether it was clear.
    fn insert(&mut self, i: usize) -> bool {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        let fresh = self.0[word] & bit == 0;
        self.0[word] |= bit;
        fresh
    }

    fn contains(&self, i: usize) -> bool {
        self.0
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }
}

/// What became of a packet offered to `FastObjects::push`.
pub enum Taken {
    /// not an object this decoder takes: give it to the crate's session
    NotMine,
    /// kept (or a duplicate, or for an object already complete)
    Kept,
    /// refused (SBN or ESI outside the object, oversize symbol)
    Refused,
    /// this packet completed the object: its file and length
    Completed(PathBuf, usize),
    /// the object's file could not be written (it is removed; the object is over)
    WriteFailed,
    /// the object cannot be received here (file or memory failed): the crate's
    /// session takes it from this packet on
    Failed,
}

/// The objects the receive loop decodes itself, at most `MAX_OBJECTS`.
pub struct FastObjects {
    dir: PathBuf,
    max_bytes: usize,
    objects: Vec<FastObject>,
    /// (TSI, TOI) this decoder does not take: the crate's session has them
    declined: Vec<(u64, u128)>,
    /// the decode counts of objects no longer followed (evicted)
    retired_decodes: u64,
    retired_decode_cpu_s: f64,
    retired_crate_decode_cpu_s: f64,
    retired_write_cpu_s: f64,
    retired_memory_cpu_s: f64,
    /// keep what each block decode was given (`redecode`), at most
    /// MAX_DECODE_RECORDS over all objects
    record: bool,
    retired_records: Vec<DecodeRecord>,
    /// bytes this receiver holds already of one object (`set_known`): its TOI, the
    /// file they are in and their (start, length) ranges; taken when it comes
    known: Option<KnownBytes>,
    /// source symbols taken from `known` instead of the network
    pub known_symbols: u64,
}

/// What `set_known` names of one object: its TOI, the file holding those bytes and
/// their (start, length) ranges.
type KnownBytes = (u128, PathBuf, Vec<(u64, u64)>);

impl FastObjects {
    /// Objects written into ``dir``, each of at most ``max_bytes``; with ``record``,
    /// what each block decode was given is kept for `redecode`.
    pub fn new(dir: PathBuf, max_bytes: usize, record: bool) -> Self {
        Self {
            dir,
            max_bytes,
            objects: Vec::new(),
            declined: Vec::new(),
            retired_decodes: 0,
            retired_decode_cpu_s: 0.0,
            retired_crate_decode_cpu_s: 0.0,
            retired_write_cpu_s: 0.0,
            retired_memory_cpu_s: 0.0,
            record,
            retired_records: Vec::new(),
            known: None,
            known_symbols: 0,
        }
    }

    /// The bytes of object ``toi`` this receiver holds already: ``ranges`` (start,
    /// length) of ``path``, at the same offsets as in the object. When the object's
    /// first packet comes, every source symbol wholly inside them is taken from the
    /// file as if it had arrived (`FastObject::take_known`).
    pub fn set_known(&mut self, toi: u128, path: PathBuf, ranges: Vec<(u64, u64)>) {
        self.known = Some((toi, path, ranges));
    }

    /// Offer an object packet (TOI above 0) parsed as ``alc``.
    pub fn push(&mut self, alc: &AlcPkt, data: &[u8]) -> Taken {
        let (tsi, toi) = (alc.lct.tsi, alc.lct.toi);
        let index = match self
            .objects
            .iter()
            .position(|o| o.tsi == tsi && o.toi == toi)
        {
            Some(i) => i,
            None => {
                if self.declined.contains(&(tsi, toi)) {
                    return Taken::NotMine;
                }
                if self.declined.len() >= MAX_OBJECTS {
                    self.declined.remove(0);
                }
                let compressed = alc.cenc.is_some_and(|c| c as u8 != 0);
                let (Some(oti), Some(length)) = (alc.oti.as_ref(), alc.transfer_length) else {
                    return Taken::NotMine;
                };
                let made = if compressed {
                    None
                } else {
                    let scheme = raptorq_scheme(data, alc);
                    let kept = self.retired_records.len()
                        + self.objects.iter().map(|o| o.records.len()).sum::<usize>();
                    let room = if self.record {
                        MAX_DECODE_RECORDS.saturating_sub(kept)
                    } else {
                        0
                    };
                    FastObject::new(
                        &self.dir,
                        tsi,
                        toi,
                        oti,
                        length,
                        scheme,
                        self.max_bytes,
                        room,
                    )
                };
                match made {
                    None => {
                        self.declined.push((tsi, toi));
                        return Taken::NotMine;
                    }
                    Some(Err(_)) => {
                        // the crate's session takes it from here (and fails as it will)
                        self.declined.push((tsi, toi));
                        return Taken::Failed;
                    }
                    Some(Ok(object)) => {
                        if self.objects.len() >= MAX_OBJECTS {
                            // the oldest goes; an incomplete one takes its file along
                            let mut gone = self.objects.remove(0);
                            self.retired_decodes += gone.decodes;
                            self.retired_decode_cpu_s += gone.decode_cpu_s;
                            self.retired_crate_decode_cpu_s += gone.crate_decode_cpu_s;
                            self.retired_write_cpu_s += gone.write_cpu_s;
                            self.retired_memory_cpu_s += gone.memory_cost();
                            if gone.complete {
                                self.retired_records.append(&mut gone.records);
                            } else {
                                std::fs::remove_file(&gone.path).ok();
                            }
                        }
                        self.objects.push(object);
                        let index = self.objects.len() - 1;
                        if let Some((_, path, ranges)) = self.known.take_if(|k| k.0 == toi) {
                            // a file that cannot be read gives nothing: the network
                            // brings every symbol, as without it
                            let taken = File::open(&path)
                                .and_then(|file| self.objects[index].take_known(&file, &ranges));
                            if let Ok((count, done)) = taken {
                                self.known_symbols += count;
                                if matches!(done, Taken::Completed(..) | Taken::WriteFailed) {
                                    return done;
                                }
                            }
                        }
                        index
                    }
                }
            }
        };
        let object = &mut self.objects[index];
        let id = match object.fec {
            Fec::NoCode | Fec::RaptorQ { .. } => {
                let Some(oti) = alc.oti.as_ref() else {
                    return Taken::Refused;
                };
                match flute::core::alc::parse_payload_id(alc, oti) {
                    Ok(id) => id,
                    Err(_) => return Taken::Refused,
                }
            }
        };
        object.push(&id, &data[alc.data_payload_offset..])
    }

    /// Decoding attempts that failed so far (all objects followed).
    pub fn failed_decodes(&self) -> u64 {
        self.objects.iter().map(|o| o.failed_decodes).sum()
    }

    /// RaptorQ block decodes attempted so far and the thread CPU seconds they took
    /// (all objects, evicted ones included).
    pub fn decode_cost(&self) -> (u64, f64) {
        self.objects.iter().fold(
            (self.retired_decodes, self.retired_decode_cpu_s),
            |(n, s), o| (n + o.decodes, s + o.decode_cpu_s),
        )
    }

    /// Of `decode_cost`'s seconds, the `raptorq` crate's `decode` calls alone.
    pub fn crate_decode_cpu_s(&self) -> f64 {
        self.objects
            .iter()
            .map(|o| o.crate_decode_cpu_s)
            .sum::<f64>()
            + self.retired_crate_decode_cpu_s
    }

    /// Thread CPU seconds spent writing completed blocks to their files so far (all
    /// objects, evicted ones included).
    pub fn write_cost(&self) -> f64 {
        self.objects.iter().map(|o| o.write_cpu_s).sum::<f64>() + self.retired_write_cpu_s
    }

    /// Thread CPU seconds spent bringing in the objects' buffers so far (fresh
    /// memory, `Mapping::touch`; all objects, evicted ones included).
    pub fn memory_cost(&self) -> f64 {
        self.objects
            .iter()
            .map(FastObject::memory_cost)
            .sum::<f64>()
            + self.retired_memory_cpu_s
    }
}

impl Drop for FastObjects {
    fn drop(&mut self) {
        // an object never completed leaves no file behind
        for object in &self.objects {
            if !object.complete {
                std::fs::remove_file(&object.path).ok();
            }
        }
    }
}
