//! Tiny random models written with the project's own GGUF writer, shared with the GPU
//! tests (a 2-layer, dim-64 model is enough to test the whole forward pass), for every
//! family the model description knows: llama (and Llama 3's `rope_freqs`), qwen2, qwen3,
//! gemma3.
//!
//! Weights come from a seeded SplitMix64 generator (no dependency, stable across
//! versions), so a seed names one model forever.

use arch::{Arch, LayerTensor, ModelTensor};
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

/// The shape and features of a tiny random model ([`tiny_model`]).
#[derive(Clone, Debug)]
pub struct TinySpec {
    pub arch: Arch,
    pub seed: u64,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// `None`: `dim / n_heads`; `Some`: written as `attention.key_length` and
    /// `value_length` (gemma3's 256 with dim 640).
    pub head_dim: Option<usize>,
    pub hidden_dim: usize,
    pub vocab: usize,
    /// Type of every 2-D weight: any type `gguf::quant::quantize` writes (F32, F16, Q8_0,
    /// Q4_0, Q4_1, Q5_0, Q5_1).
    pub ty: GgmlType,
    /// No `output.weight` (logits from `token_embd.weight`).
    pub tied: bool,
    /// `(window, period)`: `attention.sliding_window` and `sliding_window_pattern`
    /// (families that read them: gemma3), with `rope.freq_base_swa` 10000 beside the
    /// global base 1e6.
    pub sliding_window: Option<(usize, usize)>,
    /// Write `rope_freqs.weight` (llama: Llama 3's frequency divisors, 1 for the highest
    /// frequencies rising to 8 for the lowest).
    pub rope_freqs: bool,
    /// `final_logit_softcapping` (gemma3).
    pub softcap: Option<f32>,
}

impl TinySpec {
    /// 2 layers, dim 64, 4 heads over 2 kv heads, hidden 128, vocab 320, untied, no extras.
    pub fn new(arch: Arch, seed: u64, ty: GgmlType) -> TinySpec {
        TinySpec {
            arch,
            seed,
            n_layers: 2,
            dim: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: None,
            hidden_dim: 128,
            vocab: 320,
            ty,
            tied: false,
            sliding_window: None,
            rope_freqs: false,
            softcap: None,
        }
    }
}

/// qwen2: q/k/v biases (random, not zero), NeoX RoPE.
pub fn tiny_qwen2(seed: u64, ty: GgmlType) -> Vec<u8> {
    tiny_model(&TinySpec::new(Arch::Qwen2, seed, ty))
}

/// qwen3: per-head Q/K norms, head_dim 32 (q_dim 128 ≠ dim 64), tied output.
pub fn tiny_qwen3(seed: u64, ty: GgmlType) -> Vec<u8> {
    tiny_model(&TinySpec {
        head_dim: Some(32),
        tied: true,
        ..TinySpec::new(Arch::Qwen3, seed, ty)
    })
}

/// gemma3: 3 layers (0 and 1 sliding-window with `window` positions, 2 global), 2 heads
/// over 1 kv head of 64 (q_dim 128 ≠ dim 64), Q/K norms, post-norms, GELU gating, tied
/// output, logit softcap 30.
pub fn tiny_gemma3(seed: u64, ty: GgmlType, window: usize) -> Vec<u8> {
    tiny_model(&TinySpec {
        n_layers: 3,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: Some(64),
        tied: true,
        sliding_window: Some((window, 3)),
        softcap: Some(30.0),
        ..TinySpec::new(Arch::Gemma3, seed, ty)
    })
}

/// llama with Llama 3's `rope_freqs.weight`.
pub fn tiny_llama3(seed: u64, ty: GgmlType) -> Vec<u8> {
    tiny_model(&TinySpec {
        rope_freqs: true,
        ..TinySpec::new(Arch::Llama, seed, ty)
    })
}

/// A random llama-architecture GGUF (seeded): [`tiny_model`] with an untied output and
/// no extras.
///
/// # Panics
/// As [`tiny_model`].
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
    tiny_model(&TinySpec {
        n_layers,
        dim,
        n_heads,
        n_kv_heads,
        hidden_dim,
        vocab,
        ..TinySpec::new(Arch::Llama, seed, ty)
    })
}

