//! The receive loop's own object decoder: each symbol copied once, into place.
//!
//! The crate's receiver session costs 3.5-5.5 us a packet when packets arrive as they
//! do on a carousel (a few dozen every 20 ms, the caches cold between rounds): per
//! packet it parses the ALC header again, copies the symbol into a new `Vec`, hashes
//! its ESI into the RaptorQ decoder, and the first blocks of a fresh thread fault in
//! their pages one by one (glibc's per-thread arena grows and shrinks its heap). Here
//! (docs/multicast.md, "Receiver CPU"):
//!
//! - the object is one buffer of its transfer length in transparent huge pages (one
//!   page fault per 2 MB); a source symbol is copied straight to its place in it, so
//!   a block whose source symbols all arrived needs no decoding and no further copy;
//!   the buffer is written to the file in one call when the object completes;
//! - repair symbols go to one slab of the same kind, in the slots of their block;
//! - a block is decoded (RaptorQ, RFC 6330, the `raptorq` crate the `flute` crate
//!   uses) once it holds as many distinct symbols as it has source symbols, and only
//!   then; what it rebuilds is copied into the file where source symbols are missing.
//!
//! It takes objects whose packets carry their FEC Object Transmission Information
//! (EXT_FTI, which the crate's sender adds to every packet), uncompressed, with
//! Compact No-Code FEC or RaptorQ without sub-blocking (N = 1), the FEC schemes
//! pressrun's carousel sends; any other object goes to the crate's session as before.

use std::fs::File;
use std::path::{Path, PathBuf};

use flute::core::alc::{AlcPkt, PayloadID};
use flute::core::{FECEncodingID, Oti};

/// Symbols beyond K a RaptorQ block of K >= 1000 waits for before it is decoded:
/// with K + H (H, the HDPC symbols of RFC 6330 section 5.3.3.3, at most 16 for K up
/// to 56403) the `raptorq` crate solves without the HDPC rows, in GF(2) alone, and
/// skips its GF(256) row operations. Smaller blocks wait for K / 50 more (2% of the
/// reception at most; their decode is cheap anyway). A block whose symbols repeat
/// (the cycle came round) is decoded from what it has.
const DECODE_EXTRA: usize = 20;

fn decode_extra(k: usize) -> usize {
    DECODE_EXTRA.min(k / 50)
}

/// Repair symbols kept per block beyond its source symbols (the decode from K
/// fails with probability about 0.01, from K + 2 about 1e-6).
const REPAIR_MARGIN: usize = DECODE_EXTRA + 16;
/// Objects followed at once (a carousel's receiver sees one; strangers' TOIs evict
/// the oldest).
const MAX_OBJECTS: usize = 4;
/// Repair ESIs above K + this are not told apart (their duplicates count twice
/// toward a decode attempt, which then waits for more).
const REPAIR_ESI_SPAN: u32 = 1 << 20;

/// CPU time of the calling thread, in seconds (CLOCK_THREAD_CPUTIME_ID): the
/// decode's share of the receive thread's CPU, which the bench prints beside the
/// whole (docs/multicast.md, "Receiver CPU").
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec for the call to fill
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A memory mapping that is unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// ``len`` bytes of anonymous memory in transparent huge pages where the
    /// kernel has them (MADV_HUGEPAGE): one fault per 2 MB instead of one per 4 kB,
    /// which in this VM costs 5-10 us a page under load, more than the rest of a
    /// packet's work.
    fn new(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self { ptr: std::ptr::null_mut(), len: 0 });
        }
        // SAFETY: a fresh private anonymous mapping of len bytes
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the range is the mapping just made; a refusal only costs speed
        unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        Ok(Self { ptr: ptr.cast(), len })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping is len bytes, readable, and lives as long as self
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above, and &mut self makes the borrow unique
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr/len are the mapping made in `new`
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
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
        self.0.get(i / 64).is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }
}

