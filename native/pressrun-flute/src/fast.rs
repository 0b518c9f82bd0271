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
/// Bytes of a memory page.
const PAGE: usize = 4096;
/// Bytes of a 2 MB transparent huge page: a completed block's pages of the object's
/// buffer are given back in whole pages of this size (a part of a huge page given
/// back would split it).
const HUGE_PAGE: usize = 2 << 20;
/// Bytes of the object's buffer brought in at once (`Mapping::touch`): 64 pages in one
/// system call.
const POPULATE_BYTES: usize = 256 << 10;
/// Thread CPU seconds past which bringing in one piece of the buffer in huge pages
/// (`Mapping::touch`; a piece that faults a fresh 2 MB page) means huge pages come
/// dear: the rest of the buffer is then taken in 4 kB pages. A huge page costs
/// 0.08 ms on this VM when the guest's memory behind it is backed and 2.5-5 ms when
/// the host must back it first; 2 MB in 4 kB pages costs 0.7-1 ms either way
/// (docs/results/2026-11-28-multicast-receive-cpu.md, session 22).
const HUGE_PAGE_DEAR_S: f64 = 1e-3;
/// Objects followed at once (a carousel's receiver sees one; strangers' TOIs evict
/// the oldest).
const MAX_OBJECTS: usize = 4;
/// Block decodes whose inputs (the ESIs given to the decoder) a receiver that records
/// them keeps (`FastObjects::redecode`; an 8 MiB issue is 7 blocks): an object that
/// comes gets what is left of this, so at most this many for objects that come one
/// after another, at most MAX_OBJECTS times it for objects received at once.
const MAX_DECODE_RECORDS: usize = 64;
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
    /// the POPULATE_BYTES pieces of the mapping brought in so far (`touch`)
    brought: Bits,
    /// whether the kernel takes MADV_POPULATE_WRITE (Linux 5.14 and later); without it
    /// the pages come by faults as the symbols are written, uncounted
    populate: bool,
    /// whether the mapping still asks for transparent huge pages (MADV_HUGEPAGE):
    /// until a piece brought in them costs more than HUGE_PAGE_DEAR_S
    huge: bool,
    /// thread CPU seconds spent bringing pages in (`touch`)
    cpu_s: f64,
}

impl Mapping {
    /// ``len`` bytes of anonymous memory, in transparent huge pages where the kernel
    /// has them (MADV_HUGEPAGE) until they come dear (`touch`): on this VM a huge
    /// page costs a tenth of 4 kB pages when the guest's memory behind it is backed,
    /// and 3-5 times as much when it is not, as for most first objects of a process
    /// (the host backs the guest's free 2 MB blocks lazily; docs/results/
    /// 2026-11-28-multicast-receive-cpu.md, session 22).
    fn new(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self {
                ptr: std::ptr::null_mut(),
                len: 0,
                brought: Bits::default(),
                populate: false,
                huge: false,
                cpu_s: 0.0,
            });
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
        let huge = unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) } == 0;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            brought: Bits::default(),
            populate: true,
            huge,
            cpu_s: 0.0,
        })
    }

    /// Bring in the pages of ``start..end`` before they are written: each
    /// POPULATE_BYTES piece of the mapping the range reaches that is not in yet is
    /// populated with one MADV_POPULATE_WRITE (a huge page, or 64 small ones in one
    /// system call instead of a fault each), its thread CPU counted in `cpu_s`:
    /// fresh memory, the receive path's largest cost beyond the bare loop and the
    /// decode for a receiver's first object on this VM (docs/multicast.md, "Receiver
    /// CPU"), told apart from the loop's own work. A piece that cost more than
    /// HUGE_PAGE_DEAR_S while huge pages were asked for turns them off for the rest
    /// (MADV_NOHUGEPAGE: the pages already in stay as they are).
    fn touch(&mut self, start: usize, end: usize) {
        let end = end.min(self.len);
        if !self.populate || end <= start {
            return;
        }
        for piece in start / POPULATE_BYTES..=(end - 1) / POPULATE_BYTES {
            if !self.brought.insert(piece) {
                continue;
            }
            let lo = piece * POPULATE_BYTES;
            // the mapping's last page is whole (mmap rounds its length up)
            let hi = ((piece + 1) * POPULATE_BYTES).min(self.len.next_multiple_of(PAGE));
            let cpu0 = thread_cpu_s();
            // SAFETY: whole pages of the mapping (it starts on a page); populating
            // only faults them in
            let done = unsafe {
                libc::madvise(self.ptr.add(lo).cast(), hi - lo, libc::MADV_POPULATE_WRITE)
            };
            let cpu = thread_cpu_s() - cpu0;
            self.cpu_s += cpu;
            if done != 0 {
                // an older kernel (EINVAL): the writes fault the pages in as before
                self.populate = false;
                return;
            }
            if self.huge && cpu > HUGE_PAGE_DEAR_S {
                self.huge = false;
                // SAFETY: the whole mapping; a refusal only costs speed
                unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE) };
            }
        }
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

    /// Give back the whole 2 MB pages inside ``start..end`` (MADV_DONTNEED: they
    /// read as zeros if touched again); a partial page at either end is kept.
    fn release(&mut self, start: usize, end: usize) {
        let base = self.ptr as usize;
        let from = (base + start).next_multiple_of(HUGE_PAGE);
        let to = (base + end.min(self.len)) / HUGE_PAGE * HUGE_PAGE;
        if to > from {
            // SAFETY: a range of whole pages inside the mapping, which nothing reads
            // again (its block is written and done)
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED) };
        }
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

