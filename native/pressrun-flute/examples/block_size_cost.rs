//! What a source block of K symbols costs the sender and a receiver, for choosing
//! `CarouselConfig.max_source_block_symbols` (docs/multicast.md, "Source blocks"):
//! one block of K symbols of 1320 bytes, the `raptorq` crate the binding uses.
//!
//! - the sender: `SourceBlockEncoder::new` (the intermediate symbols), then repair
//!   symbols (the carousel precomputes K x channels x 1.35 - K of them per block;
//!   timed on 2K of them, per symbol);
//! - a receiver: the decode at the end of its receive, from K + 20 symbols of which
//!   none, or a third, are source symbols (a third: the pieces a reader held from
//!   the swarm), as `FastObject::complete_block` gives them, and from K symbols (the
//!   receive loop tries at K when a symbol repeats, as held source symbols do); its
//!   thread CPU and the process's peak resident memory after it.
//!
//! `cargo run --release --example block_size_cost K` (CARGO_TARGET_DIR as the
//! Makefile's binding rule); one K a process, so the peak memory is that K's.

use raptorq::{
    EncodingPacket, ObjectTransmissionInformation, SourceBlockDecoder, SourceBlockEncoder,
};

const SYMBOL: usize = 1320;
const EXTRA: usize = 20;

/// CPU time of this thread, in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The process's peak resident memory so far, MB.
fn peak_mb() -> f64 {
    // SAFETY: a zeroed rusage for the call to fill
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0
}

fn main() {
    let k: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let bytes = k * SYMBOL;
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    let config = ObjectTransmissionInformation::new(bytes as u64, SYMBOL as u16, 1, 1, 4);
    let base_mb = peak_mb();

    let t0 = thread_cpu();
    let encoder = SourceBlockEncoder::new(0, &config, &data);
    let new_s = thread_cpu() - t0;
    let t1 = thread_cpu();
    let repairs = encoder.repair_packets(0, (2 * k) as u32);
    let repair_s = thread_cpu() - t1;
    let sources = encoder.source_packets();
    drop(encoder);
    let encode_mb = peak_mb();

    let mut line = format!(
        "K {k:>5}  encoder new {:>8.1} ms ({:.2} us/source symbol)  repair {:.2} us/symbol",
        new_s * 1e3,
        new_s * 1e6 / k as f64,
        repair_s * 1e6 / (2 * k) as f64,
    );
    // (a third source, extra symbols beyond K): the receive loop decodes at K + 20,
    // or at K when a symbol repeats, as the held source symbols do
    for (third, extra) in [(false, EXTRA), (true, EXTRA), (true, 0)] {
        // a third of the sources held (every third one, as pieces spread over the
        // block), the rest repair symbols
        let held: Vec<EncodingPacket> = if third {
            sources.iter().step_by(3).cloned().collect()
        } else {
            Vec::new()
        };
        let need = k + extra - held.len();
        let packets: Vec<EncodingPacket> = held
            .into_iter()
            .chain(repairs[..need].iter().cloned())
            .collect();
        let t2 = thread_cpu();
        let mut decoder = SourceBlockDecoder::new(0, &config, bytes as u64);
        let out = decoder.decode(packets);
        let decode_s = thread_cpu() - t2;
        let ok = out.as_deref() == Some(&data[..]);
        line += &format!(
            "  decode ({}, K + {extra}) {:>8.1} ms ({:.2} us/symbol) {}",
            if third {
                "a third source"
            } else {
                "repair only"
            },
            decode_s * 1e3,
            decode_s * 1e6 / (k + extra) as f64,
            if ok { "bit-exact" } else { "FAILED" }
        );
    }
    println!(
        "{line}  peak RSS: data {base_mb:.0} MB, after encoding {encode_mb:.0}, after decoding {:.0}",
        peak_mb()
    );
}
