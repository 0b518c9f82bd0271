//! The receive path's own CPU per packet without the sockets: a carousel's packets
//! (an object of 8 MiB, the default plan's 4 channels, RaptorQ) replayed through the
//! crate's ALC parser and the binding's own decoder (src/fast.rs, compiled in as it
//! is) as a receiver joined on every channel at a given point of the cycle gets them,
//! in batches as the receive loop reads them. It splits the receive path's work
//! beyond the `recvmmsg` loop (bench/multicast.py's "rest", decode and writes) from
//! the sockets' own, so a change to the decoder can be judged in seconds and with
//! `perf` (docs/results/2026-11-28-multicast-receive-cpu.md).
//!
//! `cargo run --release --example receive_cost [K [JOIN [ROUNDS]]]` (CARGO_TARGET_DIR
//! as the Makefile's binding rule): K the largest source block (1024: 7 blocks of 908
//! for 8 MiB), JOIN where in the cycle the receiver joins (0.0-1.0; 0.3, after every
//! channel's source symbols), ROUNDS receptions of the object in this process (5).
//! Prints, per reception, us per packet for the whole (parse + decoder), the RaptorQ
//! decode's share and of it the crate's `decode` calls alone, the file writes' share,
//! the share of bringing in the object's buffer (fresh memory) and the thread's minor
//! page faults.
//! Each channel's cycle follows the carousel's (`prepare.pass_order` then
//! `core.channel_cycles`: within a block source and repair symbols interleaved, ESI
//! mod N per channel, each channel's blocks spread evenly); with
//! RECEIVE_COST_ENCODER_ORDER set, a block's source symbols first (the encoder's
//! order, the carousel's before e9163a1), under which a receiver joined on every
//! channel at the cycle's start gets every source symbol and decodes nothing.
//! With RECEIVE_COST_FRESH_THREAD set, each reception runs on a new thread (as a
//! receiver's first object does: fresh memory), else all on the main thread. With
//! RECEIVE_COST_THRASH=BYTES, that much other memory is written between rounds
//! (untimed), as a shared host's other work evicts the caches while the receive
//! loop sleeps its 20 ms.

#[path = "../src/fast.rs"]
#[allow(dead_code)]
mod fast;

use std::time::{Duration, SystemTime};

use flute::core::{Oti, UDPEndpoint};
use flute::sender::{
    CarouselRepeatMode, Config as SenderConfig, ObjectDesc, Sender, TransferConfig,
};

const SYMBOL: u16 = 1320;
const CHANNELS: usize = 4;
const OVERHEAD: f64 = 0.35;
/// Datagrams a receive loop round reads: 4 channels of 5 Mbit/s for 20 ms (about
/// 38), the same number from each channel.
const ROUND: usize = 40;

fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn minor_faults() -> i64 {
    // SAFETY: a zeroed rusage for the call to fill
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_minflt
}

/// The object's packets (the crate's sender, as the binding's `encode_object`) and
/// each one's (SBN, ESI).
fn encode(content: Vec<u8>, k_max: u16) -> (Vec<Vec<u8>>, Vec<(u32, u32)>) {
    let kt = content.len().div_ceil(SYMBOL as usize);
    let blocks = kt.div_ceil(k_max as usize);
    let k = kt.div_ceil(blocks);
    let repair = ((k * CHANNELS) as f64 * (1.0 + OVERHEAD)).ceil() as usize - k;
    let oti = Oti::new_raptorq(SYMBOL, k_max, repair as u16, 1, 4).unwrap();
    let now = SystemTime::now();
    let config = SenderConfig {
        toi_initial_value: Some(1),
        ..Default::default()
    };
    let mut sender = Sender::new(
        UDPEndpoint::new(None, "239.0.0.1".into(), 5000),
        1,
        &Oti::new_no_code(SYMBOL, 64),
        &config,
    );
    let transfer = TransferConfig {
        oti: Some(oti.clone()),
        carousel_mode: Some(CarouselRepeatMode::DelayBetweenTransfers(
            Duration::from_secs(3600),
        )),
        ..Default::default()
    };
    let url = url::Url::parse("file:///issue").unwrap();
    let object =
        ObjectDesc::create_from_buffer(content, "application/octet-stream", &url, false, transfer)
            .unwrap();
    sender.add_object(0, object).unwrap();
    sender.publish(now).unwrap();
    let (mut packets, mut ids) = (Vec::new(), Vec::new());
    while let Some(pkt) = sender.read(now) {
        let alc = flute::core::alc::parse_alc_pkt(&pkt).unwrap();
        if alc.lct.toi == 0 {
            continue;
        }
        let id = flute::core::alc::parse_payload_id(&alc, &oti).unwrap();
        ids.push((id.sbn, id.esi));
        packets.push(pkt);
    }
    (packets, ids)
}