/// Give the object's file its disk blocks at once (`fallocate` with
/// FALLOC_FL_KEEP_SIZE: the size still grows only as blocks are written), so each
/// block's write goes into blocks the file already has. With ext4's delayed
/// allocation each page written reserved its block and recorded a delayed extent
/// (`ext4_da_get_block_prep`, a third of the writes' CPU in the profile): file
/// writes 0.15-0.17 us a packet against 0.24-0.37 in the replay
/// (`examples/receive_cost.rs`, 29 Nov; docs/results/2026-11-29-receiver-cpu.md),
/// the fallocate's own CPU counted with the writes. Only speed: a file system that
/// cannot (EOPNOTSUPP) or a disk without the room writes as before, and a write
/// that then fails ends the object as before. Not on tmpfs, whose blocks are
/// memory: there it would hold the whole object beside the object's buffer from
/// the first packet.
fn preallocate(file: &File, length: u64) {
    use std::os::fd::AsRawFd;
    let Ok(length) = libc::off_t::try_from(length) else {
        return;
    };
    if length == 0 {
        return;
    }
    let fd = file.as_raw_fd();
    // SAFETY: a zeroed statfs for the call to fill
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs to fill
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 || fs.f_type == libc::TMPFS_MAGIC {
        return;
    }
    // SAFETY: a valid descriptor of a file this object owns; no memory is passed
    unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, length) };
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
    /// the repair ESI held in each source symbol's slot of the object's buffer (0:
    /// none; a repair ESI is at least K): a repair symbol goes to the slot of a
    /// source symbol that has not come, so a receiver that joined after the source
    /// symbols keeps its repair symbols in the buffer, brought in 256 kB at a time,
    /// instead of thousands of small allocations (fresh 4 kB pages faulted one by
    /// one from the allocator's arena: 0.6 us a packet on this VM)
    slot_repair: Vec<u32>,
    /// the next slot to look at for a free one
    free_slot: usize,
    /// repair symbols kept beyond the free slots, each in its own buffer; moved into
    /// the decoder when it runs
    repairs: Vec<raptorq::EncodingPacket>,
    /// repair symbols kept so far (those in `repairs` and those the decoder holds)
    repair_count: usize,
    repair_seen: Bits,
    /// distinct symbols when decoding last failed
    tried_at: usize,
    /// the decoder of an attempt that failed (rank-deficient): it keeps the symbols
    /// it was given, so the next attempt adds only the new ones
    decoder: Option<raptorq::SourceBlockDecoder>,
    /// the ESIs given to the decoder so far (kept only when decodes are recorded)
    given: Vec<u32>,
    done: bool,
}

/// What one block decode was given, kept so that the `raptorq` crate's decode alone
/// can be timed again on the same block and ESIs after the reception
/// (`FastObjects::redecode`, bench/multicast.py).
struct DecodeRecord {
    path: PathBuf,
    symbol: usize,
    alignment: u8,
    length: usize,
    sbn: u8,
    first: usize,
    k: usize,
    esis: Vec<u32>,
}

