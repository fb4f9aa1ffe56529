//! Median time to compute a token mask per decoding step, for a JSON schema over the
//! SmolLM2 (49,152) and Gemma 3 (262,144) vocabularies read from `models/`.
//!
//! `cargo run --release -p grammar --example mask_speed`
//!
//! Each vocabulary runs several seeded random walks through the schema; the first walk
//! starts from a cold automaton (every state built and every mask walked for the first
//! time), the later ones reuse the matcher's caches as a long generation would.

#[path = "../tests/common/gguf_vocab.rs"]
#[allow(dead_code)]
mod gguf_vocab;

use std::sync::Arc;
use std::time::{Duration, Instant};

use grammar::{CompiledGrammar, Matcher, TokenMask, Vocab};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "zip": {"type": "integer"}, "country": {"enum": ["FR", "DE", "JP"]}
        }, "required": ["street", "country"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100}
    },
    "required": ["name", "age", "address"]
}"#;

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let grammar = Arc::new(CompiledGrammar::from_json_schema(SCHEMA).expect("schema compiles"));
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let path = format!("{}/../../models/{file}", env!("CARGO_MANIFEST_DIR"));
        let gv = match gguf_vocab::load(&path) {
            Ok(gv) => gv,
            Err(e) => {
                eprintln!("{file}: {e} (run scripts/setup)");
                continue;
            }
        };
        let t = Instant::now();
        let vocab = Arc::new(Vocab::new(&gv.tokens, &gv.eos));
        let build = t.elapsed();
        let mut rng = StdRng::seed_from_u64(42);
        let mut m = Matcher::new(grammar.clone(), vocab.clone()).expect("matcher");
        let mut mask = TokenMask::new(vocab.len());
        let (mut cold, mut warm, mut walk_only) = (Vec::new(), Vec::new(), Vec::new());
        for walk in 0..8 {
            // Later walks start over but keep the automaton and mask caches.
            m.reset();
            for _ in 0..300 {
                let t = Instant::now();
                m.fill_mask(&mut mask).expect("mask");
                let dt = t.elapsed();
                if walk == 0 {
                    cold.push(dt)
                } else {
                    warm.push(dt);
                    // The same step without its cached mask: the trie walk over warm transitions.
                    m.clear_mask_cache();
                    let t = Instant::now();
                    m.fill_mask(&mut mask).expect("mask");
                    walk_only.push(t.elapsed());
                }
                if vocab.eos().iter().any(|&e| mask.is_allowed(e)) {
                    break;
                }
                let allowed: Vec<u32> = mask.allowed().collect();
                // Close strings now and then, as a model would, so walks reach the end.
                let t = if rng.gen_bool(0.2) {
                    *allowed
                        .iter()
                        .find(|&&t| vocab.token_bytes(t).contains(&b'"'))
                        .unwrap_or(&allowed[0])
                } else {
                    allowed[rng.gen_range(0..allowed.len())]
                };
                m.accept(t).expect("allowed token");
            }
        }
        for (name, v) in [
            ("cold walk", &mut cold),
            ("warm walks", &mut warm),
            ("warm walks, mask cache off", &mut walk_only),
        ] {
            v.sort();
            println!(
                "{file}: {} tokens, vocab build {build:.1?}; {name}: {} steps, median {:.1?}, p90 {:.1?}, max {:.1?}",
                vocab.len(),
                v.len(),
                quantile(v, 0.5),
                quantile(v, 0.9),
                v[v.len() - 1]
            );
        }
        println!("{file}: {} automaton states", m.state_count());
    }
}
