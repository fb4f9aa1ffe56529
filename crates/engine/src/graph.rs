//! Which form each step of a model's graph takes on the GPU, decided once from its
//! [`Config`] and read by the activations (which scratch buffers exist), the model (which
//! dispatches are bound) and the session (which RoPE tables are written).
//!
//! The llama graph is fused (model/layer.rs): rmsnorm folded into the matmul inputs, RoPE and the
//! KV-cache writes in the q/k/v epilogue, residual adds in the output epilogues. The other
//! families add steps as kernels of their own rather than branches in those epilogues:
//! - q/k/v biases, per-head Q/K norms, neox RoPE, or a layer whose RoPE differs from the
//!   global one: a plain q/k/v matmul into a scratch row, then `heads.comp`;
//! - post-attention and post-FFN norms: the output matmuls store into a scratch row and
//!   `post_norm.comp` adds the normed block output to the residual;
//! - GELU gating: the `geglu` epilogue of the gate/up matmul;
//! - the final logit softcap: `softcap.comp` after the logits.

use arch::{Config, FfnAct, RopeMode};

use crate::kernels::STEP_FREQS_MAX;

/// The form of each step of one model's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphShape {
    /// RoPE and the KV-cache writes in the q/k/v matmul's epilogue (llama); else a plain
    /// q/k/v matmul and `heads.comp`. The epilogue rotates and stores rows (2i, 2i+1)
    /// together, so a neox model (pairs i, i + head_dim/2) takes heads.comp.
    pub fused_qkv: bool,
    /// The attention and FFN outputs are RMS-normed before the residual add.
    pub post_norms: bool,
    /// GELU(tanh) gating instead of SiLU.
    pub gelu: bool,
}

impl GraphShape {
    pub fn of(cfg: &Config) -> GraphShape {
        let global_rope = (0..cfg.n_layers).all(|l| rope_table(cfg, l) == 0);
        GraphShape {
            fused_qkv: !cfg.qkv_bias
                && !cfg.qk_norm
                && global_rope
                && cfg.rope_mode == RopeMode::Normal,
            post_norms: cfg.post_norms,
            gelu: cfg.ffn_act == FfnAct::GeluTanh,
        }
    }
}

/// The RoPE frequency table layer `l` rotates with: 0 for the global layers, 1 for the
/// sliding-window layers (their own base, no scaling: `Config::layer_attention`).
pub fn rope_table(cfg: &Config, l: usize) -> usize {
    let la = cfg.layer_attention(l);
    if la.rope_base == cfg.rope_base && la.rope_scale == cfg.rope_scale {
        0
    } else {
        1
    }
}

/// The two RoPE frequency tables, `STEP_FREQS_MAX` entries each (zero past
/// `head_dim/2`): table `t` holds the frequencies of the layers [`rope_table`] gives `t`,
/// with the linear scale and the per-frequency divisors (`rope_freqs.weight`, Llama 3)
/// folded in, so that a kernel's angle is `pos · table[i]`.
pub fn rope_tables(cfg: &Config, factors: Option<&[f32]>) -> Vec<f32> {
    let mut out = vec![0.0f32; 2 * STEP_FREQS_MAX];
    for t in 0..2 {
        let l = (0..cfg.n_layers).find(|&l| rope_table(cfg, l) == t);
        let (base, scale) = match l {
            Some(l) => {
                let la = cfg.layer_attention(l);
                (la.rope_base, la.rope_scale)
            }
            None => (cfg.rope_base, cfg.rope_scale),
        };
        let f = crate::kernels::rope_freqs_ext(base, scale, factors, cfg.head_dim);
        let n = f.len().min(STEP_FREQS_MAX);
        out[t * STEP_FREQS_MAX..t * STEP_FREQS_MAX + n].copy_from_slice(&f[..n]);
    }
    out
}