struct Block {
    /// index of its first source symbol in the object
    first: usize,
    /// source symbols (K)
    k: usize,
    have: Bits,
    sources: usize,
    /// ESIs of the repair symbols in its slab slots, in slot order
    repair_esis: Vec<u32>,
    repair_seen: Bits,
    /// its first slot in the repair slab
    slot0: usize,
    /// distinct symbols when decoding last failed
    tried_at: usize,
    done: bool,
}

/// The FEC schemes taken.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fec {
    NoCode,
    RaptorQ { alignment: u8 },
}

/// The RaptorQ scheme-specific FTI (RFC 6330 section 3.3.3: Z, N, Al) of a packet's
/// EXT_FTI (HET 64, 16 bytes: HET, HEL, F 40 bits, reserved, T 16 bits, Z, N 16
/// bits, Al, padding), as the crate's ALC codec reads it.
fn raptorq_scheme(data: &[u8], alc: &AlcPkt) -> Option<(u8, u16, u8)> {
    match flute::core::lct::get_ext(data, &alc.lct, 64) {
        Ok(Some(fti)) if fti.len() == 16 => {
            Some((fti[10], u16::from_be_bytes([fti[11], fti[12]]), fti[13]))
        }
        _ => None,
    }
}

/// One object being received.
pub struct FastObject {
    tsi: u64,
    toi: u128,
    fec: Fec,
    symbol: usize,
    length: usize,
    path: PathBuf,
    file: Option<File>,
    image: Option<Mapping>,
    slab: Option<Mapping>,
    blocks: Vec<Block>,
    left: usize,
    /// completed (then the mappings are gone and packets of it are ignored)
    complete: bool,
    /// decoding attempts that failed (rank-deficient: more symbols needed)
    pub failed_decodes: u64,
    /// RaptorQ decodes attempted (blocks that lacked source symbols), failed or not
    decodes: u64,
    /// thread CPU seconds those decodes took (building the decoder, solving,
    /// copying the rebuilt symbols into place)
    decode_cpu_s: f64,
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
    /// this packet completed the object, but its file could not be written
    WriteFailed,
    /// the object cannot be received here (file or memory failed): the crate's
    /// session takes it from this packet on
    Failed,
}

/// The block partitioning of RFC 5052 section 9.1 (no-code: by the maximum source
/// block length) or RFC 6330 section 4.4.1.2 (RaptorQ: Partition[Kt, Z]), as the
/// crate's sender and receiver compute it: (large, small, number of large, blocks).
fn partition(t: u64, n: u64) -> (u64, u64, u64, u64) {
    let n = n.min(t);
    if n == 0 {
        return (0, 0, 0, 0);
    }
    let large = t.div_ceil(n);
    let small = t / n;
    (large, small, t - small * n, n)
}

