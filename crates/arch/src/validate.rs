//! Refuses hyper-parameters that parse but mean nothing (a negative RMS epsilon or a
//! zero RoPE base gave NaN logits, a context length of 2^58 made the K/V cache size wrap
//! to a few bytes), or on which the GPU and the CPU reference disagree (a gemma3
//! `rope.freq_base_swa` of 1e-30 gave logits 40.8 apart), and sizes that follow from a
//! valid config with checked arithmetic.
//!
//! The float ranges are where the GPU (lavapipe) and the reference agree within the
//! model tests' tolerance on every family's tiny model, for values from -1 through
//! subnormals to `f32::MAX` (engine tests/hyperparams.rs): a RoPE base (global or
//! sliding-window) of at least 1 (from 1e-6 down, rotation angles of many turns differ
//! between the GPU's and libm's sin/cos); a RoPE scaling factor of at least 1, i.e. a
//! position scale of at most 1 (1e-6 and below disagree the same way); a final logit
//! softcap of at most [`MAX_LOGIT_SOFTCAP`] (1e6 gave 5.72 against 5.69: the GPU's tanh
//! of a tiny argument, multiplied back by the cap). Every released model is inside.
//!
//! The context bound: a context length is at most [`MAX_CONTEXT_LENGTH`] (2^24 = 16.7M
//! positions, above any released model's), and with it the largest per-context buffer,
//! `2 · n_layers · context_length · max(dim, q_dim, kv_dim, hidden_dim) · 8` bytes, must
//! fit both `u64` and `usize`. Every size the engine and the reference derive from the
//! context (K/V cache `2 · n_layers · ctx · kv_dim · 2`, attention scores
//! `n_heads · ctx · 4`, activations `ctx · dim · 4`) is below that, so it cannot
//! overflow; whether it fits the memory at hand is the caller's check.

use crate::{Config, ConfigError, ModelTensor};

/// Bytes of one key or value element in the K/V cache: f16, llama.cpp's default cache
/// type, in the engine and the CPU reference alike.
pub const KV_ELEMENT_BYTES: u64 = 2;

/// The largest `context_length` accepted from a file.
pub const MAX_CONTEXT_LENGTH: usize = 1 << 24;

/// The largest `rms_eps` accepted: real models use 1e-5 or 1e-6; anything near 1 or
/// above swamps the activations it normalises.
pub const MAX_RMS_EPS: f32 = 1.0;

/// The smallest RoPE linear scaling factor accepted (0 means none): below 1 positions
/// are stretched instead of compressed, and far below it the angles run away.
pub const MIN_ROPE_SCALING_FACTOR: f32 = 1.0;

/// The largest `final_logit_softcapping` accepted: Gemma 2 uses 30; from 1e6 up the
/// GPU's `c·tanh(x/c)` drifts from the reference's.
pub const MAX_LOGIT_SOFTCAP: f32 = 1000.0;

fn bad(key: String, reason: String) -> ConfigError {
    ConfigError::BadMetadata { key, reason }
}