/// The `raptorq` crate's own decode, timed again on recorded blocks
/// (`FastObjects::redecode`).
pub struct Redecode {
    /// blocks decoded
    pub blocks: u64,
    /// thread CPU seconds of `SourceBlockDecoder::new` and `decode` alone, the
    /// symbols made beforehand
    pub cpu_s: f64,
    /// every block decoded to the bytes in the object's file
    pub bit_exact: bool,
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
    blocks: Vec<Block>,
    left: usize,
    /// completed (then the mappings are gone and packets of it are ignored)
    complete: bool,
    /// decoding attempts that failed (rank-deficient: more symbols needed)
    pub failed_decodes: u64,
    /// RaptorQ decodes attempted (blocks that lacked source symbols), failed or not
    decodes: u64,
    /// thread CPU seconds those decodes took (building the decoder, copying the
    /// symbols out of the buffer's slots, the crate's decode)
    decode_cpu_s: f64,
    /// of it, the `raptorq` crate's `decode` call alone (the symbols already made)
    crate_decode_cpu_s: f64,
    /// block decodes whose inputs are kept (`DecodeRecord`): 0 when not recording,
    /// else what is left of MAX_DECODE_RECORDS when the object came
    record_room: usize,
    records: Vec<DecodeRecord>,
    /// thread CPU seconds of writing completed blocks to the file
    write_cpu_s: f64,
    /// thread CPU seconds of bringing in the object's buffer (`Mapping::touch`), of
    /// its buffer once gone
    memory_cpu_s: f64,
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

/// A slot of ``block`` in the object's buffer that can take a repair symbol: one
/// whose source symbol has not come and that holds no repair symbol, a whole symbol
/// long (the object's last symbol may be short); None when there is none left.
fn free_slot(block: &mut Block, symbol: usize, length: usize) -> Option<usize> {
    while block.free_slot < block.k {
        let slot = block.free_slot;
        block.free_slot += 1;
        let whole = (block.first + slot + 1) * symbol <= length;
        let taken = block.slot_repair.get(slot).is_some_and(|&r| r != 0);
        if whole && !taken && !block.have.contains(slot) {
            return Some(slot);
        }
    }
    None
}

impl FastObject {
    /// An object of ``length`` bytes with ``oti`` (and, for RaptorQ, its scheme-
    /// specific Z, N, Al), received into ``dir/<toi>.object``;
    /// None when this decoder does not take it (the crate's session then does).
    #[allow(clippy::too_many_arguments)]
    fn new(
        dir: &Path,
        tsi: u64,
        toi: u128,
        oti: &Oti,
        length: u64,
        raptorq: Option<(u8, u16, u8)>,
        max_bytes: usize,
        record_room: usize,
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
        let (mut first, mut repair_slots) = (0usize, 0usize);
        for sbn in 0..n_blocks {
            let k = if sbn < n_large { large } else { small } as usize;
            blocks.push(Block {
                first,
                k,
                have: Bits::default(),
                sources: 0,
                slot_repair: Vec::new(),
                free_slot: 0,
                repairs: Vec::new(),
                repair_count: 0,
                repair_seen: Bits::default(),
                tried_at: 0,
                decoder: None,
                given: Vec::new(),
                done: false,
            });
            first += k;
            if fec != Fec::NoCode {
                repair_slots += k + REPAIR_MARGIN;
            }
        }
        // the most repair symbols this object keeps at once (every block in progress)
        if repair_slots * symbol > max_bytes {
            return None;
        }
        let path = dir.join(format!("{toi}.object"));
        let made = (|| {
            // the file is made now, so a folder that cannot take it fails early
            let file = File::create(&path)?;
            let cpu0 = thread_cpu_s();
            preallocate(&file, length);
            let write_cpu_s = thread_cpu_s() - cpu0;
            Ok((file, Mapping::new(length as usize)?, write_cpu_s))
        })();
        Some(match made {
            Ok((file, image, write_cpu_s)) => Ok(Self {
                tsi,
                toi,
                fec,
                symbol,
                length: length as usize,
                path,
                file: Some(file),
                image: Some(image),
                left: blocks.len(),
                blocks,
                complete: false,
                failed_decodes: 0,
                decodes: 0,
                decode_cpu_s: 0.0,
                crate_decode_cpu_s: 0.0,
                record_room,
                records: Vec::new(),
                write_cpu_s,
                memory_cpu_s: 0.0,
            }),
            Err(err) => {
                std::fs::remove_file(&path).ok();
                Err(err)
            }
        })
    }