impl FastObject {
    /// An object of ``length`` bytes with ``oti`` (and, for RaptorQ, its scheme-
    /// specific Z, N, Al), received into ``dir/<toi>.object``;
    /// None when this decoder does not take it (the crate's session then does).
    fn new(
        dir: &Path,
        tsi: u64,
        toi: u128,
        oti: &Oti,
        length: u64,
        raptorq: Option<(u8, u16, u8)>,
        max_bytes: usize,
    ) -> Option<std::io::Result<Self>> {
        let symbol = oti.encoding_symbol_length as usize;
        if symbol == 0 || length == 0 || length as usize > max_bytes {
            return None;
        }
        let t = length.div_ceil(symbol as u64);
        let (fec, (large, small, n_large, n_blocks)) = match oti.fec_encoding_id {
            FECEncodingID::NoCode => {
                let b = oti.maximum_source_block_length as u64;
                if b == 0 {
                    return None;
                }
                (Fec::NoCode, partition(t, t.div_ceil(b)))
            }
            FECEncodingID::RaptorQ => match raptorq {
                Some((z, 1, al)) if al > 0 && symbol % al as usize == 0 => {
                    (Fec::RaptorQ { alignment: al }, partition(t, z as u64))
                }
                _ => return None,
            },
            _ => return None,
        };
        if n_blocks == 0 || large > 56403 {
            return None;
        }
        let mut blocks = Vec::with_capacity(n_blocks as usize);
        let (mut first, mut slot0) = (0usize, 0usize);
        for sbn in 0..n_blocks {
            let k = if sbn < n_large { large } else { small } as usize;
            blocks.push(Block {
                first,
                k,
                have: Bits::default(),
                sources: 0,
                repair_esis: Vec::new(),
                repair_seen: Bits::default(),
                slot0,
                tried_at: 0,
                done: false,
            });
            first += k;
            if fec != Fec::NoCode {
                slot0 += k + REPAIR_MARGIN;
            }
        }
        let slab_bytes = slot0 * symbol;
        if slab_bytes > max_bytes {
            return None;
        }
        let path = dir.join(format!("{toi}.object"));
        let made = (|| {
            // the file is made now, so a folder that cannot take it fails early
            let file = File::create(&path)?;
            Ok((file, Mapping::new(length as usize)?, Mapping::new(slab_bytes)?))
        })();
        Some(match made {
            Ok((file, image, slab)) => Ok(Self {
                tsi,
                toi,
                fec,
                symbol,
                length: length as usize,
                path,
                file: Some(file),
                image: Some(image),
                slab: Some(slab),
                left: blocks.len(),
                blocks,
                complete: false,
                failed_decodes: 0,
                decodes: 0,
                decode_cpu_s: 0.0,
            }),
            Err(err) => {
                std::fs::remove_file(&path).ok();
                Err(err)
            }
        })
    }

    /// Take one symbol of this object.
    fn push(&mut self, id: &PayloadID, payload: &[u8]) -> Taken {
        if self.complete {
            return Taken::Kept;
        }
        let (symbol, length) = (self.symbol, self.length);
        let Some(block) = self.blocks.get_mut(id.sbn as usize) else {
            return Taken::Refused;
        };
        if payload.len() > symbol {
            return Taken::Refused;
        }
        if block.done {
            return Taken::Kept;
        }
        let esi = id.esi as usize;
        let repeated;
        if esi < block.k {
            repeated = !block.have.insert(esi);
            if !repeated {
                let at = (block.first + esi) * symbol;
                let n = payload.len().min(length.saturating_sub(at));
                if let Some(image) = self.image.as_mut() {
                    image.bytes_mut()[at..at + n].copy_from_slice(&payload[..n]);
                }
                block.sources += 1;
            }
        } else {
            if self.fec == Fec::NoCode {
                return Taken::Refused;
            }
            let offset = (id.esi - block.k as u32) as usize;
            let fresh = offset >= REPAIR_ESI_SPAN as usize || block.repair_seen.insert(offset);
            repeated = !fresh;
            if fresh && block.repair_esis.len() < block.k + REPAIR_MARGIN {
                let at = (block.slot0 + block.repair_esis.len()) * symbol;
                if let Some(slab) = self.slab.as_mut() {
                    let slot = &mut slab.bytes_mut()[at..at + symbol];
                    slot[..payload.len()].copy_from_slice(payload);
                    slot[payload.len()..].fill(0);
                }
                block.repair_esis.push(id.esi);
            }
        }
        let distinct = block.sources + block.repair_esis.len();
        // decode once enough symbols for the cheap solve came, every source symbol
        // came, or the symbols began to repeat with at least K of them
        let ready = distinct >= block.k + decode_extra(block.k)
            || block.sources == block.k
            || (repeated && distinct >= block.k);
        if ready && distinct > block.tried_at {
            let sbn = id.sbn as usize;
            if !self.complete_block(sbn) {
                self.failed_decodes += 1;
                self.blocks[sbn].tried_at = distinct;
                return Taken::Kept;
            }
            self.left -= 1;
            if self.left == 0 {
                self.complete = true;
                self.slab = None;
                let written = match (self.file.take(), self.image.take()) {
                    (Some(mut file), Some(image)) => {
                        use std::io::Write;
                        file.write_all(image.bytes())
                    }
                    _ => Err(std::io::Error::other("no image")),
                };
                if written.is_err() {
                    std::fs::remove_file(&self.path).ok();
                    return Taken::WriteFailed;
                }
                return Taken::Completed(self.path.clone(), self.length);
            }
        }
        Taken::Kept
    }

