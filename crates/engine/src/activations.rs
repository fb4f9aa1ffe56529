//! Activation buffers and the KV cache (llama2.c's `RunState`), allocated once at load.
//! Every size is checked arithmetic over the model's hyper-parameters and the context
//! length (both come from a file or a flag): an overflow is an error naming the context
//! length, never a wrapped size that a shader then writes past.

use std::sync::Arc;

use arch::Config;
use vk::{Buffer, BufferDesc, MemLocation};

use crate::graph::GraphShape;
use crate::kernels;
use crate::EngineError;

/// Activation buffers (f32) and the KV cache (f16: [`kernels::KV_BYTES`]). `B` is the
/// batch capacity
/// ([`crate::session::Session::prefill_chunk`]), `C` the context length.
pub struct Activations {
    /// [B][dim] the residual stream
    pub x: Buffer,
    /// [B][dim] x ∘ g for the next rmsnorm weight g (written with x; see matmul.glsl)
    pub xg: Buffer,
    /// [B][n_heads·head_dim] queries after rope
    pub q: Buffer,
    /// [B][n_heads·head_dim] attention output (input of attn_output)
    pub att_out: Buffer,
    /// [B][hidden_dim] silu(gate)·up (input of ffn_down)
    pub hb: Buffer,
    /// [B][(n_heads + 2·n_kv_heads)·head_dim] q, k, v before heads.comp (16 bytes when
    /// the q/k/v epilogue is fused: [`GraphShape::fused_qkv`])
    pub qkv: Buffer,
    /// [B][dim] an attention or FFN output before post_norm.comp (16 bytes without
    /// post-norms)
    pub y: Buffer,
    /// [2][128] f32 the RoPE frequency tables of heads.comp (global, sliding-window
    /// layers: `graph::rope_tables`), written at load
    pub rope: Buffer,
    /// per layer: [C][kv_dim] keys after rope
    pub key_cache: Vec<Buffer>,
    /// per layer: [C][kv_dim] values
    pub value_cache: Vec<Buffer>,
    /// [H][vocab] logits: of the last token (row 0), or of every token of a batched
    /// decode step's head (one row per slot, H = `head_rows`) (host-readable)
    pub logits: Buffer,
    /// [max(4, H)] u32: argmax of each logits row, with the non-finite flag (host-readable)
    pub result: Buffer,
    /// StepHeader, [128] f32 rope frequencies, then [STEP_MAX_BATCH] u32 each of token
    /// ids, positions and cache rows (host-written)
    pub step: Buffer,
    /// [n_layers][B][dim] the residual after every layer, for observers (host-readable)
    pub layer_dump: Buffer,
    /// 16 bytes bound to kernel slots a dispatch does not use
    pub dummy: Buffer,
    /// Batch capacity B.
    pub max_batch: usize,
}

/// The byte sizes of the activation buffers and the KV cache, computed with checked arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivationSizes {
    /// Each of x, xg.
    pub x: u64,
    /// Each of q, att_out.
    pub q: u64,
    pub hb: u64,
    /// The q/k/v scratch row (16 when fused).
    pub qkv: u64,
    /// The block-output scratch row (16 without post-norms).
    pub y: u64,
    /// Each cache of each layer.
    pub kv: u64,
    pub logits: u64,
    pub step: u64,
    pub layer_dump: u64,
    /// Everything together.
    pub total: u64,
}

