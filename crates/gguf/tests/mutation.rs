//! Seeded mutation of the real model's header: truncations and byte flips must give an
//! error or a valid parse, never a panic (and never a huge allocation, which would abort).

mod common;

use gguf::Gguf;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TRUNCATIONS: usize = 4_000;
const FLIPS: usize = 6_000;

#[test]
fn header_truncations_and_flips_never_panic() {
    let bytes = std::fs::read(common::default_model()).expect("reading the default model");
    let g = Gguf::parse(&bytes).expect("the unmodified model parses");
    let header_end = g.data_offset as usize;
    // Regions: the fixed header, the small keys and the start of the vocabulary (cheap
    // to reach, so most mutations go there), and the tensor infos at the end of the
    // header (reaching them means parsing the whole vocabulary, ~10 ms).
    let front_end = 64 * 1024;
    let infos_start = header_end - 20_000;

    let bytes = &bytes;
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let results: Vec<(usize, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|tid| {
                // The whole file, so a flip the parser cannot detect parses cleanly.
                let mut buf = bytes.clone();
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(0x6767_7566 + tid as u64);
                    let (mut n, mut cut_ok, mut flip_ok) = (0, 0, 0);
                    for i in (tid..TRUNCATIONS + FLIPS).step_by(threads) {
                        n += 1;
                        let outcome = if i < TRUNCATIONS {
                            let cut = match rng.gen_range(0..20) {
                                0 => rng.gen_range(0..header_end),
                                1 => rng.gen_range(infos_start..header_end),
                                _ => rng.gen_range(0..front_end),
                            };
                            Gguf::parse(&bytes[..cut]).map(|_| ())
                        } else {
                            let k = rng.gen_range(1..=6);
                            let mut saved = Vec::with_capacity(k);
                            let region = match rng.gen_range(0..10) {
                                0 => 0..header_end,
                                1 => infos_start..header_end,
                                _ => 0..front_end,
                            };
                            for _ in 0..k {
                                let pos = rng.gen_range(region.clone());
                                saved.push((pos, buf[pos]));
                                buf[pos] = if rng.gen_bool(0.5) {
                                    buf[pos] ^ (1 << rng.gen_range(0..8))
                                } else {
                                    rng.gen()
                                };
                            }
                            let r = Gguf::parse(&buf).map(|_| ());
                            for (pos, b) in saved.into_iter().rev() {
                                buf[pos] = b;
                            }
                            r
                        };
                        match outcome {
                            Ok(()) if i < TRUNCATIONS => cut_ok += 1,
                            Ok(()) => flip_ok += 1,
                            Err(e) => assert!(!e.to_string().is_empty()),
                        }
                    }
                    (n, cut_ok, flip_ok)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: usize = results.iter().map(|r| r.0).sum();
    let cut_ok: usize = results.iter().map(|r| r.1).sum();
    let flip_ok: usize = results.iter().map(|r| r.2).sum();
    assert_eq!(total, TRUNCATIONS + FLIPS);
    // A file cut inside its header has lost its tensor data: always an error.
    assert_eq!(cut_ok, 0, "{cut_ok} truncated headers parsed");
    eprintln!(
        "{total} mutations, no panic: all {TRUNCATIONS} truncations rejected, \
         {} of {FLIPS} flips rejected (the rest changed string contents or values)",
        FLIPS - flip_ok
    );
}
