//! Helpers shared by the integration tests: vocabularies, whole-text checks, random walks.
#![allow(dead_code)]

use std::sync::Arc;

use grammar::{CompiledGrammar, Matcher, TokenMask, Vocab};
use rand::rngs::StdRng;
use rand::Rng;

pub const EOS: u32 = 0;

pub fn compile(src: &str) -> Arc<CompiledGrammar> {
    Arc::new(CompiledGrammar::from_gbnf(src).unwrap_or_else(|e| panic!("{e}\n{src}")))
}

/// Token 0 is eos, then every single byte.
pub fn byte_vocab() -> Arc<Vocab> {
    let mut tokens = vec![Vec::new()];
    tokens.extend((0..=255u8).map(|b| vec![b]));
    Arc::new(Vocab::new(&tokens, &[EOS]))
}

/// Whether the grammar matches `text` exactly.
pub fn accepts(g: &Arc<CompiledGrammar>, text: &str) -> bool {
    let mut m = Matcher::new(g.clone(), byte_vocab()).expect("matcher");
    m.accept_bytes(text.as_bytes()).expect("no overflow") && m.is_complete()
}

/// Token 0 eos, all single bytes, whole multi-byte characters, pieces that split them,
/// words with and without a leading space, JSON punctuation runs and digit runs.
pub fn synthetic_vocab() -> Vec<Vec<u8>> {
    let mut t: Vec<Vec<u8>> = vec![Vec::new()];
    t.extend((0..=255u8).map(|b| vec![b]));
    for s in ["é", "日", "本", "🙂", "ü", "–"] {
        let b = s.as_bytes();
        t.push(b.to_vec());
        for cut in 1..b.len() {
            t.push(b[..cut].to_vec());
            t.push(b[cut..].to_vec());
        }
    }
    // Tokens that span a character boundary inside a split character.
    t.push("a日".as_bytes()[..2].to_vec());
    t.push([&"日".as_bytes()[2..], b"x"].concat());
    for w in [
        "true",
        "false",
        "null",
        "the",
        "hello",
        "name",
        "age",
        "tags",
        "id",
        "ok",
        "x",
        "e",
        "O-O",
        "Nf3",
        "e4",
        "- ",
        "\n",
        "\n  ",
        "  ",
        " ",
        "{\"",
        "\":",
        "\": ",
        "\",",
        "\", \"",
        "},",
        "}",
        "]",
        "[{",
        "\"}",
        "\"]",
        "[\"",
        ", ",
        ",\n",
        "0",
        "1",
        "12",
        "123",
        "-1",
        "-",
        ".5",
        "0.",
        "e+",
        "E-1",
        "99",
        "100",
        "\\n",
        "\\\"",
        "\\u00e9",
        "(",
        ")",
        " + ",
        "*",
        "/",
        "1)",
        "(2",
        "\"name\": \"",
        "\"age\": ",
        "\"tags\": [",
    ] {
        t.push(w.as_bytes().to_vec());
        t.push(format!(" {w}").into_bytes());
    }
    t
}

/// Random walk: picks among allowed tokens until complete, then takes eos with
/// probability one half (always after `max_steps`). Returns the text, or `None` when the
/// walk did not finish in time.
pub fn random_walk(
    g: &Arc<CompiledGrammar>,
    vocab: &Arc<Vocab>,
    rng: &mut StdRng,
    max_steps: usize,
) -> Option<String> {
    let mut m = Matcher::new(g.clone(), vocab.clone()).expect("matcher");
    let mut mask = TokenMask::new(vocab.len());
    let mut bytes = Vec::new();
    for step in 0..max_steps * 2 {
        m.fill_mask(&mut mask).expect("mask");
        let eos_ok = vocab.eos().iter().any(|&e| mask.is_allowed(e));
        assert_eq!(eos_ok, m.is_complete(), "eos allowed iff complete");
        if eos_ok && (step >= max_steps || rng.gen_bool(0.5)) {
            m.accept(vocab.eos()[0])
                .expect("eos accepted when complete");
            assert!(m.is_finished());
            return Some(String::from_utf8(bytes).expect("grammar output is UTF-8"));
        }
        let allowed: Vec<u32> = mask.allowed().filter(|&t| !vocab.is_eos(t)).collect();
        assert!(
            !allowed.is_empty() || eos_ok,
            "no token allowed and not complete after {:?}",
            String::from_utf8_lossy(&bytes)
        );
        if allowed.is_empty() {
            continue;
        }
        // Past the step budget, prefer short tokens of punctuation that tend to close.
        let t = allowed[rng.gen_range(0..allowed.len())];
        m.accept(t).expect("a masked-in token is accepted");
        bytes.extend_from_slice(vocab.token_bytes(t));
    }
    None
}

/// Checks the mask against accepting each token on its own, at the matcher's state.
pub fn assert_mask_matches_brute_force(m: &mut Matcher, vocab: &Vocab) {
    let mut mask = TokenMask::new(vocab.len());
    m.fill_mask(&mut mask).expect("mask");
    for t in 0..vocab.len() as u32 {
        let want = if vocab.is_eos(t) {
            m.is_complete()
        } else {
            let bytes = vocab.token_bytes(t);
            !bytes.is_empty() && m.allows_bytes(bytes).expect("no overflow")
        };
        assert_eq!(
            mask.is_allowed(t),
            want,
            "token {t} {:?}",
            String::from_utf8_lossy(vocab.token_bytes(t))
        );
    }
    // Asking again hits the mask cache and must agree.
    let mut again = TokenMask::new(vocab.len());
    m.fill_mask(&mut again).expect("mask");
    assert_eq!(mask, again);
}
pub mod gguf_vocab;
