//! One decoder layer: the math, the kernel that computes each step, the calls bound at
//! load and the dispatches recorded per pass. Per token, with x the residual:
//!
//! ```text
//! xn      = rmsnorm(x)∘attn_norm            folded into the q/k/v matmul's input
//! q, k, v = Wq·xn, Wk·xn, Wv·xn             one matmul over the three weights
//! q, k    = rope(q), rope(k)                llama: in that matmul's epilogue, which also
//! K[p], V[p] = k, v                           writes the caches; the other families
//!                                             (biases, per-head norms, a layer's own
//!                                             rope): heads.comp after a plain matmul
//! a       = softmax(q·Kᵀ·scale)·V           attention.comp, causal, grouped-query,
//!                                             over the layer's window
//! x      += Wo·a                            the matmul's add epilogue; post-norm
//!                                             families: y = Wo·a, then post_norm.comp
//!                                             x += rmsnorm(y)∘post_attention_norm
//! h       = act(Wg·xn')∘(Wu·xn')            xn' = rmsnorm(x)∘ffn_norm; one matmul over
//!                                             gate and up, SiLU or GELU in its epilogue
//! x      += Wd·h                            as for Wo (post_ffw_norm)
//! ```
//!
//! Each step that adds to x also writes x∘(the next norm's weight), the next step's
//! input. The forward of a layer is [`Recorder::layer`]; what each step reads and writes
//! is in `step.rs`; [`GraphShape`](crate::graph::GraphShape) says which
//! form each step takes.

use arch::{Config, LayerTensor, ModelTensor, RopeMode};
use vk::{BufferBinding, DescriptorSet};

use super::bounds::{check_fits, missing};
use super::matmul::{matmul_calls, matrix, vector, MatmulCall};
use super::record::Recorder;
use super::{to_u32, Bind};
use crate::activations::Activations;
use crate::graph;
use crate::kernels::{
    self, AttentionPush, Batch, HeadsPush, Kernels, PostNormPush, HEADS_BIAS, HEADS_NEOX,
    HEADS_NORM, STEP_FREQS_MAX,
};
use crate::step::{self, Io, LayerWeights};
use crate::views::Views;
use crate::EngineError;
use residency::Weights;