/// Checks a config built by [`Config::from_gguf`]; errors name the key and the value.
pub(crate) fn validate(cfg: &Config) -> Result<(), ConfigError> {
    let p = cfg.arch.name();
    let key = |k: &str| format!("{p}.{k}");

    let eps = cfg.rms_eps;
    if !(eps.is_finite() && eps > 0.0 && eps <= MAX_RMS_EPS) {
        return Err(bad(
            key("attention.layer_norm_rms_epsilon"),
            format!("{eps} must be a finite number in (0, {MAX_RMS_EPS}]"),
        ));
    }
    let base = cfg.rope_base;
    if !(base.is_finite() && base >= 1.0) {
        // Below 1 the rotation frequencies base^(-2i/d) grow with i and, for tiny bases,
        // overflow to infinity.
        return Err(bad(
            key("rope.freq_base"),
            format!("{base} must be a finite number of at least 1"),
        ));
    }
    if let Some(sw) = &cfg.sliding_window {
        let base = sw.rope_base;
        if !(base.is_finite() && base >= 1.0) {
            return Err(bad(
                key("rope.freq_base_swa"),
                format!("{base} must be a finite number of at least 1"),
            ));
        }
    }
    if let Some(c) = cfg.final_logit_softcap {
        if !(c.is_finite() && c > 0.0 && c <= MAX_LOGIT_SOFTCAP) {
            return Err(bad(
                key("final_logit_softcapping"),
                format!("{c} must be in (0, {MAX_LOGIT_SOFTCAP}] (or 0: off)"),
            ));
        }
    }
    let scale = cfg.rope_scale;
    if !(scale.is_finite() && scale > 0.0 && scale <= 1.0) {
        // rope_scale is 1/factor: the factor's own check names its key (config.rs)
        return Err(bad(
            key("rope.scaling.factor"),
            format!("a position scale of {scale} must be in (0, 1]"),
        ));
    }
    if cfg.hidden_dim == 0 {
        return Err(bad(key("feed_forward_length"), "0 must be positive".into()));
    }
    if cfg.vocab_size == 0 || u32::try_from(cfg.vocab_size).is_err() {
        return Err(ConfigError::TensorShape {
            name: ModelTensor::TokenEmbd.name().into(),
            expected: format!("[{}, n_vocab] with 1 <= n_vocab <= 2^32-1", cfg.dim),
            found: vec![cfg.dim as u64, cfg.vocab_size as u64],
        });
    }
    let ctx = cfg.context_length;
    if ctx == 0 || ctx > MAX_CONTEXT_LENGTH {
        return Err(bad(
            key("context_length"),
            format!("{ctx} must be between 1 and {MAX_CONTEXT_LENGTH}"),
        ));
    }
    if cfg.largest_context_bytes(ctx).is_none() {
        return Err(bad(
            key("context_length"),
            format!(
                "{ctx} positions of {} layers x {} wide overflow the size arithmetic",
                cfg.n_layers,
                cfg.widest()
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// The widest per-position vector: max of dim, q_dim, kv_dim and hidden_dim (checked).
    fn widest(&self) -> u64 {
        let q = (self.n_heads as u64).checked_mul(self.head_dim as u64);
        let kv = (self.n_kv_heads as u64).checked_mul(self.head_dim as u64);
        match (q, kv) {
            (Some(q), Some(kv)) => q.max(kv).max(self.dim as u64).max(self.hidden_dim as u64),
            _ => u64::MAX,
        }
    }

    /// `2 · n_layers · ctx_len · widest · 8` bytes if that fits `u64` and `usize`: the
    /// bound under which every per-context size is computed.
    fn largest_context_bytes(&self, ctx_len: usize) -> Option<u64> {
        [self.n_layers as u64, ctx_len as u64, self.widest(), 8]
            .into_iter()
            .try_fold(2u64, u64::checked_mul)
            .filter(|&b| usize::try_from(b).is_ok())
    }

    /// Bytes of one layer's key (or value) cache for `ctx_len` positions,
    /// `ctx_len · kv_dim · KV_ELEMENT_BYTES`, or `None` if it overflows `u64`.
    pub fn kv_layer_bytes(&self, ctx_len: u64) -> Option<u64> {
        ctx_len
            .checked_mul(self.kv_dim() as u64)?
            .checked_mul(KV_ELEMENT_BYTES)
    }

    /// Bytes of the whole K/V cache for `ctx_len` positions (keys and values of every
    /// layer, `2 · n_layers · kv_layer_bytes`), or `None` if it overflows `u64`/`usize`.
    pub fn kv_cache_bytes(&self, ctx_len: u64) -> Option<u64> {
        (2 * self.n_layers as u64)
            .checked_mul(self.kv_layer_bytes(ctx_len)?)
            .filter(|&b| usize::try_from(b).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, FfnAct, RopeMode, SlidingWindow};

    fn smollm() -> Config {
        Config {
            arch: Arch::Llama,
            n_layers: 30,
            dim: 576,
            hidden_dim: 1536,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            context_length: 8192,
            rms_eps: 1e-5,
            rope_base: 100_000.0,
            rope_scale: 1.0,
            rope_mode: RopeMode::Normal,
            rope_freqs: false,
            tied_output: true,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            ffn_act: FfnAct::Silu,
            embd_scale: 1.0,
            attn_scale: 0.125,
            final_logit_softcap: None,
            sliding_window: None,
        }
    }

    fn reason(c: &Config) -> String {
        validate(c).unwrap_err().to_string()
    }

    #[test]
    fn a_real_config_passes_and_sizes_its_cache() {
        let c = smollm();
        validate(&c).unwrap();
        // 2 x 30 layers x 8192 x 192 x 2 bytes.
        assert_eq!(c.kv_cache_bytes(8192), Some(188_743_680));
        assert_eq!(c.kv_layer_bytes(8192), Some(188_743_680 / 60));
        assert_eq!(c.kv_cache_bytes(u64::MAX), None);
        assert_eq!(c.kv_cache_bytes(1 << 58), None);
    }

    #[test]
    fn meaningless_values_are_refused_naming_key_and_value() {
        for eps in [0.0, -1.0, f32::NAN, f32::INFINITY, 2.0] {
            let c = Config {
                rms_eps: eps,
                ..smollm()
            };
            let r = reason(&c);
            assert!(
                r.contains("llama.attention.layer_norm_rms_epsilon")
                    && r.contains(&eps.to_string()),
                "{r}"
            );
        }
        for base in [0.0, -10_000.0, 0.5, f32::NAN, f32::NEG_INFINITY] {
            let c = Config {
                rope_base: base,
                ..smollm()
            };
            let r = reason(&c);
            assert!(
                r.contains("llama.rope.freq_base") && r.contains(&base.to_string()),
                "{r}"
            );
        }
        for ctx in [0, MAX_CONTEXT_LENGTH + 1, 1 << 58, usize::MAX] {
            let c = Config {
                context_length: ctx,
                ..smollm()
            };
            let r = reason(&c);
            assert!(
                r.contains("llama.context_length") && r.contains(&ctx.to_string()),
                "{r}"
            );
        }
        let r = reason(&Config {
            vocab_size: 0,
            ..smollm()
        });
        assert!(r.contains("token_embd.weight"), "{r}");
        let r = reason(&Config {
            hidden_dim: 0,
            ..smollm()
        });
        assert!(r.contains("llama.feed_forward_length"), "{r}");
        // A context within the cap whose cache size overflows with absurd widths.
        let r = reason(&Config {
            head_dim: 1 << 40,
            ..smollm()
        });
        assert!(r.contains("overflow"), "{r}");
    }

    /// Where the GPU and the reference disagree (tests/hyperparams.rs in the engine), the
    /// value is refused naming its key.
    #[test]
    fn values_where_gpu_and_reference_disagree_are_refused() {
        let gemma = |base: f32, cap: Option<f32>| Config {
            arch: Arch::Gemma3,
            sliding_window: Some(SlidingWindow {
                window: 512,
                period: 6,
                rope_base: base,
            }),
            final_logit_softcap: cap,
            ..smollm()
        };
        validate(&gemma(10_000.0, Some(30.0))).unwrap();
        validate(&gemma(1.0, Some(MAX_LOGIT_SOFTCAP))).unwrap();
        for base in [0.5, 1e-30, 0.0, -1.0, f32::NAN, f32::INFINITY] {
            let r = reason(&gemma(base, None));
            assert!(
                r.contains("gemma3.rope.freq_base_swa") && r.contains(&base.to_string()),
                "{r}"
            );
        }
        for cap in [1e6, f32::MAX, -1.0, f32::NAN] {
            let r = reason(&gemma(10_000.0, Some(cap)));
            assert!(r.contains("gemma3.final_logit_softcapping"), "{r}");
        }
        for scale in [2.0, 1e30, 0.0, f32::NAN] {
            let r = reason(&Config {
                rope_scale: scale,
                ..smollm()
            });
            assert!(r.contains("llama.rope.scaling.factor"), "{r}");
        }
    }
}
