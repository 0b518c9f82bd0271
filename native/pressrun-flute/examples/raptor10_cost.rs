//! The other fountain code the `flute` crate offers, RFC 5053 Raptor (FEC Encoding
//! ID 1, the `raptor-code` crate it uses), decoded the same way as `decode_cost`
//! measures RaptorQ: one block of K symbols of 1320 bytes, K + 20 received of which a
//! given share are source symbols, the median of 5 decodes (pushing the symbols
//! included: this crate eliminates as they come) in us per received symbol. Whether a
//! cheaper code of the real crate would serve the carousel (docs/multicast.md,
//! "Receiver CPU"): it is not cheaper.
//!
//! `cargo run --release --example raptor10_cost` (CARGO_TARGET_DIR as the Makefile's
//! binding rule).

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

fn main() {
    const SYMBOL: usize = 1320;
    const EXTRA: usize = 20;
    println!("  K  source share  us/symbol (median of 5)  ms/block  decoded");
    for k in [256usize, 908] {
        let data: Vec<u8> = (0..k * SYMBOL)
            .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
            .collect();
        let mut encoder = raptor_code::SourceBlockEncoder::new(&data, k).expect("encoder");
        let k = encoder.nb_source_symbols() as usize;
        for share in [0.2, 0.5, 0.9] {
            let n_source = ((k as f64) * share) as usize;
            // the sources a receiver got: every few, as a mid-cycle joiner gets them
            let mut symbols: Vec<(u32, Vec<u8>)> = (0..k)
                .filter(|i| (i * n_source / k) != ((i + 1) * n_source / k))
                .map(|i| (i as u32, encoder.fountain(i as u32)))
                .collect();
            for r in 0..k + EXTRA - symbols.len() {
                let esi = (k + r) as u32;
                symbols.push((esi, encoder.fountain(esi)));
            }
            let mut times = Vec::new();
            let mut ok = true;
            for _ in 0..5 {
                let t0 = thread_cpu();
                let mut decoder = raptor_code::SourceBlockDecoder::new(k);
                for (esi, symbol) in &symbols {
                    decoder.push_encoding_symbol(symbol, *esi);
                }
                let out = decoder.decode(k * SYMBOL);
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