impl Recorder<'_> {
    /// One decoder layer.
    pub fn layer(&mut self, l: usize) -> Result<(), EngineError> {
        self.layer_kv(l)?;
        self.attention(l, 0)?;
        self.after_named(|| format!("blk.{l}.attention"));
        self.layer_rest(l)
    }

    /// The start of layer `l` that fills its caches: q, and the keys and values of the
    /// batch's positions.
    pub(super) fn layer_kv(&mut self, l: usize) -> Result<(), EngineError> {
        let layer = &self.model.layers[l];
        // q = rope(Wq·xn); K[pos] = rope(Wk·xn); V[pos] = Wv·xn
        self.matmuls(&layer.qkv)?;
        // (plain q/k/v) + biases, per-head norms, rope, cache writes
        if let Some(h) = &layer.heads {
            self.heads(l, h)?;
        }
        Ok(())
    }

    /// Layer `l` after its attention: the output projection, the feed-forward block, and
    /// the post-norms of the families that have them.
    fn layer_rest(&mut self, l: usize) -> Result<(), EngineError> {
        let model = self.model;
        let layer = &model.layers[l];
        // x += Wo·att_out (post-norm families: y = Wo·att_out; x += rmsnorm(y)∘w)
        self.matmuls(&layer.attn_output)?;
        if let Some(p) = &layer.post_attn {
            self.post_norm(p, || format!("blk.{l}.post_attention_norm"))?;
        }
        // hb = act(Wgate·xn')∘(Wup·xn')
        self.matmuls(&layer.gate_up)?;
        // x += Wdown·hb (post-norm families: y = Wdown·hb; x += rmsnorm(y)∘w)
        self.matmuls(&layer.ffn_down)?;
        if let Some(p) = &layer.post_ffn {
            self.post_norm(p, || format!("blk.{l}.post_ffw_norm"))?;
        }
        Ok(())
    }

    /// The rest of layer `l` past its keys and values for the batch's last token alone,
    /// as a one-token decode step runs it: the token's attention row goes to row 0 of
    /// att_out, its residual is copied to row 0 of x, and the batch becomes that one token
    /// (the decode kernels, row 0 everywhere, the head reading row 0).
    pub(super) fn last_token_rest(&mut self, l: usize) -> Result<(), EngineError> {
        let last = self.n_tok - 1;
        self.attention(l, last)?;
        if last > 0 {
            // the copy only touches x, which attention does not read: one barrier for both
            let row = (self.cfg.dim * 4) as u64;
            self.cmd.copy_buffer(
                &self.acts.x,
                &self.acts.x,
                &[(u64::from(last) * row, 0, row)],
            );
        }
        self.after_named(|| format!("blk.{l}.attention"));
        self.n_tok = 1;
        self.batch = Batch::Decode;
        self.layer_rest(l)
    }

    /// att_out[t - t0] = softmax(q[t]·K^T·scale)·V over layer `l`'s window of positions
    /// ..=pos(t), for the batch's tokens t0.. (no barrier after it).
    fn attention(&mut self, l: usize, t0: u32) -> Result<(), EngineError> {
        let layer = &self.model.layers[l];
        let push = kernels::AttentionPush {
            t0,
            ..layer.attention_push
        };
        let attention = self
            .kernels
            .attention_ref(push.head_dim)
            .ok_or_else(|| missing("attention"))?;
        let rows = self.n_tok - t0;
        let need = u64::from(rows) * u64::from(push.n_heads * push.head_dim) * 4;
        check_fits("attention", "att_out", need, self.acts.att_out.size())?;
        self.cmd.dispatch(
            attention,
            &layer.attention,
            bytemuck::bytes_of(&push),
            [self.cfg.n_heads as u32, rows, 1],
        );
        Ok(())
    }

    /// heads.comp: every (head, token) of the plain q/k/v row to q and the caches.
    fn heads(&mut self, l: usize, h: &HeadsCall) -> Result<(), EngineError> {
        let p = self.kernels.heads_ref().ok_or_else(|| missing("heads"))?;
        let push = h.push;
        let f = 4u64;
        let need_q = u64::from(self.n_tok) * u64::from(push.q_ld) * f;
        check_fits("heads", "q", need_q, self.acts.q.size())?;
        let need_kv = self.ctx_len as u64 * u64::from(push.kv_ld) * kernels::KV_BYTES;
        check_fits("heads", "k_cache", need_kv, self.acts.key_cache[l].size())?;
        check_fits("heads", "v_cache", need_kv, self.acts.value_cache[l].size())?;
        let need_in = u64::from(self.n_tok) * u64::from(push.qkv_ld) * f;
        check_fits("heads", "qkv", need_in, self.acts.qkv.size())?;
        self.cmd.dispatch(
            p,
            &h.set,
            bytemuck::bytes_of(&push),
            kernels::heads_groups(&push, self.n_tok),
        );
        self.after_named(|| format!("blk.{l}.heads"));
        Ok(())
    }

    /// post_norm.comp: x += rmsnorm(y)∘w; xg = x∘g, one workgroup per token.
    fn post_norm(
        &mut self,
        call: &PostNormCall,
        name: impl FnOnce() -> String,
    ) -> Result<(), EngineError> {
        let p = self
            .kernels
            .post_norm_ref()
            .ok_or_else(|| missing("post_norm"))?;
        let need = u64::from(self.n_tok) * u64::from(call.push.dim) * 4;
        for (what, have) in [
            ("x", self.acts.x.size()),
            ("xg", self.acts.xg.size()),
            ("y", self.acts.y.size()),
        ] {
            check_fits("post_norm", what, need, have)?;
        }
        self.cmd.dispatch(
            p,
            &call.set,
            bytemuck::bytes_of(&call.push),
            [self.n_tok, 1, 1],
        );
        self.after_named(name);
        Ok(())
    }
}

/// The dispatches of one decoder layer.
pub struct LayerCalls {
    pub qkv: Vec<MatmulCall>,
    /// After a plain q/k/v matmul: biases, Q/K norms, rope, cache writes (`None`: fused
    /// into qkv's epilogue).
    pub heads: Option<HeadsCall>,
    pub attention: DescriptorSet,
    /// The layer's heads, score scale and window.
    pub attention_push: AttentionPush,
    pub attn_output: Vec<MatmulCall>,
    /// x += rmsnorm(attn_output)∘post_attention_norm (`None`: added in its epilogue).
    pub post_attn: Option<PostNormCall>,
    pub gate_up: Vec<MatmulCall>,
    pub ffn_down: Vec<MatmulCall>,
    /// x += rmsnorm(ffn_down)∘post_ffw_norm (`None`: added in its epilogue).
    pub post_ffn: Option<PostNormCall>,
}

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

/// A norm or bias vector: (binding, float offset).
type Vector = (BufferBinding, u32);