    /// The object's buffer goes (the object is over); its page CPU is kept.
    fn drop_image(&mut self) {
        if let Some(image) = self.image.take() {
            self.memory_cpu_s += image.cpu_s;
        }
    }

    /// Thread CPU seconds spent bringing in the object's buffer so far.
    fn memory_cost(&self) -> f64 {
        self.memory_cpu_s + self.image.as_ref().map_or(0.0, |image| image.cpu_s)
    }

    /// Take the source symbols that lie whole inside ``ranges`` (byte ranges of the
    /// object, start and length; sorted or not, they may overlap) from ``file``, as if
    /// they had arrived: the bytes a receiver already holds and checked (pieces from
    /// the swarm, before it left it for the carousel). A block of K source symbols
    /// then needs only the K less those from the network. The number taken, and
    /// `Taken::Completed` when they completed the object.
    fn take_known(&mut self, file: &File, ranges: &[(u64, u64)]) -> std::io::Result<(u64, Taken)> {
        use std::os::unix::fs::FileExt;
        let (symbol, length) = (self.symbol as u64, self.length as u64);
        let mut merged: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|&&(_, n)| n > 0)
            .map(|&(start, n)| (start.min(length), start.saturating_add(n).min(length)))
            .collect();
        merged.sort_unstable();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (start, end) in merged {
            match spans.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => spans.push((start, end)),
            }
        }
        let mut taken = 0u64;
        let mut outcome = Taken::Kept;
        let mut buffer = Vec::new();
        for (start, end) in spans {
            // the symbols wholly inside [start, end); the object's last may be short
            let mut g = start.div_ceil(symbol);
            while g * symbol < end {
                let at = g * symbol;
                let stop = (at + symbol).min(length);
                if stop > end {
                    break;
                }
                let Some(sbn) = self.blocks.iter().rposition(|b| (b.first as u64) <= g) else {
                    break;
                };
                let esi = g - self.blocks[sbn].first as u64;
                buffer.resize((stop - at) as usize, 0);
                file.read_exact_at(&mut buffer, at)?;
                let id = PayloadID { sbn: sbn as u32, esi: esi as u32, source_block_length: None };
                match self.push(&id, &buffer) {
                    Taken::Kept => taken += 1,
                    done @ (Taken::Completed(..) | Taken::WriteFailed) => {
                        return Ok((taken + 1, done));
                    }
                    other => outcome = other,
                }
                g += 1;
            }
        }
        Ok((taken, outcome))
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
                    image.touch(at, at + n);
                    let bytes = image.bytes_mut();
                    // a repair symbol in this slot moves out first (a cycle came round)
                    if let Some(held) = block.slot_repair.get_mut(esi).filter(|r| **r != 0) {
                        let data = bytes[at..at + symbol].to_vec();
                        block.repairs.push(raptorq::EncodingPacket::new(
                            raptorq::PayloadId::new(id.sbn as u8, *held),
                            data,
                        ));
                        *held = 0;
                    }
                    bytes[at..at + n].copy_from_slice(&payload[..n]);
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
            if fresh && block.repair_count < block.k + REPAIR_MARGIN {
                match (free_slot(block, symbol, length), self.image.as_mut()) {
                    (Some(slot), Some(image)) => {
                        let at = (block.first + slot) * symbol;
                        image.touch(at, at + symbol);
                        let place = &mut image.bytes_mut()[at..at + symbol];
                        place[..payload.len()].copy_from_slice(payload);
                        place[payload.len()..].fill(0);
                        if block.slot_repair.is_empty() {
                            block.slot_repair = vec![0; block.k];
                        }
                        block.slot_repair[slot] = id.esi;
                    }
                    _ => {
                        let mut data = Vec::with_capacity(symbol);
                        data.extend_from_slice(payload);
                        data.resize(symbol, 0);
                        block.repairs.push(raptorq::EncodingPacket::new(
                            raptorq::PayloadId::new(id.sbn as u8, id.esi),
                            data,
                        ));
                    }
                }
                block.repair_count += 1;
            }
        }
        let distinct = block.sources + block.repair_count;
        // decode once enough symbols for the cheap solve came, every source symbol
        // came, or the symbols began to repeat with at least K of them
        let ready = distinct >= block.k + decode_extra(block.k)
            || block.sources == block.k
            || (repeated && distinct >= block.k);
        if ready && distinct > block.tried_at {
            let sbn = id.sbn as usize;
            match self.complete_block(sbn) {
                Ok(true) => {}
                Ok(false) => {
                    self.failed_decodes += 1;
                    self.blocks[sbn].tried_at = distinct;
                    return Taken::Kept;
                }
                Err(_) => {
                    // the file cannot take it: the object is over, its file goes
                    self.complete = true;
                    self.drop_image();
                    self.file = None;
                    self.blocks.clear();
                    std::fs::remove_file(&self.path).ok();
                    return Taken::WriteFailed;
                }
            }
            self.left -= 1;
            if self.left == 0 {
                self.complete = true;
                self.drop_image();
                self.file = None;
                self.blocks.clear();
                return Taken::Completed(self.path.clone(), self.length);
            }
        }
        Taken::Kept
    }

    /// Complete block ``sbn`` from what it holds and write it to the file at its
    /// offset: from the object's buffer when every source symbol came, else decoded
    /// (RaptorQ) and written from the decoder's output. Ok(false) when the decode
    /// needs more symbols; Err when the file could not be written.
    fn complete_block(&mut self, sbn: usize) -> std::io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let (symbol, length) = (self.symbol, self.length);
        let (Some(image), Some(file)) = (self.image.as_mut(), self.file.as_ref()) else {
            return Err(std::io::Error::other("the object is over"));
        };
        let block = &mut self.blocks[sbn];
        let start = block.first * symbol;
        let end = ((block.first + block.k) * symbol).min(length);
        if block.sources == block.k {
            let cpu0 = thread_cpu_s();
            file.write_all_at(&image.bytes()[start..end], start as u64)?;
            self.write_cpu_s += thread_cpu_s() - cpu0;
        } else {
            let Fec::RaptorQ { alignment } = self.fec else {
                return Ok(false);
            };
            let cpu0 = thread_cpu_s();
            let decoder = block.decoder.get_or_insert_with(|| {
                let block_bytes = (block.k * symbol) as u64;
                let config = raptorq::ObjectTransmissionInformation::new(
                    block_bytes,
                    symbol as u16,
                    1,
                    1,
                    alignment,
                );
                raptorq::SourceBlockDecoder::new(sbn as u8, &config, block_bytes)
            });
            // the symbols in the buffer's slots are copied out of it (it keeps the
            // source symbols for a block that gets them all); on a retry the decoder
            // drops those it has
            let bytes = image.bytes();
            let (have, slot_repair) = (&block.have, &block.slot_repair);
            let held = (0..block.k).filter_map(|slot| {
                let esi = match slot_repair.get(slot) {
                    Some(&r) if r != 0 => r,
                    _ if have.contains(slot) => slot as u32,
                    _ => return None,
                };
                let at = (block.first + slot) * symbol;
                let stop = (at + symbol).min(length);
                let mut data = Vec::with_capacity(symbol);
                data.extend_from_slice(&bytes[at..stop]);
                data.resize(symbol, 0);
                Some(raptorq::EncodingPacket::new(raptorq::PayloadId::new(sbn as u8, esi), data))
            });
            let packets: Vec<raptorq::EncodingPacket> =
                held.chain(std::mem::take(&mut block.repairs)).collect();
            if self.records.len() < self.record_room {
                block.given.extend(packets.iter().map(|p| p.payload_id().encoding_symbol_id()));
            }
            // the crate's decode call timed alone: the share of the decode that is
            // the crate's, the rest (building the decoder, the copies above) ours
            let crate0 = thread_cpu_s();
            let decoded = decoder.decode(packets);
            let crate1 = thread_cpu_s();
            self.crate_decode_cpu_s += crate1 - crate0;
            self.decodes += 1;
            let Some(decoded) = decoded else {
                self.decode_cpu_s += crate1 - cpu0;
                return Ok(false);
            };
            block.decoder = None;
            if self.records.len() < self.record_room {
                self.records.push(DecodeRecord {
                    path: self.path.clone(),
                    symbol,
                    alignment,
                    length,
                    sbn: sbn as u8,
                    first: block.first,
                    k: block.k,
                    esis: std::mem::take(&mut block.given),
                });
            }
            let cpu1 = thread_cpu_s();
            self.decode_cpu_s += cpu1 - cpu0;
            file.write_all_at(&decoded[..end - start], start as u64)?;
            self.write_cpu_s += thread_cpu_s() - cpu1;
        }
        block.done = true;
        block.repairs = Vec::new();
        block.slot_repair = Vec::new();
        image.release(start, end);
        Ok(true)
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
    retired_crate_decode_cpu_s: f64,
    retired_write_cpu_s: f64,
    retired_memory_cpu_s: f64,
    /// keep what each block decode was given (`redecode`), at most
    /// MAX_DECODE_RECORDS over all objects
    record: bool,
    retired_records: Vec<DecodeRecord>,
    /// bytes this receiver holds already of one object (`set_known`): its TOI, the
    /// file they are in and their (start, length) ranges; taken when it comes
    known: Option<(u128, PathBuf, Vec<(u64, u64)>)>,
    /// source symbols taken from `known` instead of the network
    pub known_symbols: u64,
}

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
                    let kept = self.retired_records.len()
                        + self.objects.iter().map(|o| o.records.len()).sum::<usize>();
                    let room = if self.record { MAX_DECODE_RECORDS.saturating_sub(kept) } else { 0 };
                    FastObject::new(&self.dir, tsi, toi, oti, length, scheme, self.max_bytes, room)
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
        self.objects.iter().map(|o| o.crate_decode_cpu_s).sum::<f64>()
            + self.retired_crate_decode_cpu_s
    }

    /// The `raptorq` crate's decode timed again on every recorded block decode of a
    /// completed object (with ``record``): the block read back from the object's
    /// file, the symbols it was given (the same ESIs) made by the crate's encoder
    /// beforehand, then `SourceBlockDecoder::new` and `decode` timed (thread CPU),
    /// the symbols warm in cache as the crate's own benchmarks have them. The
    /// crate's cost on the same data without the receive loop around it
    /// (bench/multicast.py). Blocks of objects not completed are skipped.
    pub fn redecode(&self) -> std::io::Result<Redecode> {
        use std::os::unix::fs::FileExt;
        let mut out = Redecode { blocks: 0, cpu_s: 0.0, bit_exact: true };
        let done = self.objects.iter().filter(|o| o.complete).flat_map(|o| &o.records);
        for r in self.retired_records.iter().chain(done) {
            let start = r.first * r.symbol;
            let end = ((r.first + r.k) * r.symbol).min(r.length);
            let mut block = vec![0u8; r.k * r.symbol];
            File::open(&r.path)?.read_exact_at(&mut block[..end - start], start as u64)?;
            let block_bytes = (r.k * r.symbol) as u64;
            let config = raptorq::ObjectTransmissionInformation::new(
                block_bytes,
                r.symbol as u16,
                1,
                1,
                r.alignment,
            );
            let encoder = raptorq::SourceBlockEncoder::new(r.sbn, &config, &block);
            let packets: Vec<raptorq::EncodingPacket> = r
                .esis
                .iter()
                .map(|&esi| {
                    let at = esi as usize * r.symbol;
                    if (esi as usize) < r.k {
                        raptorq::EncodingPacket::new(
                            raptorq::PayloadId::new(r.sbn, esi),
                            block[at..at + r.symbol].to_vec(),
                        )
                    } else {
                        let made = encoder.repair_packets(esi - r.k as u32, 1);
                        made.into_iter().next().expect("one repair packet asked for")
                    }
                })
                .collect();
            let cpu0 = thread_cpu_s();
            let mut decoder = raptorq::SourceBlockDecoder::new(r.sbn, &config, block_bytes);
            let decoded = decoder.decode(packets);
            out.cpu_s += thread_cpu_s() - cpu0;
            out.blocks += 1;
            out.bit_exact &= decoded.is_some_and(|d| d[..end - start] == block[..end - start]);
        }
        Ok(out)
    }

    /// Thread CPU seconds spent writing completed blocks to their files so far (all
    /// objects, evicted ones included).
    pub fn write_cost(&self) -> f64 {
        self.objects.iter().map(|o| o.write_cpu_s).sum::<f64>() + self.retired_write_cpu_s
    }

    /// Thread CPU seconds spent bringing in the objects' buffers so far (fresh
    /// memory, `Mapping::touch`; all objects, evicted ones included).
    pub fn memory_cost(&self) -> f64 {
        self.objects.iter().map(FastObject::memory_cost).sum::<f64>() + self.retired_memory_cpu_s
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