    /// Complete block ``sbn`` from what it holds: nothing to do when every source
    /// symbol came, else decode (RaptorQ) and write the missing source symbols.
    fn complete_block(&mut self, sbn: usize) -> bool {
        let (symbol, length) = (self.symbol, self.length);
        let block = &self.blocks[sbn];
        if block.sources == block.k {
            self.blocks[sbn].done = true;
            return true;
        }
        let Fec::RaptorQ { alignment } = self.fec else {
            return false;
        };
        let (Some(image), Some(slab)) = (self.image.as_ref(), self.slab.as_ref()) else {
            return false;
        };
        let (image, slab) = (image.bytes(), slab.bytes());
        let cpu0 = thread_cpu_s();
        let block_bytes = (block.k * symbol) as u64;
        let config =
            raptorq::ObjectTransmissionInformation::new(block_bytes, symbol as u16, 1, 1, alignment);
        let mut decoder = raptorq::SourceBlockDecoder::new(sbn as u8, &config, block_bytes);
        let source = (0..block.k).filter(|&esi| block.have.contains(esi)).map(|esi| {
            let at = (block.first + esi) * symbol;
            let end = (at + symbol).min(length);
            let mut data = Vec::with_capacity(symbol);
            data.extend_from_slice(&image[at..end]);
            data.resize(symbol, 0);
            raptorq::EncodingPacket::new(raptorq::PayloadId::new(sbn as u8, esi as u32), data)
        });
        let repair = block.repair_esis.iter().enumerate().map(|(slot, &esi)| {
            let at = (block.slot0 + slot) * symbol;
            raptorq::EncodingPacket::new(
                raptorq::PayloadId::new(sbn as u8, esi),
                slab[at..at + symbol].to_vec(),
            )
        });
        let decoded = decoder.decode(source.chain(repair));
        self.decodes += 1;
        let Some(decoded) = decoded else {
            self.decode_cpu_s += thread_cpu_s() - cpu0;
            return false;
        };
        let (first, k) = (block.first, block.k);
        let missing: Vec<usize> = (0..k).filter(|&esi| !block.have.contains(esi)).collect();
        if let Some(image) = self.image.as_mut() {
            let image = image.bytes_mut();
            for esi in missing {
                let at = (first + esi) * symbol;
                let n = symbol.min(length.saturating_sub(at));
                image[at..at + n].copy_from_slice(&decoded[esi * symbol..esi * symbol + n]);
            }
        }
        self.decode_cpu_s += thread_cpu_s() - cpu0;
        self.blocks[sbn].done = true;
        true
    }
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
}

impl FastObjects {
    pub fn new(dir: PathBuf, max_bytes: usize) -> Self {
        Self {
            dir,
            max_bytes,
            objects: Vec::new(),
            declined: Vec::new(),
            retired_decodes: 0,
            retired_decode_cpu_s: 0.0,
        }
    }

    /// Offer an object packet (TOI above 0) parsed as ``alc``.
    pub fn push(&mut self, alc: &AlcPkt, data: &[u8]) -> Taken {
        let (tsi, toi) = (alc.lct.tsi, alc.lct.toi);
        let index = match self.objects.iter().position(|o| o.tsi == tsi && o.toi == toi) {
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
                    FastObject::new(&self.dir, tsi, toi, oti, length, scheme, self.max_bytes)
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
                            let gone = self.objects.remove(0);
                            self.retired_decodes += gone.decodes;
                            self.retired_decode_cpu_s += gone.decode_cpu_s;
                            if !gone.complete {
                                std::fs::remove_file(&gone.path).ok();
                            }
                        }
                        self.objects.push(object);
                        self.objects.len() - 1
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
