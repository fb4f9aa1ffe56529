//! Small vocabularies written as GGUF files by the project's own writer: SentencePiece
//! merges by score with byte fallback, the `▁` space convention, the llama-bpe and
//! qwen2 pre-tokenizers, and the errors a broken file gives.

use gguf::{Gguf, GgufWriter, Value, ValueType};
use tokenizer::{Model, StreamDecoder, Tokenizer, TokenizerError};

fn strings(v: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        v.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

fn gguf_of(meta: Vec<(&str, Value)>) -> Gguf {
    let mut w = GgufWriter::new(32);
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    Gguf::parse(&w.to_bytes()).expect("parse what the writer wrote")
}

/// A SentencePiece vocabulary: `<unk> <s> </s>`, the 256 byte tokens (ids 3..=258), then
/// pieces with scores chosen so the merge order is known.
const SPM_PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),      // 259
    ("h", -2.0),      // 260
    ("e", -2.0),      // 261
    ("l", -2.0),      // 262
    ("o", -2.0),      // 263
    ("w", -2.0),      // 264
    ("r", -2.0),      // 265
    ("d", -2.0),      // 266
    ("ll", -1.0),     // 267
    ("llo", -2.0),    // 268
    ("he", -4.0),     // 269
    ("▁h", -5.0),     // 270
    ("▁he", -3.0),    // 271
    ("▁hello", -1.5), // 272
    ("▁w", -2.0),     // 273
    ("or", -2.5),     // 274
    ("ld", -3.0),     // 275
    ("▁wor", -3.0),   // 276
    ("▁world", -2.0), // 277
    ("a", -2.0),      // 278
    ("aa", -1.0),     // 279
];

fn spm_meta(extra: Vec<(&'static str, Value)>) -> Gguf {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for &(p, s) in SPM_PIECES {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(s);
    }
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&refs)),
        (
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ];
    meta.extend(extra);
    gguf_of(meta)
}

fn spm() -> Tokenizer {
    Tokenizer::from_gguf(&spm_meta(vec![])).unwrap()
}

