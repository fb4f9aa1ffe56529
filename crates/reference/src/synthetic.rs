//! Tiny random models written with the project's own GGUF writer, shared with the GPU
//! tests (STYLE.md §6: a 2-layer, dim-64 model tests the whole forward pass).
//!
//! Weights come from a seeded SplitMix64 generator (no dependency, stable across
//! versions), so a seed names one model forever.

use gguf::{GgmlType, GgufWriter, Value, ValueType};

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, seedable generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        // 24 random bits: exactly representable in f32.
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        2.0 * u - 1.0
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): printable bytes stand for
/// themselves, the rest are shifted to U+0100 and up, in byte order.
fn byte_char(b: u8) -> char {
    let printable = |c: u32| (33..=126).contains(&c) || (161..=172).contains(&c) || c >= 174;
    if printable(u32::from(b)) {
        return char::from(b);
    }
    let n = (0..u32::from(b)).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// A random llama-architecture GGUF (seeded): 2-D weights of type `ty` (any type
/// `gguf::quant::quantize` writes: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), F32 norms, an untied `output.weight` in `ty` as well, and a minimal gpt2
/// tokenizer (ids 0-2 `<|endoftext|>`, `<|im_start|>` (bos), `<|im_end|>` (eos), then
/// the 256 byte tokens, then `tok<N>` fillers; no merges).
///
/// # Panics
/// When `ty` is not one of the types above, when `dim` or `hidden_dim` is not a multiple
/// of its block size, when `n_heads` does not divide `dim` into an even head dimension, or
/// when `n_kv_heads` does not divide `n_heads`: these are mistakes in a test, which should
/// fail loudly.
#[allow(clippy::too_many_arguments)]
pub fn tiny_llama(
    seed: u64,
    n_layers: usize,
    dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    hidden_dim: usize,
    vocab: usize,
    ty: GgmlType,
) -> Vec<u8> {
    assert!(
        n_heads > 0 && dim.is_multiple_of(n_heads) && (dim / n_heads).is_multiple_of(2),
        "tiny_llama: {n_heads} heads must split dim {dim} into even head dims"
    );
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "tiny_llama: {n_kv_heads} kv heads must divide {n_heads} heads"
    );
    let head_dim = dim / n_heads;
    let kv_dim = n_kv_heads * head_dim;
    let mut rng = Rng::new(seed);
    let mut w = GgufWriter::new(32);

    let u32v = |v: usize| Value::U32(v as u32);
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String(format!("tiny-llama-{seed}"))),
        ("llama.block_count", u32v(n_layers)),
        ("llama.context_length", u32v(256)),
        ("llama.embedding_length", u32v(dim)),
        ("llama.feed_forward_length", u32v(hidden_dim)),
        ("llama.attention.head_count", u32v(n_heads)),
        ("llama.attention.head_count_kv", u32v(n_kv_heads)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.rope.dimension_count", u32v(head_dim)),
        ("llama.vocab_size", u32v(vocab)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("gpt2".into())),
    ];
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    let mut tokens = Vec::with_capacity(vocab);
    let mut types = Vec::with_capacity(vocab);
    for i in 0..vocab {
        let (tok, tt) = match i {
            0 => ("<|endoftext|>".to_string(), 3),
            1 => ("<|im_start|>".to_string(), 3),
            2 => ("<|im_end|>".to_string(), 3),
            i if i < 3 + 256 => (byte_char((i - 3) as u8).to_string(), 1),
            i => (format!("tok{i}"), 1),
        };
        tokens.push(Value::String(tok));
        types.push(Value::I32(tt));
    }
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, tokens),
    );
    w.add_metadata(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types),
    );
    w.add_metadata(
        "tokenizer.ggml.merges",
        Value::Array(ValueType::String, vec![]),
    );
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(false));

    let matrix =
        |w: &mut GgufWriter, rng: &mut Rng, name: &str, rows: usize, cols: usize, scale: f32| {
            let x = rng.vec(rows * cols, scale);
            let data = gguf::quant::quantize(ty, &x).unwrap_or_else(|e| {
                panic!("tiny_llama: cannot encode {name} ({rows}x{cols}): {e}")
            });
            w.add_tensor(name, ty, &[cols as u64, rows as u64], data)
                .unwrap_or_else(|e| panic!("tiny_llama: {e}"));
        };
    let norm = |w: &mut GgufWriter, rng: &mut Rng, name: &str, n: usize| {
        let x: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
        let data = gguf::quant::quantize_f32(&x);
        w.add_tensor(name, GgmlType::F32, &[n as u64], data)
            .unwrap_or_else(|e| panic!("tiny_llama: {e}"));
    };
    let s_dim = 1.0 / (dim as f32).sqrt();
    let s_hidden = 1.0 / (hidden_dim as f32).sqrt();
    matrix(&mut w, &mut rng, "token_embd.weight", vocab, dim, 1.0);
    for l in 0..n_layers {
        let b = |n: &str| format!("blk.{l}.{n}");
        norm(&mut w, &mut rng, &b("attn_norm.weight"), dim);
        matrix(&mut w, &mut rng, &b("attn_q.weight"), dim, dim, 2.0 * s_dim);
        matrix(
            &mut w,
            &mut rng,
            &b("attn_k.weight"),
            kv_dim,
            dim,
            2.0 * s_dim,
        );
        matrix(&mut w, &mut rng, &b("attn_v.weight"), kv_dim, dim, s_dim);
        matrix(&mut w, &mut rng, &b("attn_output.weight"), dim, dim, s_dim);
        norm(&mut w, &mut rng, &b("ffn_norm.weight"), dim);
        matrix(
            &mut w,
            &mut rng,
            &b("ffn_gate.weight"),
            hidden_dim,
            dim,
            s_dim,
        );
        matrix(
            &mut w,
            &mut rng,
            &b("ffn_up.weight"),
            hidden_dim,
            dim,
            s_dim,
        );
        matrix(
            &mut w,
            &mut rng,
            &b("ffn_down.weight"),
            dim,
            hidden_dim,
            s_hidden,
        );
    }
    norm(&mut w, &mut rng, "output_norm.weight", dim);
    matrix(&mut w, &mut rng, "output.weight", vocab, dim, 2.0 * s_dim);
    w.to_bytes()
}
