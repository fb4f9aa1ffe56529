//! The token matcher: mask equals a per-token brute-force check, random walks stay
//! inside the grammar, split UTF-8 across tokens, eos handling.

mod common;

use std::sync::Arc;

use common::{
    accepts, assert_mask_matches_brute_force, compile, random_walk, synthetic_vocab, EOS,
};
use grammar::{MatchError, Matcher, TokenMask, Vocab};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const GRAMMARS: &[&str] = &[
    "root ::= \"hello\" \" world\"?",
    "root ::= (\"é\" | \"日本\" | \"🙂\" | [a-c])+ \".\"",
    "root ::= [^\\x00-\\x7F]{1,3} \"x\"",
    "root ::= \"true\" | \"trust\" | \"tree\" | \"the\" \" \" \"hello\"",
    include_str!("../../../grammars/arithmetic.gbnf"),
    include_str!("../../../grammars/json.gbnf"),
    include_str!("../../../grammars/chess.gbnf"),
    include_str!("../../../grammars/list.gbnf"),
];

/// At many random states reached by random walks, the mask equals the brute-force check.
#[test]
fn mask_equals_brute_force_on_random_states() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let mut rng = StdRng::seed_from_u64(7);
    let mut states = 0;
    for src in GRAMMARS {
        let g = compile(src);
        for _ in 0..6 {
            let mut m = Matcher::new(g.clone(), vocab.clone()).unwrap();
            let mut mask = TokenMask::new(vocab.len());
            for _ in 0..rng.gen_range(0..40) {
                assert_mask_matches_brute_force(&mut m, &vocab);
                states += 1;
                m.fill_mask(&mut mask).unwrap();
                let allowed: Vec<u32> = mask.allowed().filter(|&t| t != EOS).collect();
                if allowed.is_empty() {
                    break;
                }
                m.accept(allowed[rng.gen_range(0..allowed.len())]).unwrap();
            }
        }
    }
    assert!(states > 300, "only {states} states checked");
}

/// Random walks end in text the grammar accepts as a whole.
#[test]
fn random_walks_produce_accepted_text() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let mut rng = StdRng::seed_from_u64(11);
    for src in GRAMMARS {
        let g = compile(src);
        let mut finished = 0;
        for _ in 0..40 {
            if let Some(text) = random_walk(&g, &vocab, &mut rng, 60) {
                assert!(
                    accepts(&g, &text),
                    "walk produced {text:?} which the grammar rejects:\n{src}"
                );
                finished += 1;
            }
        }
        assert!(
            finished >= 10,
            "only {finished} of 40 walks finished for\n{src}"
        );
    }
}

#[test]
fn utf8_split_across_tokens() {
    let ri = "日".as_bytes();
    let tokens = vec![
        vec![],
        ri[..1].to_vec(),
        ri[1..].to_vec(),
        ri.to_vec(),
        b"a".to_vec(),
        "本".as_bytes()[..2].to_vec(),
    ];
    let vocab = Arc::new(Vocab::new(&tokens, &[0]));
    let g = compile("root ::= \"日\"+");
    let mut m = Matcher::new(g.clone(), vocab.clone()).unwrap();
    let mut mask = TokenMask::new(vocab.len());
    m.fill_mask(&mut mask).unwrap();
    // The lead byte of 本 is the same as 日's (E6) but its second byte differs.
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![1, 3]);
    m.accept(1).unwrap();
    assert!(!m.is_complete(), "half a character is not complete");
    m.fill_mask(&mut mask).unwrap();
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![2]);
    assert_eq!(m.accept(0), Err(MatchError::NotComplete { token: 0 }));
    m.accept(2).unwrap();
    assert!(m.is_complete());
    m.fill_mask(&mut mask).unwrap();
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![0, 1, 3]);
    assert_eq!(m.accept(4), Err(MatchError::Rejected { token: 4 }));
    m.accept(0).unwrap();
    assert!(m.is_finished() && m.is_dead());
    assert_eq!(m.accept(3), Err(MatchError::Finished));
}

#[test]
fn invalid_utf8_is_never_allowed() {
    let tokens: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xC0, 0x80],
        vec![0xED, 0xA0, 0x80],
        vec![0xFF],
        vec![0xF4, 0x90],
        b"a".to_vec(),
    ];
    let vocab = Arc::new(Vocab::new(&tokens, &[0]));
    let g = compile("root ::= .*");
    let mut m = Matcher::new(g, vocab.clone()).unwrap();
    let mut mask = TokenMask::new(vocab.len());
    m.fill_mask(&mut mask).unwrap();
    // Overlong, surrogate, invalid byte and above U+10FFFF are all out.
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![0, 5]);
}