/// A random GGUF of any family the model description knows (seeded): 2-D weights of type
/// `spec.ty`, F32 norms (around 1) and biases, the tensors [`arch::Config`] expects for
/// the family and features, and a minimal gpt2 tokenizer (ids 0-2 `<|endoftext|>`,
/// `<|im_start|>` (bos), `<|im_end|>` (eos), then the 256 byte tokens, then `tok<N>`
/// fillers; no merges). Context length 256.
///
/// # Panics
/// When `ty` is not one of the types above, when `dim`, `hidden_dim` or `q_dim` is not a
/// multiple of its block size, when the head dimension is odd or `n_heads` does not split
/// `dim` (without `head_dim`), or when `n_kv_heads` does not divide `n_heads`: these are
/// mistakes in a test, which should fail loudly.
pub fn tiny_model(spec: &TinySpec) -> Vec<u8> {
    let TinySpec {
        arch,
        seed,
        n_layers,
        dim,
        n_heads,
        n_kv_heads,
        hidden_dim,
        vocab,
        ty,
        ..
    } = *spec;
    let head_dim = match spec.head_dim {
        Some(hd) => hd,
        None => {
            assert!(
                n_heads > 0 && dim.is_multiple_of(n_heads),
                "tiny_model: {n_heads} heads must split dim {dim}"
            );
            dim / n_heads
        }
    };
    assert!(
        head_dim > 0 && head_dim.is_multiple_of(2),
        "tiny_model: head dim {head_dim} must be even"
    );
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "tiny_model: {n_kv_heads} kv heads must divide {n_heads} heads"
    );
    let q_dim = n_heads * head_dim;
    let kv_dim = n_kv_heads * head_dim;
    let mut rng = Rng::new(seed);
    let mut w = GgufWriter::new(32);

    let p = arch.name();
    let u32v = |v: usize| Value::U32(v as u32);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(p.into())),
        (
            "general.name".into(),
            Value::String(format!("tiny-{p}-{seed}")),
        ),
        (format!("{p}.block_count"), u32v(n_layers)),
        (format!("{p}.context_length"), u32v(256)),
        (format!("{p}.embedding_length"), u32v(dim)),
        (format!("{p}.feed_forward_length"), u32v(hidden_dim)),
        (format!("{p}.attention.head_count"), u32v(n_heads)),
        (format!("{p}.attention.head_count_kv"), u32v(n_kv_heads)),
        (
            format!("{p}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
    ];
    if spec.sliding_window.is_some() {
        meta.push((format!("{p}.rope.freq_base"), Value::F32(1_000_000.0)));
    } else {
        meta.push((format!("{p}.rope.freq_base"), Value::F32(10_000.0)));
    }
    meta.push((format!("{p}.rope.dimension_count"), u32v(head_dim)));
    if spec.head_dim.is_some() {
        meta.push((format!("{p}.attention.key_length"), u32v(head_dim)));
        meta.push((format!("{p}.attention.value_length"), u32v(head_dim)));
    }
    if let Some((window, period)) = spec.sliding_window {
        meta.push((format!("{p}.attention.sliding_window"), u32v(window)));
        meta.push((
            format!("{p}.attention.sliding_window_pattern"),
            u32v(period),
        ));
        meta.push((format!("{p}.rope.freq_base_swa"), Value::F32(10_000.0)));
    }
    if let Some(c) = spec.softcap {
        meta.push((format!("{p}.final_logit_softcapping"), Value::F32(c)));
    }
    meta.push((format!("{p}.vocab_size"), u32v(vocab)));
    meta.push(("tokenizer.ggml.model".into(), Value::String("gpt2".into())));
    meta.push(("tokenizer.ggml.pre".into(), Value::String("gpt2".into())));
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
                panic!("tiny_model: cannot encode {name} ({rows}x{cols}): {e}")
            });
            w.add_tensor(name, ty, &[cols as u64, rows as u64], data)
                .unwrap_or_else(|e| panic!("tiny_model: {e}"));
        };
    let f32_vector = |w: &mut GgufWriter, name: &str, x: &[f32]| {
        w.add_tensor(
            name,
            GgmlType::F32,
            &[x.len() as u64],
            gguf::quant::quantize_f32(x),
        )
        .unwrap_or_else(|e| panic!("tiny_model: {e}"));
    };
    let norm = |w: &mut GgufWriter, rng: &mut Rng, name: &str, n: usize| {
        let x: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
        f32_vector(w, name, &x);
    };
    let s_dim = 1.0 / (dim as f32).sqrt();
    let s_q = 1.0 / (q_dim as f32).sqrt();
    let s_hidden = 1.0 / (hidden_dim as f32).sqrt();
    matrix(
        &mut w,
        &mut rng,
        ModelTensor::TokenEmbd.name(),
        vocab,
        dim,
        1.0,
    );
    if spec.rope_freqs {
        // Llama 3's shape: 1 for the fast half of the frequencies, rising to 8.
        let half = head_dim / 2;
        let f: Vec<f32> = (0..half)
            .map(|i| 1.0 + 7.0 * (i as f32 / (half - 1).max(1) as f32).powi(2))
            .collect();
        f32_vector(&mut w, ModelTensor::RopeFreqs.name(), &f);
    }
    for l in 0..n_layers {
        for t in LayerTensor::ALL.into_iter().filter(|&t| arch.has_layer(t)) {
            use LayerTensor::*;
            let (w, rng, name) = (&mut w, &mut rng, &t.name(l));
            match t {
                AttnNorm | PostAttnNorm | FfnNorm | PostFfwNorm => norm(w, rng, name, dim),
                AttnQNorm | AttnKNorm => norm(w, rng, name, head_dim),
                AttnQ => matrix(w, rng, name, q_dim, dim, 2.0 * s_dim),
                AttnK => matrix(w, rng, name, kv_dim, dim, 2.0 * s_dim),
                AttnV => matrix(w, rng, name, kv_dim, dim, s_dim),
                AttnQBias | AttnKBias | AttnVBias => {
                    let len = if t == AttnQBias { q_dim } else { kv_dim };
                    let x = rng.vec(len, 0.5);
                    f32_vector(w, name, &x);
                }
                AttnOutput => matrix(w, rng, name, dim, q_dim, s_q),
                FfnGate | FfnUp => matrix(w, rng, name, hidden_dim, dim, s_dim),
                FfnDown => matrix(w, rng, name, dim, hidden_dim, s_hidden),
            }
        }
    }
    norm(&mut w, &mut rng, ModelTensor::OutputNorm.name(), dim);
    if !spec.tied {
        let name = ModelTensor::Output.name();
        matrix(&mut w, &mut rng, name, vocab, dim, 2.0 * s_dim);
    }
    w.to_bytes()
}