/// The pass's order as pressrun.multicast.prepare.pass_order makes it with RaptorQ
/// (indices into ``ids``): by block, and within a block source symbol i of K at
/// (i + 0.5) / K, repair symbol j of R at (j + 0.5) / R; the encoder's order with
/// ``encoder_order``.
fn pass_order(
    ids: &[(u32, u32)],
    k_of: &std::collections::BTreeMap<u32, u32>,
    encoder_order: bool,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    if encoder_order {
        return order;
    }
    let mut repairs: std::collections::BTreeMap<u32, u32> = Default::default();
    for &(sbn, esi) in ids {
        if esi >= k_of[&sbn] {
            *repairs.entry(sbn).or_default() += 1;
        }
    }
    let place = |i: usize| {
        let (sbn, esi) = ids[i];
        let k = k_of[&sbn];
        let at = if esi < k {
            (esi as f64 + 0.5) / k as f64
        } else {
            ((esi - k) as f64 + 0.5) / repairs[&sbn] as f64
        };
        (sbn, at, esi)
    };
    order.sort_by(|&a, &b| place(a).partial_cmp(&place(b)).unwrap());
    order
}

/// Each channel's cycle as pressrun.multicast.core.channel_cycles makes it over the
/// pass in `pass_order` (RaptorQ: ESI mod N, each block's packets spread evenly over
/// the cycle), FDT left out.
fn cycles(
    ids: &[(u32, u32)],
    k_of: &std::collections::BTreeMap<u32, u32>,
    encoder_order: bool,
) -> Vec<Vec<usize>> {
    let order = pass_order(ids, k_of, encoder_order);
    (0..CHANNELS)
        .map(|c| {
            let mut by_block: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
            for &i in &order {
                let (sbn, esi) = ids[i];
                if esi as usize % CHANNELS == c {
                    by_block.entry(sbn).or_default().push(i);
                }
            }
            let mut ranked: Vec<(f64, u32, usize)> = by_block
                .iter()
                .flat_map(|(&sbn, p)| {
                    p.iter()
                        .enumerate()
                        .map(move |(r, &i)| ((r as f64 + 0.5) / p.len() as f64, sbn, i))
                })
                .collect();
            ranked.sort_by(|a, b| a.partial_cmp(b).unwrap());
            ranked.into_iter().map(|(_, _, i)| i).collect()
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let k_max: u16 = args.first().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let join: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0.3);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let content: Vec<u8> = (0..8usize << 20)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8 ^ (i >> 13) as u8)
        .collect();
    let (packets, ids) = encode(content.clone(), k_max);
    // each block's K (RFC 6330 section 4.4.1.2: ZL blocks of KL symbols, then ZS of KS)
    let kt = content.len().div_ceil(SYMBOL as usize) as u32;
    let blocks = kt.div_ceil(k_max as u32);
    let (kl, ks) = (kt.div_ceil(blocks), kt / blocks);
    let zl = kt - ks * blocks;
    let k_of: std::collections::BTreeMap<u32, u32> = (0..blocks)
        .map(|sbn| (sbn, if sbn < zl { kl } else { ks }))
        .collect();
    for (&sbn, &k) in &k_of {
        // the pass holds ESIs 0..K of every block, then its repair symbols
        assert_eq!(
            ids.iter().filter(|&&(b, esi)| b == sbn && esi < k).count(),
            k as usize
        );
    }
    let encoder_order = std::env::var_os("RECEIVE_COST_ENCODER_ORDER").is_some();
    let cycles = cycles(&ids, &k_of, encoder_order);
    let dir = std::env::temp_dir().join(format!("receive_cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // a batch buffer as the receive loop's recvmmsg fills it
    println!(
        "K max {k_max}, join at {join:.2} of the cycle, {} packets a pass, {}",
        packets.len(),
        if encoder_order {
            "the encoder's order"
        } else {
            "source and repair interleaved (pass_order)"
        }
    );
    println!("round  us/packet  decode  (crate's)  writes  memory  rest  packets  decodes  minflt  bit-exact");
    let fresh_thread = std::env::var_os("RECEIVE_COST_FRESH_THREAD").is_some();
    // bytes of other memory written between rounds (untimed), as the other work
    // of a shared host evicts the caches while the receive loop sleeps 20 ms
    let thrash: usize = std::env::var("RECEIVE_COST_THRASH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut other = vec![0u8; thrash];
    let (packets, cycles, content) = (&packets, &cycles, &content);
    for round in 0..rounds {
        let mut body = || {
            let mut objects = fast::FastObjects::new(dir.clone(), 256 << 20, false);
            let mut pos: Vec<usize> = cycles
                .iter()
                .map(|c| (join * c.len() as f64) as usize)
                .collect();
            let (mut cpu, mut n) = (0.0, 0usize);
            let mut batch = vec![0u8; 64 * 4200];
            let mut lens = [0usize; 64];
            let faults0 = minor_faults();
            let mut done = None;
            'outer: while done.is_none() {
                // one round: ROUND datagrams, channel after channel
                let mut m = 0;
                while m < ROUND {
                    let c = m % CHANNELS;
                    let p = &packets[cycles[c][pos[c] % cycles[c].len()]];
                    pos[c] += 1;
                    batch[m * 4200..m * 4200 + p.len()].copy_from_slice(p);
                    lens[m] = p.len();
                    m += 1;
                }
                if thrash > 0 {
                    for (i, b) in other.iter_mut().enumerate().step_by(64) {
                        *b = b.wrapping_add(i as u8);
                    }
                    std::hint::black_box(&other);
                }
                let t0 = thread_cpu();
                for (i, &len) in lens[..m].iter().enumerate() {
                    let data = &batch[i * 4200..i * 4200 + len];
                    n += 1;
                    let alc = flute::core::alc::parse_alc_pkt(data).unwrap();
                    if let fast::Taken::Completed(path, _) = objects.push(&alc, data) {
                        done = Some(path);
                        cpu += thread_cpu() - t0;
                        break 'outer;
                    }
                }
                cpu += thread_cpu() - t0;
            }
            let faults = minor_faults() - faults0;
            let (decodes, decode_s) = objects.decode_cost();
            let write_s = objects.write_cost();
            let crate_s = objects.crate_decode_cpu_s();
            let memory_s = objects.memory_cost();
            let path = done.unwrap();
            let exact = std::fs::read(&path).unwrap() == *content;
            std::fs::remove_file(&path).ok();
            let us = |s: f64| s * 1e6 / n as f64;
            println!(
                "{:>5}  {:>9.2}  {:>6.2}  {:>9.2}  {:>6.2}  {:>6.2}  {:>4.2}  {n:>7}  {decodes:>7}  {faults:>6}  {exact}",
                round + 1,
                us(cpu),
                us(decode_s),
                us(crate_s),
                us(write_s),
                us(memory_s),
                us(cpu - decode_s - write_s - memory_s)
            );
        };
        if fresh_thread {
            // a receive thread of its own, as `pressrun get` has: its malloc arena
            // and the pages it faults in are fresh
            std::thread::scope(|s| {
                s.spawn(&mut body);
            });
        } else {
            body();
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
