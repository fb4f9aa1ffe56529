//! The dispatches the families beyond llama add to the graph (see `graph.rs`): the
//! per-layer weights they read (biases, Q/K norms, post norms), and the bound calls of
//! `heads.comp`, `post_norm.comp` and `softcap.comp`.

use arch::{Config, LayerTensor, RopeMode};
use vk::{BufferBinding, DescriptorSet};

use super::{to_u32, vector};
use crate::activations::Activations;
use crate::graph;
use crate::kernels::{
    AttentionPush, HeadsPush, Kernels, PostNormPush, SoftcapBindings, SoftcapPush, HEADS_BIAS,
    HEADS_NEOX, HEADS_NORM, STEP_FREQS_MAX,
};
use crate::step::{self, LayerWeights};
use crate::EngineError;
use residency::Weights;

/// `heads.comp` bound for one layer.
pub struct HeadsCall {
    pub set: DescriptorSet,
    pub push: HeadsPush,
}

/// `post_norm.comp` bound for one residual add.
pub struct PostNormCall {
    pub set: DescriptorSet,
    pub push: PostNormPush,
}

/// `softcap.comp` bound to the logits.
pub struct SoftcapCall {
    pub set: DescriptorSet,
    pub push: SoftcapPush,
}

/// A norm or bias vector: (binding, float offset).
type Vector = (BufferBinding, u32);

/// Layer `l`'s optional vectors: q/k/v biases, per-head q/k norms, post norms.
#[allow(clippy::type_complexity)]
pub(super) fn layer_vectors(
    weights: &Weights,
    cfg: &Config,
    l: usize,
) -> Result<
    (
        Option<[Vector; 3]>,
        Option<[Vector; 2]>,
        Option<[Vector; 2]>,
    ),
    EngineError,
> {
    use LayerTensor::*;
    let v = |t: LayerTensor| vector(weights, &t.name(l), cfg.layer_shape(t)[0] as usize);
    let biases = if cfg.qkv_bias {
        Some([v(AttnQBias)?, v(AttnKBias)?, v(AttnVBias)?])
    } else {
        None
    };
    let qk_norms = if cfg.qk_norm {
        Some([v(AttnQNorm)?, v(AttnKNorm)?])
    } else {
        None
    };
    let post_norms = if cfg.post_norms {
        Some([v(PostAttnNorm)?, v(PostFfwNorm)?])
    } else {
        None
    };
    Ok((biases, qk_norms, post_norms))
}

/// attention.comp's push constants for layer `l`: its heads, score scale and window.
pub(super) fn attention_push(cfg: &Config, l: usize) -> Result<AttentionPush, EngineError> {
    Ok(AttentionPush {
        n_heads: to_u32(cfg.n_heads as u64, "heads")?,
        n_kv_heads: to_u32(cfg.n_kv_heads as u64, "kv heads")?,
        head_dim: to_u32(cfg.head_dim as u64, "head_dim")?,
        scale: cfg.attn_scale,
        // a window past 2^32 positions sees everything a cache can hold
        window: cfg
            .layer_attention(l)
            .window
            .map_or(0, |w| u32::try_from(w).unwrap_or(0)),
        t0: 0,
    })
}

/// `heads.comp` for layer `l` after a plain q/k/v matmul.
pub(super) fn heads_call(
    l: usize,
    cfg: &Config,
    w: &LayerWeights<'_>,
    acts: &Activations,
    kernels: &mut Kernels,
) -> Result<HeadsCall, EngineError> {
    let dummy = acts.dummy.binding();
    let bindings = step::heads(l, w, acts, &dummy);
    let set = kernels
        .heads()?
        .descriptor_set_with(&bindings.descriptors())?;
    let ofs = |v: &Option<[Vector; 3]>, i: usize| v.as_ref().map_or(0, |b| b[i].1);
    let nofs = |v: &Option<[Vector; 2]>, i: usize| v.as_ref().map_or(0, |b| b[i].1);
    let mut flags = 0;
    if w.biases.is_some() {
        flags |= HEADS_BIAS;
    }
    if w.qk_norms.is_some() {
        flags |= HEADS_NORM;
    }
    if cfg.rope_mode == RopeMode::Neox {
        flags |= HEADS_NEOX;
    }
    let push = HeadsPush {
        n_heads: to_u32(cfg.n_heads as u64, "heads")?,
        n_kv_heads: to_u32(cfg.n_kv_heads as u64, "kv heads")?,
        head_dim: to_u32(cfg.head_dim as u64, "head_dim")?,
        qkv_ld: to_u32(cfg.q_dim() as u64 + 2 * cfg.kv_dim() as u64, "q/k/v row")?,
        q_ld: to_u32(cfg.q_dim() as u64, "q row")?,
        kv_ld: to_u32(cfg.kv_dim() as u64, "kv row")?,
        eps: cfg.rms_eps,
        flags,
        freq_ofs: (graph::rope_table(cfg, l) * STEP_FREQS_MAX) as u32,
        bq_ofs: ofs(&w.biases, 0),
        bk_ofs: ofs(&w.biases, 1),
        bv_ofs: ofs(&w.biases, 2),
        qn_ofs: nofs(&w.qk_norms, 0),
        kn_ofs: nofs(&w.qk_norms, 1),
        pad: [0; 2],
    };
    Ok(HeadsCall { set, push })
}

/// `post_norm.comp`: x += rmsnorm(y)∘post; xg = x∘next.
pub(super) fn post_norm_call(
    cfg: &Config,
    post: &Vector,
    next: &Vector,
    acts: &Activations,
    kernels: &mut Kernels,
) -> Result<PostNormCall, EngineError> {
    let bindings = step::post_norm(post, next, acts);
    let set = kernels
        .post_norm()?
        .descriptor_set_with(&bindings.descriptors())?;
    let push = PostNormPush {
        dim: to_u32(cfg.dim as u64, "dim")?,
        eps: cfg.rms_eps,
        w_ofs: post.1,
        g_ofs: next.1,
    };
    Ok(PostNormCall { set, push })
}

/// `softcap.comp` over the logits, when the model caps them.
pub(super) fn softcap_call(
    cfg: &Config,
    acts: &Activations,
    kernels: &mut Kernels,
) -> Result<Option<SoftcapCall>, EngineError> {
    let Some(cap) = cfg.final_logit_softcap else {
        return Ok(None);
    };
    let bindings = SoftcapBindings {
        logits: acts.logits.binding(),
    };
    let set = kernels
        .softcap()?
        .descriptor_set_with(&bindings.descriptors())?;
    let push = SoftcapPush {
        n: to_u32(cfg.vocab_size as u64, "vocabulary")?,
        cap,
    };
    Ok(Some(SoftcapCall { set, push }))
}