impl ActivationSizes {
    /// The sizes for `cfg` with a context of `ctx_len` positions and batches of up to
    /// `max_batch` tokens, or [`EngineError::ContextTooLarge`] when one overflows 64 bits.
    pub fn new(
        cfg: &Config,
        ctx_len: usize,
        max_batch: usize,
    ) -> Result<ActivationSizes, EngineError> {
        let too_large = |what: &str| EngineError::ContextTooLarge {
            ctx_len,
            why: format!("the size of {what} overflows 64 bits"),
        };
        let mul = |what: &str, fs: &[u64]| {
            fs.iter()
                .try_fold(1u64, |a, &b| a.checked_mul(b))
                .ok_or_else(|| too_large(what))
        };
        let (f, b) = (4u64, max_batch as u64);
        let q_dim = mul("q", &[cfg.n_heads as u64, cfg.head_dim as u64])?;
        let x = mul("x", &[b, cfg.dim as u64, f])?;
        let q = mul("q", &[b, q_dim, f])?;
        let hb = mul("hb", &[b, cfg.hidden_dim as u64, f])?;
        let shape = GraphShape::of(cfg);
        let qkv = if shape.fused_qkv {
            16
        } else {
            let heads = (cfg.n_heads as u64)
                .checked_add(2 * cfg.n_kv_heads as u64)
                .ok_or_else(|| too_large("the q/k/v row"))?;
            mul("the q/k/v row", &[b, heads, cfg.head_dim as u64, f])?
        };
        let y = if shape.post_norms { x } else { 16 };
        let kv = cfg
            .kv_layer_bytes(ctx_len as u64)
            .ok_or_else(|| too_large("the KV cache"))?;
        let logits = mul("the logits", &[cfg.vocab_size as u64, f])?;
        if max_batch > kernels::STEP_MAX_BATCH {
            return Err(too_large("a batch larger than the step buffer's"));
        }
        let step = kernels::STEP_BYTES;
        let layer_dump = mul(
            "the layer dump",
            &[cfg.n_layers as u64, b, cfg.dim as u64, f],
        )?;
        let caches = mul("the KV cache", &[kv, 2, cfg.n_layers as u64])?;
        let rope = 2 * kernels::STEP_FREQS_MAX as u64 * f;
        let total = [
            2 * x,
            2 * q,
            hb,
            qkv,
            y,
            rope,
            caches,
            logits,
            step,
            layer_dump,
        ]
        .iter()
        .try_fold(0u64, |a, &v| a.checked_add(v))
        .ok_or_else(|| too_large("the activations"))?;
        Ok(ActivationSizes {
            x,
            q,
            hb,
            qkv,
            y,
            kv,
            logits,
            step,
            layer_dump,
            total,
        })
    }
}

impl Activations {
    pub fn new(
        ctx: &Arc<vk::Context>,
        cfg: &Config,
        ctx_len: usize,
        max_batch: usize,
        head_rows: usize,
    ) -> Result<Activations, EngineError> {
        let sz = ActivationSizes::new(cfg, ctx_len, max_batch)?;
        let head_rows = head_rows.clamp(1, kernels::STEP_MAX_BATCH);
        let logits_bytes = sz.logits.checked_mul(head_rows as u64).ok_or_else(|| {
            EngineError::ContextTooLarge {
                ctx_len,
                why: format!("{head_rows} rows of logits overflow 64 bits"),
            }
        })?;
        let buf = |name: &str, bytes: u64, loc: MemLocation| {
            Buffer::new(ctx, &BufferDesc::storage(name, bytes.max(16), loc))
        };
        let mut key_cache = Vec::with_capacity(cfg.n_layers);
        let mut value_cache = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            key_cache.push(buf(&format!("key_cache.{l}"), sz.kv, MemLocation::GpuOnly)?);
            value_cache.push(buf(
                &format!("value_cache.{l}"),
                sz.kv,
                MemLocation::GpuOnly,
            )?);
        }
        Ok(Activations {
            x: buf("x", sz.x, MemLocation::GpuOnly)?,
            xg: buf("xg", sz.x, MemLocation::GpuOnly)?,
            q: buf("q", sz.q, MemLocation::GpuOnly)?,
            att_out: buf("att_out", sz.q, MemLocation::GpuOnly)?,
            hb: buf("hb", sz.hb, MemLocation::GpuOnly)?,
            qkv: buf("qkv", sz.qkv, MemLocation::GpuOnly)?,
            y: buf("y", sz.y, MemLocation::GpuOnly)?,
            rope: buf(
                "rope",
                2 * kernels::STEP_FREQS_MAX as u64 * 4,
                MemLocation::CpuToGpu,
            )?,
            key_cache,
            value_cache,
            logits: buf("logits", logits_bytes, MemLocation::GpuToCpu)?,
            result: buf("result", 4 * head_rows as u64, MemLocation::GpuToCpu)?,
            step: buf("step", sz.step, MemLocation::CpuToGpu)?,
            layer_dump: buf("layer_dump", sz.layer_dump, MemLocation::GpuToCpu)?,
            dummy: buf("dummy", 16, MemLocation::GpuOnly)?,
            max_batch,
        })
    }

    /// Buffers allocated.
    pub fn count(&self) -> u64 {
        15 + 2 * self.key_cache.len() as u64
    }
}