#[test]
fn complete_grammar_with_no_continuation_is_dead() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let mut m = Matcher::new(compile("root ::= \"ok\""), vocab.clone()).unwrap();
    assert!(!m.is_dead());
    assert!(m.accept_bytes(b"ok").unwrap());
    assert!(m.is_complete() && m.is_dead());
    let mut mask = TokenMask::new(vocab.len());
    m.fill_mask(&mut mask).unwrap();
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![EOS]);
    assert!(
        !m.accept_bytes(b"k").unwrap(),
        "rejected bytes leave the state alone"
    );
    assert!(m.is_complete());
}

#[test]
fn out_of_vocabulary_and_empty_tokens() {
    let vocab = Arc::new(Vocab::new(&[vec![], b"a".to_vec(), vec![]], &[0]));
    let mut m = Matcher::new(compile("root ::= \"a\"*"), vocab).unwrap();
    assert_eq!(m.accept(9), Err(MatchError::UnknownToken(9)));
    assert_eq!(m.accept(2), Err(MatchError::Rejected { token: 2 }));
    let mut wrong = TokenMask::new(5);
    assert_eq!(
        m.fill_mask(&mut wrong),
        Err(MatchError::MaskSize { mask: 5, vocab: 3 })
    );
}

#[test]
fn mask_helpers() {
    let tokens = [vec![], b"a".to_vec(), b"c".to_vec(), b"b".to_vec()];
    let mut m = Matcher::new(
        compile("root ::= [ab]"),
        Arc::new(Vocab::new(&tokens, &[0])),
    )
    .unwrap();
    let mut mask = TokenMask::new(4);
    m.fill_mask(&mut mask).unwrap();
    assert_eq!(mask.count(), 2);
    let mut logits = [1.0f32; 4];
    mask.apply_to_logits(&mut logits);
    assert_eq!(logits, [f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 1.0]);
    let mut flags = [true; 4];
    mask.write_bools(&mut flags);
    assert_eq!(flags, [false, true, false, true]);
}

/// A grammar whose live stacks grow with the input hits the stack bound with an error.
#[test]
fn ambiguity_is_bounded() {
    let vocab = Arc::new(Vocab::new(&[vec![], b"x".to_vec()], &[0]));
    // After n x's, a "y" may close any of the n open levels: n distinct stacks.
    let g = compile("root ::= a\na ::= \"x\" a \"y\"? | \"x\"");
    let mut m = Matcher::new(g, vocab.clone()).unwrap();
    for _ in 0..1000 {
        m.accept(1).unwrap();
    }
    let mut mask = TokenMask::new(vocab.len());
    m.fill_mask(&mut mask).unwrap();
    assert!(mask.is_allowed(0) && mask.is_allowed(1));
    let err = (0..5000).find_map(|_| m.accept(1).err());
    assert_eq!(
        err,
        Some(MatchError::TooManyStacks {
            limit: grammar::MAX_STACKS
        })
    );
}

/// With a tiny state limit the automaton is rebuilt often; masks and walks stay right.
#[test]
fn rebuilding_the_automaton_keeps_the_state() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let g = compile(include_str!("../../../grammars/json.gbnf"));
    let mut rng = StdRng::seed_from_u64(19);
    let mut mask = TokenMask::new(vocab.len());
    let mut rebuilt = 0;
    for _ in 0..5 {
        let mut m = Matcher::new(g.clone(), vocab.clone()).unwrap();
        m.set_state_limit(40);
        let mut text = Vec::new();
        for _ in 0..80 {
            let before = m.state_count();
            assert_mask_matches_brute_force(&mut m, &vocab);
            m.fill_mask(&mut mask).unwrap();
            let allowed: Vec<u32> = mask.allowed().filter(|&t| t != EOS).collect();
            if allowed.is_empty() {
                break;
            }
            let t = allowed[rng.gen_range(0..allowed.len())];
            m.accept(t).unwrap();
            text.extend_from_slice(vocab.token_bytes(t));
            if m.state_count() < before {
                rebuilt += 1;
            }
        }
        // The text so far is still a prefix the grammar allows.
        let mut fresh = Matcher::new(g.clone(), vocab.clone()).unwrap();
        assert!(fresh.accept_bytes(&text).unwrap());
        assert_eq!(fresh.is_complete(), m.is_complete());
        m.reset();
        assert!(
            m.accept_bytes(b"[1").unwrap(),
            "reset returns to the start after a rebuild"
        );
    }
    assert!(rebuilt > 5, "only {rebuilt} rebuilds");
}
