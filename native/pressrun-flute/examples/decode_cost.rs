//! The RaptorQ decode's own CPU per received symbol, the floor under the receive
//! path's CPU for a receiver that gets repair symbols (docs/multicast.md, "Receiver
//! CPU"): one block of K symbols of 1320 bytes (the carousel's default block is
//! K <= 1024; an 8 MiB issue is 7 blocks of 908), decoded by the `raptorq` crate the
//! binding uses from K + 20 symbols of which a given share are source symbols.
//!
//! Beside it, the other per-packet work a receiver cannot avoid: one copy of a
//! symbol from a receive buffer (64 of them, as a `recvmmsg` batch, warm in cache)
//! into its place in an 8 MiB image in fresh memory (transparent huge pages, as the
//! binding's decoder keeps it), which added to the bare `recvmmsg` loop is the least
//! a receive path that writes the file can cost.
//!
//! `cargo run --release --example decode_cost [K ...]` (CARGO_TARGET_DIR as the
//! Makefile's binding rule); prints the copy's cost per symbol (median of 7 passes
//! over a fresh image), then, per K and source share, the median of 7 decodes in us
//! per received symbol and per block.

use raptorq::{
    EncodingPacket, ObjectTransmissionInformation, SourceBlockDecoder, SourceBlockEncoder,
};

const SYMBOL: usize = 1320;
const EXTRA: usize = 20;

/// CPU time of this thread, in seconds (the bench counts the receive thread's CPU).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Thread CPU seconds of copying 8 MiB of 1320-byte symbols from 64 warm receive
/// buffers into a fresh anonymous mapping (huge pages advised), one symbol at a time.
fn copy_pass() -> (f64, usize) {
    const IMAGE: usize = 8 << 20;
    let buffers: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; SYMBOL]).collect();
    // SAFETY: a fresh private anonymous mapping, unmapped below
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            IMAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(ptr != libc::MAP_FAILED);
    // SAFETY: as in the binding's Mapping::new
    unsafe { libc::madvise(ptr, IMAGE, libc::MADV_HUGEPAGE) };
    // SAFETY: the mapping is IMAGE bytes and only this slice uses it
    let image = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), IMAGE) };
    let symbols = IMAGE / SYMBOL;
    let t0 = thread_cpu();
    for i in 0..symbols {
        image[i * SYMBOL..(i + 1) * SYMBOL].copy_from_slice(&buffers[i % 64]);
    }
    let cpu = thread_cpu() - t0;
    std::hint::black_box(&image[..]);
    // SAFETY: the mapping made above
    unsafe { libc::munmap(ptr, IMAGE) };
    (cpu, symbols)
}

fn main() {
    let mut copies: Vec<f64> = (0..7)
        .map(|_| copy_pass())
        .map(|(s, n)| s / n as f64)
        .collect();
    copies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "one copy of a {SYMBOL}-byte symbol into a fresh 8 MiB image: {:.3} us/symbol (median of 7)",
        copies[3] * 1e6
    );
    let ks: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ks = if ks.is_empty() {
        vec![256, 512, 908, 1024, 4096]
    } else {
        ks
    };
    println!("  K  source share  us/symbol (median of 7)  ms/block  decoded");
    for k in ks {
        let bytes = k * SYMBOL;
        let data: Vec<u8> = (0..bytes)
            .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
            .collect();
        let config = ObjectTransmissionInformation::new(bytes as u64, SYMBOL as u16, 1, 1, 4);
        let encoder = SourceBlockEncoder::new(0, &config, &data);
        let sources = encoder.source_packets();
        let repairs = encoder.repair_packets(0, (k + EXTRA) as u32);
        for share in [0.0, 0.2, 0.5, 0.9, 0.99] {
            let n_source = ((k as f64) * share) as usize;
            // the sources a receiver got: every few, as a mid-cycle joiner gets them
            let picked: Vec<EncodingPacket> = (0..k)
                .filter(|i| n_source > 0 && (i * n_source / k) != ((i + 1) * n_source / k))
                .map(|i| sources[i].clone())
                .collect();
            let need = k + EXTRA - picked.len();
            let packets: Vec<EncodingPacket> = picked
                .into_iter()
                .chain(repairs[..need].iter().cloned())
                .collect();
            let mut times = Vec::new();
            let mut ok = true;
            for _ in 0..7 {
                let input = packets.clone();
                let t0 = thread_cpu();
                let mut decoder = SourceBlockDecoder::new(0, &config, bytes as u64);
                let out = decoder.decode(input);
                times.push(thread_cpu() - t0);
                ok &= out.as_deref() == Some(&data[..]);
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let median = times[times.len() / 2];
            println!(
                "{k:>5}  {share:>11.2}  {:>22.2}  {:>8.2}  {ok}",
                median * 1e6 / (k + EXTRA) as f64,
                median * 1e3
            );
        }
    }
}
