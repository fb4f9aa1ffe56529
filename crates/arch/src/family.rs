//! The decoder families vkdecode knows, and what each one's graph does differently.
//!
//! Everything here was read from llama.cpp's graph builders (`src/models/*.cpp` at
//! d775b8967) and its converter (`conversion/*.py`), which decides what is already baked
//! into a GGUF file's weights. [`crate::Config`] turns these per-family answers into plain
//! fields, so engine and reference read fields and never match on the family themselves.

/// Which elements of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// llama ("normal"): pairs `(x[2i], x[2i+1])`. GGUF's llama Q/K weights are stored
    /// permuted so that adjacent pairs are the rotated ones.
    Normal,
    /// GPT-NeoX style (qwen2, qwen3, gemma3): pairs `(x[i], x[i + head_dim/2])`.
    Neox,
}

/// The gated feed-forward's activation: `down(act(gate(x)) · up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU: `silu(g) = g / (1 + e^-g)` (llama, qwen2, qwen3).
    Silu,
    /// GeGLU with the tanh approximation of GELU:
    /// `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))` (gemma3; ggml's `ggml_gelu`).
    GeluTanh,
}

/// The decoder families vkdecode knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2, Llama 2/3, ...): normal RoPE, no q/k/v biases; Llama 3's
    /// long-context files add `rope_freqs.weight` (per-frequency divisors).
    Llama,
    /// `qwen2`: q/k/v biases and NeoX RoPE.
    Qwen2,
    /// `qwen3`: NeoX RoPE, no biases, an RMS norm over each head of Q and of K (after
    /// the projection, before RoPE) with weights `attn_q_norm`/`attn_k_norm` `[head_dim]`.
    Qwen3,
    /// `gemma3`: the embedding row scaled by √dim; per-head Q/K norms; post-attention
    /// and post-FFN norms applied to each sub-block's output before the residual add;
    /// GELU-tanh gating; every sixth layer global, the others sliding-window with their
    /// own RoPE base; optional final logit softcapping; NeoX RoPE.
    Gemma3,
}

/// Every family, for error messages and tests.
pub const ALL_ARCHS: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

impl Arch {
    /// The `general.architecture` string and metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// The family named by `general.architecture`, if vkdecode knows it.
    pub fn from_name(name: &str) -> Option<Arch> {
        ALL_ARCHS.into_iter().find(|a| a.name() == name)
    }

    /// `llama_model_rope_type` in llama.cpp: only llama pairs adjacent dimensions.
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Arch::Llama => RopeMode::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => RopeMode::Neox,
        }
    }

    /// Whether `blk.N.attn_{q,k,v}.bias` exist (and are added after the projections).
    pub fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }

    /// Whether each head of Q and K goes through an RMS norm (`blk.N.attn_q_norm.weight`,
    /// `blk.N.attn_k_norm.weight`, `[head_dim]`) before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }

    /// Whether the attention and FFN outputs are RMS-normed (`blk.N.post_attention_norm`,
    /// `blk.N.post_ffw_norm`, `[dim]`) before being added to the residual stream.
    pub fn post_norms(self) -> bool {
        self == Arch::Gemma3
    }

    pub fn ffn_act(self) -> FfnAct {
        match self {
            Arch::Gemma3 => FfnAct::GeluTanh,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => FfnAct::Silu,
        }
    }

    /// Whether the embedding row is multiplied by √dim before the first layer.
    pub fn scales_embedding(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether the file may describe sliding-window layers
    /// (`<arch>.attention.sliding_window`); the other families ignore the key, as
    /// llama.cpp does.
    pub fn has_sliding_window(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether the file may ask for final logit softcapping
    /// (`<arch>.final_logit_softcapping`): `logits = c·tanh(logits/c)`.
    pub fn has_logit_softcap(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether `rope_freqs.weight` (`[head_dim/2]`, RoPE frequency divisors) is read when
    /// present (Llama 3.1+ files).
    pub fn has_rope_freqs(self) -> bool {
        self == Arch::Llama
    }
}
