//! The block decodes' inputs, kept with ``record``, and the `raptorq` crate's decode
//! timed again on them after the reception (`FastObjects::redecode`,
//! bench/multicast.py).

use std::fs::File;
use std::path::PathBuf;

use super::{thread_cpu_s, FastObjects};

/// What one block decode was given, kept so that the `raptorq` crate's decode alone
/// can be timed again on the same block and ESIs after the reception
/// (`FastObjects::redecode`, bench/multicast.py).
pub(super) struct DecodeRecord {
    pub(super) path: PathBuf,
    pub(super) symbol: usize,
    pub(super) alignment: u8,
    pub(super) length: usize,
    pub(super) sbn: u8,
    pub(super) first: usize,
    pub(super) k: usize,
    pub(super) esis: Vec<u32>,
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

impl FastObjects {
    /// The `raptorq` crate's decode timed again on every recorded block decode of a
    /// completed object (with ``record``): the block read back from the object's
    /// file, the symbols it was given (the same ESIs) made by the crate's encoder
    /// beforehand, then `SourceBlockDecoder::new` and `decode` timed (thread CPU),
    /// the symbols warm in cache as the crate's own benchmarks have them. The
    /// crate's cost on the same data without the receive loop around it
    /// (bench/multicast.py). Blocks of objects not completed are skipped.
    pub fn redecode(&self) -> std::io::Result<Redecode> {
        use std::os::unix::fs::FileExt;
        let mut out = Redecode {
            blocks: 0,
            cpu_s: 0.0,
            bit_exact: true,
        };
        let done = self
            .objects
            .iter()
            .filter(|o| o.complete)
            .flat_map(|o| &o.records);
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
                        made.into_iter()
                            .next()
                            .expect("one repair packet asked for")
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
}
