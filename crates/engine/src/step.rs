//! The steps of the pass as data: for each fused matmul, the weights it reads, its input
//! and what it writes (model/ turns each into dispatches and descriptor sets at load).

use std::sync::Arc;

use vk::{BufferBinding, BufferView};

use crate::activations::Activations;
use crate::kernels::{AttentionBindings, HeadsBindings, InMode, OutMode, PostNormBindings};
use crate::views::Views;
use residency::TensorView;

/// What one fused matmul reads and writes, before it is split into calls.
pub(crate) struct MatmulSpec<'a> {
    pub name: String,
    pub views: Vec<&'a TensorView>,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    /// The dot input (xg for IN_RMSNORM).
    pub x: Arc<BufferView>,
    /// The raw residual the rms is taken of (IN_RMSNORM).
    pub xr: Option<Arc<BufferView>>,
    pub x_ld: usize,
    /// OUT_ADD: the next norm weight (binding, float offset); out1 receives x∘aux.
    pub aux: Option<(BufferBinding, u32)>,
    pub outs: [Option<BufferBinding>; 3],
    pub out_ld: usize,
    pub last_token_only: bool,
}

/// One layer's weights, and the norms it folds into the next step's input.
pub(crate) struct LayerWeights<'w> {
    pub qkv: [&'w TensorView; 3],
    pub o: &'w TensorView,
    pub gate_up: [&'w TensorView; 2],
    pub down: &'w TensorView,
    pub ffn_norm: (BufferBinding, u32),
    /// The next layer's attn_norm, or output_norm after the last layer.
    pub next_norm: (BufferBinding, u32),
    /// q, k, v biases (qwen2).
    pub biases: Option<[(BufferBinding, u32); 3]>,
    /// The per-head q and k norm weights (qwen3, gemma3).
    pub qk_norms: Option<[(BufferBinding, u32); 2]>,
    /// The post-attention and post-FFN norm weights (gemma3).
    pub post_norms: Option<[(BufferBinding, u32); 2]>,
}

/// Row lengths: dim, n_heads·head_dim, hidden_dim, vocabulary, and a q/k/v row
/// ((n_heads + 2·n_kv_heads)·head_dim).
pub(crate) struct Dims {
    pub dim: usize,
    pub q_dim: usize,
    pub qkv: usize,
    pub hidden: usize,
    pub vocab: usize,
}

/// What the steps read and write besides weights: activations, their texel views,
/// row lengths.
pub(crate) struct Io<'a> {
    pub a: &'a Activations,
    pub v: &'a Views,
    pub d: &'a Dims,
}

/// q = rope(Wq·rmsnorm(x)); k_cache[pos] = rope(Wk·rmsnorm(x)); v_cache[pos] =
/// Wv·rmsnorm(x). Reads xg = x∘attn_norm and x; writes q and layer l's caches.
pub(crate) fn qkv<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let (a, q_dim) = (io.a, io.d.q_dim);
    let outs = [
        a.q.binding(),
        a.key_cache[l].binding(),
        a.value_cache[l].binding(),
    ];
    let outs = outs.map(Some);
    normed(
        format!("blk.{l}.qkv"),
        w.qkv.to_vec(),
        OutMode::Qkv,
        outs,
        q_dim,
        io,
    )
}

/// qkv = [Wq; Wk; Wv]·rmsnorm(x): each token's q heads, k heads and v heads end to end in
/// one row of the qkv scratch (heads.comp takes it from there). Reads xg and x.
pub(crate) fn qkv_plain<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let outs = [Some(io.a.qkv.binding()), None, None];
    normed(
        format!("blk.{l}.qkv"),
        w.qkv.to_vec(),
        OutMode::Store,
        outs,
        io.d.qkv,
        io,
    )
}

/// q = rope(norm(q + bq)); k_cache[pos] = rope(norm(k + bk)); v_cache[pos] = v + bv,
/// per head, from the qkv row (biases and norms where the layer has them; `dummy` bound
/// where it has not). Reads qkv, the step buffer and the rope tables; writes q and layer
/// l's caches.
pub(crate) fn heads(
    l: usize,
    w: &LayerWeights<'_>,
    a: &Activations,
    dummy: &BufferBinding,
) -> HeadsBindings {
    let d = || (dummy.clone(), 0);
    let [bq, bk, bv] = w.biases.clone().unwrap_or_else(|| [d(), d(), d()]);
    let [qn, kn] = w.qk_norms.clone().unwrap_or_else(|| [d(), d()]);
    HeadsBindings {
        qkv: a.qkv.binding(),
        bq: bq.0,
        bk: bk.0,
        bv: bv.0,
        q_norm: qn.0,
        k_norm: kn.0,
        q: a.q.binding(),
        k_cache: a.key_cache[l].binding(),
        v_cache: a.value_cache[l].binding(),
        step: a.step.binding(),
        rope: a.rope.binding(),
    }
}

/// x += rmsnorm(y)∘post; xg = x∘next (a post-norm family's residual add). Reads y;
/// writes x and xg.
pub(crate) fn post_norm(
    post: &(BufferBinding, u32),
    next: &(BufferBinding, u32),
    a: &Activations,
) -> PostNormBindings {
    PostNormBindings {
        y: a.y.binding(),
        w: post.0.clone(),
        g: next.0.clone(),
        x: a.x.binding(),
        xg: a.xg.binding(),
    }
}

