//! One object being received: its blocks, each symbol copied once into its place in
//! the object's buffer, a block decoded (RaptorQ) once it holds enough symbols and
//! written to the file at its offset as soon as it is complete (the module `fast`
//! says how and why).

use std::fs::File;
use std::path::{Path, PathBuf};

use flute::core::alc::{AlcPkt, PayloadID};
use flute::core::{FECEncodingID, Oti};

use super::placement::{preallocate, Mapping};
use super::record::DecodeRecord;
use super::{thread_cpu_s, Bits, Taken};

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

/// Repair ESIs above K + this are not told apart (their duplicates count twice
/// toward a decode attempt, which then waits for more).
const REPAIR_ESI_SPAN: u32 = 1 << 20;

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

/// The FEC schemes taken.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fec {
    NoCode,
    RaptorQ { alignment: u8 },
}

/// The RaptorQ scheme-specific FTI (RFC 6330 section 3.3.3: Z, N, Al) of a packet's
/// EXT_FTI (HET 64, 16 bytes: HET, HEL, F 40 bits, reserved, T 16 bits, Z, N 16
/// bits, Al, padding), as the crate's ALC codec reads it.
pub(super) fn raptorq_scheme(data: &[u8], alc: &AlcPkt) -> Option<(u8, u16, u8)> {
    match flute::core::lct::get_ext(data, &alc.lct, 64) {
        Ok(Some(fti)) if fti.len() == 16 => {
            Some((fti[10], u16::from_be_bytes([fti[11], fti[12]]), fti[13]))
        }
        _ => None,
    }
}

/// One object being received.
pub struct FastObject {
    pub(super) tsi: u64,
    pub(super) toi: u128,
    pub(super) fec: Fec,
    symbol: usize,
    length: usize,
    pub(super) path: PathBuf,
    file: Option<File>,
    image: Option<Mapping>,
    blocks: Vec<Block>,
    left: usize,
    /// completed (then the mappings are gone and packets of it are ignored)
    pub(super) complete: bool,
    /// decoding attempts that failed (rank-deficient: more symbols needed)
    pub failed_decodes: u64,
    /// RaptorQ decodes attempted (blocks that lacked source symbols), failed or not
    pub(super) decodes: u64,
    /// thread CPU seconds those decodes took (building the decoder, copying the
    /// symbols out of the buffer's slots, the crate's decode)
    pub(super) decode_cpu_s: f64,
    /// of it, the `raptorq` crate's `decode` call alone (the symbols already made)
    pub(super) crate_decode_cpu_s: f64,
    /// block decodes whose inputs are kept (`DecodeRecord`): 0 when not recording,
    /// else what is left of MAX_DECODE_RECORDS when the object came
    record_room: usize,
    pub(super) records: Vec<DecodeRecord>,
    /// thread CPU seconds of writing completed blocks to the file
    pub(super) write_cpu_s: f64,
    /// thread CPU seconds of bringing in the object's buffer (`Mapping::touch`), of
    /// its buffer once gone
    memory_cpu_s: f64,
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
    pub(super) fn new(
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
                Some((z, 1, al)) if al > 0 && symbol.is_multiple_of(al as usize) => {
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
    pub(super) fn memory_cost(&self) -> f64 {
        self.memory_cpu_s + self.image.as_ref().map_or(0.0, |image| image.cpu_s)
    }

    /// Take the source symbols that lie whole inside ``ranges`` (byte ranges of the
    /// object, start and length; sorted or not, they may overlap) from ``file``, as if
    /// they had arrived: the bytes a receiver already holds and checked (pieces from
    /// the swarm, before it left it for the carousel). A block of K source symbols
    /// then needs only the K less those from the network. The number taken, and
    /// `Taken::Completed` when they completed the object.
    pub(super) fn take_known(
        &mut self,
        file: &File,
        ranges: &[(u64, u64)],
    ) -> std::io::Result<(u64, Taken)> {
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
                let id = PayloadID {
                    sbn: sbn as u32,
                    esi: esi as u32,
                    source_block_length: None,
                };
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
    pub(super) fn push(&mut self, id: &PayloadID, payload: &[u8]) -> Taken {
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
                Some(raptorq::EncodingPacket::new(
                    raptorq::PayloadId::new(sbn as u8, esi),
                    data,
                ))
            });
            let packets: Vec<raptorq::EncodingPacket> =
                held.chain(std::mem::take(&mut block.repairs)).collect();
            if self.records.len() < self.record_room {
                block
                    .given
                    .extend(packets.iter().map(|p| p.payload_id().encoding_symbol_id()));
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