fn byte_id(b: u8) -> u32 {
    3 + b as u32
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_bos() {
    let t = spm();
    assert_eq!(t.model(), Model::Spm);
    assert!(t.add_bos(), "SentencePiece adds BOS by default");
    // "▁hello": ll, llo, he, ▁he, ▁hello; "▁world": ▁w, or, ▁wor (tie with ld: leftmost), ld, ▁world.
    assert_eq!(t.encode("hello world", true, false).unwrap(), [1, 272, 277]);
    assert_eq!(t.encode("hello world", false, false).unwrap(), [272, 277]);
    assert_eq!(t.decode(&[272, 277]), " hello world");
    assert_eq!(t.detokenize(&[272, 277]), "hello world");
}

#[test]
fn spm_equal_scores_merge_leftmost_first() {
    // "▁aaa": both "aa" pairs score -1; the left one merges, leaving "a" on the right.
    assert_eq!(spm().encode("aaa", false, false).unwrap(), [259, 279, 278]);
}

#[test]
fn spm_falls_back_to_byte_tokens() {
    let t = spm();
    let ids = t.encode("hé", false, false).unwrap();
    assert_eq!(ids, [270, byte_id(0xC3), byte_id(0xA9)]);
    assert_eq!(t.detokenize(&ids), "hé");
    // The two byte tokens of 'é' are held until the character is complete.
    let mut d = StreamDecoder::new();
    assert_eq!(d.push(&t, ids[0]), " h");
    assert_eq!(d.push(&t, ids[1]), "");
    assert_eq!(d.push(&t, ids[2]), "é");
    assert_eq!(d.finish(), "");
}

#[test]
fn spm_space_prefix_after_special_tokens() {
    let t = spm();
    // Parsed: <s> is cut out, and the text after it gets the prefix space again.
    assert_eq!(t.encode("<s>hello", false, true).unwrap(), [1, 272]);
    // Not parsed: "<s>" is text, spelled in byte tokens; "hello" follows without a space.
    assert_eq!(
        t.encode("<s>hello", false, false).unwrap(),
        [259, byte_id(b'<'), byte_id(b's'), byte_id(b'>'), 269, 268]
    );
}

#[test]
fn spm_add_space_prefix_can_be_turned_off() {
    let g = spm_meta(vec![
        ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
    ]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(!t.add_bos());
    assert_eq!(t.encode("hello", true, false).unwrap(), [269, 268]);
}

#[test]
fn spm_round_trips_through_detokenize() {
    let t = spm();
    for s in [
        "hello world",
        "  two  spaces ",
        "héllo wörld ☃",
        "a\nb\tc",
        "",
    ] {
        let ids = t.encode(s, false, false).unwrap();
        assert_eq!(t.detokenize(&ids), s, "{ids:?}");
    }
}

/// A byte-level BPE vocabulary: the characters needed, a few merged words, one merge.
fn bpe_meta(pre: Option<&str>) -> Gguf {
    let tokens = [
        "<|endoftext|>", // 0
        "h",             // 1
        "e",             // 2
        "l",             // 3
        "o",             // 4
        "Ġ",             // 5
        "Ġhello",        // 6
        "1",             // 7
        "2",             // 8
        "3",             // 9
        "4",             // 10
        "5",             // 11
        "12",            // 12
    ];
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.merges", strings(&["1 2"])),
        (
            "tokenizer.ggml.token_type",
            Value::Array(
                ValueType::I32,
                std::iter::once(3)
                    .chain(std::iter::repeat_n(1, tokens.len() - 1))
                    .map(Value::I32)
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
    ];
    if let Some(p) = pre {
        meta.push(("tokenizer.ggml.pre", Value::String(p.into())));
    }
    gguf_of(meta)
}

#[test]
fn llama_bpe_takes_vocabulary_words_whole_and_groups_digits() {
    let t = Tokenizer::from_gguf(&bpe_meta(Some("llama-bpe"))).unwrap();
    assert!(t.add_bos(), "llama-bpe adds BOS by default");
    // No merge builds "Ġhello", but llama-bpe ignores merges for vocabulary words.
    assert_eq!(t.encode(" hello", false, false).unwrap(), [6]);
    // Digits in runs of up to three: "123" "45"; "1 2" merges inside the first.
    assert_eq!(t.encode("12345", true, false).unwrap(), [0, 12, 9, 10, 11]);
}

#[test]
fn gpt2_and_qwen2_run_the_merges() {
    let t = Tokenizer::from_gguf(&bpe_meta(Some("gpt-2"))).unwrap();
    assert!(!t.add_bos());
    assert_eq!(
        t.encode(" hello", false, false).unwrap(),
        [5, 1, 2, 3, 3, 4]
    );
    assert_eq!(t.encode("12345", false, false).unwrap(), [12, 9, 10, 11]);
    // qwen2: every digit alone, so "1 2" never applies.
    let t = Tokenizer::from_gguf(&bpe_meta(Some("qwen2"))).unwrap();
    assert_eq!(t.encode("12345", false, false).unwrap(), [7, 8, 9, 10, 11]);
}

#[test]
fn unknown_pre_tokenizer_is_an_error_naming_it() {
    let err = Tokenizer::from_gguf(&bpe_meta(Some("martian"))).unwrap_err();
    assert!(matches!(err, TokenizerError::UnknownPreTokenizer(ref n) if n == "martian"));
    assert!(err.to_string().contains("'martian'"), "{err}");
    assert!(
        err.to_string().contains("smollm"),
        "lists the supported ones: {err}"
    );
}

#[test]
fn broken_metadata_is_reported() {
    let err = Tokenizer::from_gguf(&gguf_of(vec![(
        "tokenizer.ggml.model",
        Value::String("wordpiece".into()),
    )]))
    .unwrap_err();
    assert!(err.to_string().contains("'wordpiece'"), "{err}");

    let err = Tokenizer::from_gguf(&gguf_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");

    let err = Tokenizer::from_gguf(&gguf_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "a"])),
        ("tokenizer.ggml.merges", strings(&[])),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("duplicate token \"a\""), "{err}");

    let err = Tokenizer::from_gguf(&gguf_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
        ("tokenizer.ggml.merges", strings(&[])),
        (
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, vec![Value::I32(1)]),
        ),
    ]))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("tokenizer.ggml.token_type has 1 entries"),
        "{err}"
    );

    // add_bos_token without any BOS id (the gpt2 default, 11, is outside this vocabulary).
    let err = Tokenizer::from_gguf(&gguf_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
        ("tokenizer.ggml.merges", strings(&[])),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("add_bos_token"), "{err}");
}

#[test]
fn special_ids_outside_the_vocabulary_are_refused() {
    // An out-of-range bos_token_id with add_bos_token became id 11.
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens",
            strings(
                &(0..20)
                    .map(|i| format!("t{i}"))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            ),
        ),
        ("tokenizer.ggml.merges", strings(&[])),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
    ];
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        for id in [20, 4_294_967_295] {
            let mut m = meta.clone();
            m.push((key, Value::U32(id)));
            let err = Tokenizer::from_gguf(&gguf_of(m)).unwrap_err();
            assert!(
                matches!(err, TokenizerError::SpecialIdOutOfRange { key: k, id: i, n_vocab: 20 } if k == key && i == id),
                "{key}={id}: {err:?}"
            );
            assert!(err.to_string().contains(key), "{err}");
        }
    }
    meta.push(("tokenizer.ggml.bos_token_id", Value::U32(19)));
    let t = Tokenizer::from_gguf(&gguf_of(meta)).unwrap();
    assert_eq!(t.bos(), Some(19));
}