/// att_out = softmax(q·K^T/sqrt(hd))·V over positions 0..=pos. Reads q and the caches
/// (RGBA16F views `kc4`, `vc4`) and the step buffer; writes att_out.
pub(crate) fn attention<'v>(
    v: &'v Views,
    kc4: &'v BufferView,
    vc4: &'v BufferView,
    a: &Activations,
) -> AttentionBindings<'v> {
    let (out, step) = (a.att_out.binding(), a.step.binding());
    AttentionBindings {
        q: &v.q,
        k_cache: kc4,
        v_cache: vc4,
        out,
        step,
    }
}

/// x += Wo·att_out; xg = x∘ffn_norm. Reads att_out; writes x and xg.
pub(crate) fn attn_output<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let (input, norm) = ((&io.v.att_out, io.d.q_dim), w.ffn_norm.clone());
    residual_add(format!("blk.{l}.attn_output"), w.o, input, norm, io)
}

/// y = Wo·att_out (stored for the post-attention norm). Reads att_out; writes y.
pub(crate) fn attn_output_store<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let input = (&io.v.att_out, io.d.q_dim);
    stored(format!("blk.{l}.attn_output"), w.o, input, io)
}

/// hb = act(Wgate·rmsnorm(x)) * (Wup·rmsnorm(x)), act silu or (`gelu`) gelu_tanh. Reads
/// xg = x∘ffn_norm and x; writes hb.
pub(crate) fn gate_up<'w>(l: usize, w: &LayerWeights<'w>, io: &Io, gelu: bool) -> MatmulSpec<'w> {
    let outs = [Some(io.a.hb.binding()), None, None];
    let (name, views) = (format!("blk.{l}.gate_up"), w.gate_up.to_vec());
    let mode = if gelu { OutMode::GeGlu } else { OutMode::Glu };
    normed(name, views, mode, outs, io.d.hidden, io)
}

/// y = Wdown·hb (stored for the post-FFN norm). Reads hb; writes y.
pub(crate) fn ffn_down_store<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let input = (&io.v.hb, io.d.hidden);
    stored(format!("blk.{l}.ffn_down"), w.down, input, io)
}

/// y = W·input (input rows `x_ld` floats apart), stored in the y scratch.
fn stored<'w>(
    name: String,
    w: &'w TensorView,
    (input, x_ld): (&Arc<BufferView>, usize),
    io: &Io,
) -> MatmulSpec<'w> {
    MatmulSpec {
        name,
        views: vec![w],
        in_mode: InMode::Plain,
        out_mode: OutMode::Store,
        x: Arc::clone(input),
        xr: None,
        x_ld,
        aux: None,
        outs: [Some(io.a.y.binding()), None, None],
        out_ld: io.d.dim,
        last_token_only: false,
    }
}

/// x += Wdown·hb; xg = x∘(next attn_norm, or output_norm). Reads hb; writes x, xg.
pub(crate) fn ffn_down<'w>(l: usize, w: &LayerWeights<'w>, io: &Io) -> MatmulSpec<'w> {
    let (input, norm) = ((&io.v.hb, io.d.hidden), w.next_norm.clone());
    residual_add(format!("blk.{l}.ffn_down"), w.down, input, norm, io)
}

/// logits = Wout·rmsnorm(x[last]). Reads xg = x∘output_norm and x of the last token;
/// writes logits.
pub(crate) fn logits<'w>(out: &'w TensorView, io: &Io) -> MatmulSpec<'w> {
    let outs = [Some(io.a.logits.binding()), None, None];
    let spec = normed(
        "logits".into(),
        vec![out],
        OutMode::Store,
        outs,
        io.d.vocab,
        io,
    );
    MatmulSpec {
        last_token_only: true,
        ..spec
    }
}

/// out = W·rmsnorm(x) through `out_mode`: reads xg (x∘norm, written by the step before)
/// and x (the rms), all tokens.
fn normed<'w>(
    name: String,
    views: Vec<&'w TensorView>,
    out_mode: OutMode,
    outs: [Option<BufferBinding>; 3],
    out_ld: usize,
    io: &Io,
) -> MatmulSpec<'w> {
    let (x, xr) = (Arc::clone(&io.v.xg), Some(Arc::clone(&io.v.x)));
    let (in_mode, x_ld, aux, last_token_only) = (InMode::RmsNorm, io.d.dim, None, false);
    MatmulSpec {
        name,
        views,
        in_mode,
        out_mode,
        x,
        xr,
        x_ld,
        aux,
        outs,
        out_ld,
        last_token_only,
    }
}

/// x += W·input (input rows `x_ld` floats apart); xg = x∘norm.
fn residual_add<'w>(
    name: String,
    w: &'w TensorView,
    (input, x_ld): (&Arc<BufferView>, usize),
    norm: (BufferBinding, u32),
    io: &Io,
) -> MatmulSpec<'w> {
    MatmulSpec {
        name,
        views: vec![w],
        in_mode: InMode::Plain,
        out_mode: OutMode::Add,
        x: Arc::clone(input),
        xr: None,
        x_ld,
        aux: Some(norm),
        outs: [Some(io.a.x.binding()), Some(io.a.xg.binding()), None],
        out_ld: io.d.dim,
        last_token_only: false,
    }
}
