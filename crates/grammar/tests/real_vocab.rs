//! The matcher over SmolLM2's real 49,152-token GPT-2 byte-level vocabulary.

mod common;

use std::sync::Arc;

use common::gguf_vocab::{load, model_path};
use common::{accepts, assert_mask_matches_brute_force, random_walk};
use grammar::{CompiledGrammar, Matcher, TokenMask, Vocab};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

#[test]
fn smollm2_vocab_masks_and_walks() {
    let Some(path) = model_path("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let gv = load(&path).expect("read GGUF vocab");
    assert_eq!(gv.tokens.len(), 49152);
    // SmolLM2's eos is <|im_end|>; make sure the reader found it and dropped its text.
    assert_eq!(gv.eos.len(), 1);
    assert!(gv.tokens[gv.eos[0] as usize].is_empty());
    let vocab = Arc::new(Vocab::new(&gv.tokens, &gv.eos));
    let schema = r#"{
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "東京", "São Paulo"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}
        },
        "required": ["name", "age", "city"]
    }"#;
    let g = Arc::new(CompiledGrammar::from_json_schema(schema).unwrap());
    let mut rng = StdRng::seed_from_u64(1);
    let (mut finished, mut checked) = (0, 0);
    for walk in 0..12 {
        // Mask against brute force along the first walks, at every step.
        let mut m = Matcher::new(g.clone(), vocab.clone()).unwrap();
        let mut mask = TokenMask::new(vocab.len());
        let mut text = Vec::new();
        for _ in 0..200 {
            if walk < 2 {
                assert_mask_matches_brute_force(&mut m, &vocab);
                checked += 1;
            }
            m.fill_mask(&mut mask).unwrap();
            if mask.is_allowed(gv.eos[0]) {
                finished += 1;
                let v: Value = serde_json::from_slice(&text).unwrap();
                let body = String::from_utf8_lossy(&text[1..]).trim_start().to_string();
                assert!(
                    body.starts_with("\"name\""),
                    "properties in schema order: {body}"
                );
                assert!(
                    v["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)),
                    "{v}"
                );
                assert!(
                    ["Paris", "東京", "São Paulo"].contains(&v["city"].as_str().unwrap()),
                    "{v}"
                );
                break;
            }
            let allowed: Vec<u32> = mask.allowed().collect();
            // Favour the shortest allowed tokens now and then, so strings end.
            let t = if rng.gen_bool(0.3) {
                *allowed
                    .iter()
                    .find(|&&t| vocab.token_bytes(t).contains(&b'"'))
                    .unwrap_or(&allowed[0])
            } else {
                allowed[rng.gen_range(0..allowed.len())]
            };
            m.accept(t).unwrap();
            text.extend_from_slice(vocab.token_bytes(t));
        }
    }
    assert!(finished >= 6, "only {finished} of 12 walks finished");
    assert!(
        checked >= 20,
        "only {checked} states checked against brute force"
    );
    // And a free grammar over the real vocabulary.
    let g = Arc::new(
        CompiledGrammar::from_gbnf(include_str!("../../../grammars/arithmetic.gbnf")).unwrap(),
    );
    for _ in 0..10 {
        if let Some(text) = random_walk(&g, &vocab, &mut rng, 40) {
            assert!(accepts(&g, &text), "{text:?}");
        }
    }
}