impl LayerCalls {
    /// Layer `l` bound: its weights found and checked, and each step on the kernel that
    /// computes it in this model's graph.
    pub(super) fn bind(
        l: usize,
        b: &Bind<'_>,
        kernels: &mut Kernels,
        views: &mut Views,
    ) -> Result<LayerCalls, EngineError> {
        let (cfg, acts, shape) = (b.cfg, b.acts, b.shape);
        let lw = layer_weights(l, cfg, b.weights)?;
        let io = Io {
            a: acts,
            v: &*views,
            d: b.dims,
        };
        // q/k/v: fused with rope and the cache writes (llama), or plain and heads.comp
        let (qkv, heads) = if shape.fused_qkv {
            (step::qkv(l, &lw, &io), None)
        } else {
            let h = heads_call(l, cfg, &lw, acts, kernels)?;
            (step::qkv_plain(l, &lw, &io), Some(h))
        };
        // the residual adds: in the output matmuls' epilogues, or post_norm.comp after
        // matmuls that store
        let (attn_output, ffn_down, post_attn, post_ffn) = match &lw.post_norms {
            Some([pa, pf]) => (
                step::attn_output_store(l, &lw, &io),
                step::ffn_down_store(l, &lw, &io),
                Some(post_norm_call(cfg, pa, &lw.ffn_norm, acts, kernels)?),
                Some(post_norm_call(cfg, pf, &lw.next_norm, acts, kernels)?),
            ),
            None => (
                step::attn_output(l, &lw, &io),
                step::ffn_down(l, &lw, &io),
                None,
                None,
            ),
        };
        // SiLU or GELU gating in the gate/up epilogue
        let gate_up = step::gate_up(l, &lw, &io, shape.gelu);
        let (kc, vc) = (acts.key_cache[l].binding(), acts.value_cache[l].binding());
        let (kc4, vc4) = (views.cache(kc)?, views.cache(vc)?);
        let attention = kernels
            .attention(to_u32(cfg.head_dim as u64, "head_dim")?)?
            .descriptor_set_with(&step::attention(views, &kc4, &vc4, acts).descriptors())?;
        let mut calls = |s| matmul_calls(s, b, kernels, views);
        Ok(LayerCalls {
            qkv: calls(qkv)?,
            heads,
            attention,
            attention_push: attention_push(cfg, l)?,
            attn_output: calls(attn_output)?,
            post_attn,
            gate_up: calls(gate_up)?,
            ffn_down: calls(ffn_down)?,
            post_ffn,
        })
    }
}

/// Layer `l`'s weights: the matrices, the norms (the next layer's attn_norm, or
/// output_norm after the last layer, is folded into this layer's last step), and the
/// vectors of the families that have them.
fn layer_weights<'w>(
    l: usize,
    cfg: &Config,
    weights: &'w Weights,
) -> Result<LayerWeights<'w>, EngineError> {
    let (dim, hidden, q_dim, kv_dim) = (cfg.dim, cfg.hidden_dim, cfg.q_dim(), cfg.kv_dim());
    let m = |t: LayerTensor, rows, cols| matrix(weights, &t.name(l), rows, cols);
    let next_norm = if l + 1 < cfg.n_layers {
        vector(weights, &LayerTensor::AttnNorm.name(l + 1), dim)?
    } else {
        vector(weights, ModelTensor::OutputNorm.name(), dim)?
    };
    let (biases, qk_norms, post_norms) = layer_vectors(weights, cfg, l)?;
    Ok(LayerWeights {
        qkv: [
            m(LayerTensor::AttnQ, q_dim, dim)?,
            m(LayerTensor::AttnK, kv_dim, dim)?,
            m(LayerTensor::AttnV, kv_dim, dim)?,
        ],
        o: m(LayerTensor::AttnOutput, dim, q_dim)?,
        gate_up: [
            m(LayerTensor::FfnGate, hidden, dim)?,
            m(LayerTensor::FfnUp, hidden, dim)?,
        ],
        down: m(LayerTensor::FfnDown, dim, hidden)?,
        ffn_norm: vector(weights, &LayerTensor::FfnNorm.name(l), dim)?,
        next_norm,
        biases,
        qk_norms,
        post_norms,
    })
}

/// Layer `l`'s optional vectors: q/k/v biases, per-head q/k norms, post norms.
#[allow(clippy::type_complexity)]
fn layer_vectors(
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
fn attention_push(cfg: &Config, l: usize) -> Result<AttentionPush, EngineError> {
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
fn heads_call(
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
fn post_norm_call(
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
