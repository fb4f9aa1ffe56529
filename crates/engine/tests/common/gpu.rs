//! Shared scaffolding of the GPU kernel tests (kernels.rs, kernels_arch.rs, kernels_k.rs,
//! kernels_types.rs, prefill_gemm.rs): one dispatch, weight and activation views, the
//! engine's own keys, a matmul, embedding gather or attention through the engine's binding
//! structs, and the written-down tolerance check.

use std::sync::Arc;

use engine::kernels::{
    self, AttentionBindings, AttentionPush, EmbedBindings, EmbedPush, InMode, Kernels,
    MatmulBindings, MatmulKey, MatmulPush, OutMode, Slot,
};
use engine::kernels::{Batch, MatmulVariant};
use gguf::GgmlType;
use vk::{Buffer, BufferView, CommandBuffer, Context, DescriptorSet, Pipeline, TexelFormat};

use super::{read_f32, step_buffer, upload, upload_f16, zeros};

/// A matmul key of 8-lane workgroups with 4 row pairs, lanes owning rows (no column
/// split), `tb` tokens per invocation (1 or 4: matmul.comp; 8 or 2: the GEMM's tile).
pub fn row_key(ty: GgmlType, in_mode: InMode, out_mode: OutMode, tb: u32) -> MatmulKey {
    MatmulKey {
        wtype: ty,
        in_mode,
        out_mode,
        wg: 8,
        pairs: 4,
        tb,
        split_k: 0,
        texel_aligned: false,
    }
}

/// The unit roundoff of f32, 2^-24.
pub const U: f32 = 1.0 / 16_777_216.0;
/// How many times n·u·Σ|w·x| the GPU and the reference may differ (each may be off by
/// Higham's γ_n, summing in its own order).
pub const TOL_K: f32 = 4.0;

/// One dispatch, waited for, its writes visible to the host.
pub fn run(ctx: &Arc<Context>, p: &Pipeline, set: &DescriptorSet, push: &[u8], groups: [u32; 3]) {
    let mut cmd = CommandBuffer::new(ctx).unwrap();
    cmd.begin().unwrap();
    cmd.dispatch(p, set, push, groups);
    cmd.host_barrier();
    cmd.end().unwrap();
    ctx.submit_and_wait(&cmd).unwrap();
}

/// Dequantised weights (`n` elements) as the kernels see them.
pub fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    gguf::quant::dequantize(ty, bytes, &mut out).unwrap();
    out
}

/// `Σ_c |W[r][c]·x[c]|` per row: the magnitude the tolerance scales with.
pub fn magnitudes(w: &[f32], cols: usize, x: &[f32]) -> Vec<f32> {
    w.chunks_exact(cols)
        .map(|row| row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum())
        .collect()
}

/// A weight buffer, zero-padded to whole 16-byte texels (the engine checks that a part's
/// bytes lie in whole texels of its view; in a GGUF file the next tensor or padding
/// follows).
pub fn wupload(ctx: &Arc<Context>, name: &str, bytes: &[u8]) -> Buffer {
    let mut v = bytes.to_vec();
    v.resize(v.len().next_multiple_of(16), 0);
    upload(ctx, name, &v)
}

/// The weight texel view of a buffer, in the engine's format for `ty`.
pub fn wview(ctx: &Arc<Context>, b: &Buffer, ty: GgmlType) -> BufferView {
    BufferView::new(ctx, b.binding(), kernels::weight_texel_format(ty)).unwrap()
}

/// [`wupload`] and its [`wview`]: the buffer must outlive the view.
pub fn weight_view(
    ctx: &Arc<Context>,
    name: &str,
    bytes: &[u8],
    ty: GgmlType,
) -> (Buffer, BufferView) {
    let b = wupload(ctx, name, bytes);
    let view = wview(ctx, &b, ty);
    (b, view)
}

/// The activation texel view (RGBA32F) of a buffer.
pub fn xview(ctx: &Arc<Context>, b: &Buffer) -> BufferView {
    BufferView::new(ctx, b.binding(), TexelFormat::Rgba32Float).unwrap()
}

/// attention.comp over a batch of `n_tok` query rows `q` at positions `pos0..`, the caches
/// `kc` and `vc` holding positions from 0 (stored as f16, RGBA16F views, as the engine's);
/// the batch's tokens from `push.t0` run. Returns all `n_tok` rows of out (rows past the
/// ones that ran stay 0).
#[allow(clippy::too_many_arguments)]
pub fn run_attention(
    ctx: &Arc<Context>,
    ks: &mut Kernels,
    push: &AttentionPush,
    pos0: u32,
    n_tok: usize,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
) -> Vec<f32> {
    let q_dim = (push.n_heads * push.head_dim) as usize;
    let (qb, kb, vb) = (
        upload(ctx, "q", q),
        upload_f16(ctx, "k", kc),
        upload_f16(ctx, "v", vc),
    );
    let out = zeros(ctx, "out", n_tok * q_dim);
    let step = step_buffer(ctx, pos0, &[], &[]);
    let cache = |b: &Buffer| BufferView::new(ctx, b.binding(), TexelFormat::Rgba16Float).unwrap();
    let (qv4, kv4, vv4) = (xview(ctx, &qb), cache(&kb), cache(&vb));
    let p = ks.attention(push.head_dim).unwrap();
    let set = p
        .descriptor_set_with(
            &AttentionBindings {
                q: &qv4,
                k_cache: &kv4,
                v_cache: &vv4,
                out: out.binding(),
                step: step.binding(),
            }
            .descriptors(),
        )
        .unwrap();
    let rows = n_tok as u32 - push.t0;
    run(
        ctx,
        p,
        &set,
        bytemuck::bytes_of(push),
        [push.n_heads, rows, 1],
    );
    read_f32(&out, n_tok * q_dim)
}

/// The CPU reference of token `t`'s row in [`run_attention`]'s batch: its query against
/// the positions its window sees (all up to its own when `push.window` is 0), scaled by
/// `push.scale`.
pub fn attention_want(
    push: &AttentionPush,
    pos0: u32,
    t: usize,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
) -> Vec<f32> {
    let (n_heads, hd) = (push.n_heads as usize, push.head_dim as usize);
    let q_dim = n_heads * hd;
    let n_pos = pos0 as usize + t + 1;
    let first = match push.window {
        0 => 0,
        w => n_pos.saturating_sub(w as usize),
    };
    let mut want = vec![0.0; q_dim];
    reference::kernels::attention_ext(
        &q[t * q_dim..(t + 1) * q_dim],
        kc,
        vc,
        n_heads,
        push.n_kv_heads as usize,
        hd,
        first,
        n_pos,
        push.scale,
        &mut want,
    );
    want
}

/// `x ∘ g` per token row: what the producer of x writes for the next rmsnorm.
pub fn times_g(x: &[f32], g: &[f32]) -> Vec<f32> {
    x.chunks(g.len())
        .flat_map(|r| r.iter().zip(g).map(|(a, b)| a * b))
        .collect()
}

/// Asserts `got[i]` is within `tol(i)` of `want[i]` for every i.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        assert!(
            (g - w).abs() <= t,
            "{what}[{i}]: gpu {g} vs reference {w} (tolerance {t})"
        );
    }
}

/// The engine's own keys for a dispatch over rows of `cols` columns
/// (`Kernels::matmul_key`, in the device's shapes): the prefill shape, the decode shape
/// (with the column split the engine picks on this device), and where the split is
/// picked, the row-per-lane decode fallback. The logits read one token: decode shape only.
pub fn engine_keys(
    ks: &Kernels,
    ty: GgmlType,
    (in_mode, out_mode): (InMode, OutMode),
    cols: usize,
) -> Vec<MatmulKey> {
    let v = MatmulVariant {
        wtype: ty,
        in_mode,
        out_mode,
        last_token_only: out_mode == OutMode::Store,
        split_k: ks.column_split(ks.shapes().decode.wg, cols as u32),
        pairs: 0,
        texel_aligned: false,
    };
    let fallback = MatmulVariant { split_k: 0, ..v };
    let mut keys = vec![
        ks.matmul_key(&v, Batch::Prefill),
        ks.matmul_key(&v, Batch::Decode),
        ks.matmul_key(&fallback, Batch::Decode),
    ];
    keys.sort_by_key(|k| (k.tb, k.split_k));
    keys.dedup();
    keys
}

/// Runs the matmul pipeline of `k` once, bound through the engine's own binding struct,
/// over `slots` (`kernels::matmul_layout` fills the push's layout), with `k`'s
/// `texel_aligned` set as the engine sets it for those slots (`kernels::k_texel_aligned`:
/// a Q4_K or Q5_K view at a word offset that is a multiple of 4 takes the aligned
/// decoders). Returns the groups.
pub fn dispatch_matmul(
    ctx: &Arc<Context>,
    ks: &mut Kernels,
    k: MatmulKey,
    bindings: &MatmulBindings<'_>,
    push: MatmulPush,
    slots: &[Slot],
) -> [u32; 3] {
    let k = MatmulKey {
        texel_aligned: kernels::k_texel_aligned(k.wtype, slots),
        ..k
    };
    dispatch_matmul_key(ctx, ks, k, bindings, push, slots)
}

/// [`dispatch_matmul`] with `k` exactly as given (`texel_aligned` included).
pub fn dispatch_matmul_key(
    ctx: &Arc<Context>,
    ks: &mut Kernels,
    k: MatmulKey,
    bindings: &MatmulBindings<'_>,
    mut push: MatmulPush,
    slots: &[Slot],
) -> [u32; 3] {
    let p = ks.matmul(k).unwrap();
    let set = p.descriptor_set_with(&bindings.descriptors()).unwrap();
    let groups = kernels::matmul_layout(&k, &mut push, slots);
    run(ctx, p, &set, bytemuck::bytes_of(&push), groups);
    groups
}

/// An embedding table of `rows` rows of `cols` columns, bound as the engine binds a
/// table in two row-range parts: rows `..split` at word 0 of the first binding, the rest
/// `pad` bytes (a whole number of words) into the second.
#[derive(Clone, Copy)]
pub struct TwoParts {
    pub rows: usize,
    pub cols: usize,
    pub split: usize,
    pub pad: usize,
}

/// Gathers the rows of `tokens` out of `table` (of `ty`, laid out as `parts`) through the
/// engine's embedding pipeline and bindings, writing x∘g with g read from word 8 of `g`.
/// Returns x and x∘g, `tokens.len()` rows of `parts.cols` each.
pub fn embed_gather(
    ctx: &Arc<Context>,
    ks: &mut Kernels,
    ty: GgmlType,
    table: &[u8],
    parts: TwoParts,
    tokens: &[u32],
    g: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let TwoParts {
        rows,
        cols,
        split,
        pad,
    } = parts;
    assert_eq!(pad % 4, 0, "the second part starts at a word");
    let step = step_buffer(ctx, 0, &[], tokens);
    let dummy = zeros(ctx, "dummy", 4);
    let gbuf = upload(ctx, "g", g);
    let rb = table.len() / rows;
    let a = wupload(ctx, "a", &table[..split * rb]);
    let mut bb = vec![0u8; pad];
    bb.extend_from_slice(&table[split * rb..]);
    let b = wupload(ctx, "b", &bb);
    let n = tokens.len() * cols;
    let (x, xg) = (zeros(ctx, "x", n), zeros(ctx, "xg", n));
    let p = ks.embed(ty).unwrap();
    let (va, vb, vd) = (
        wview(ctx, &a, ty),
        wview(ctx, &b, ty),
        wview(ctx, &dummy, ty),
    );
    let bindings = EmbedBindings {
        w0: &va,
        w1: &vb,
        w2: &vd,
        x: x.binding(),
        step: step.binding(),
        xg: xg.binding(),
        g: gbuf.binding(),
    };
    let set = p.descriptor_set_with(&bindings.descriptors()).unwrap();
    let push = EmbedPush {
        scale: 1.0,
        ncols: cols as u32,
        out_ld: cols as u32,
        n_tok: tokens.len() as u32,
        g_ofs: 8,
        part_end: [split as u32, rows as u32, u32::MAX, u32::MAX],
        wofs: [0, (pad / 4) as u32, 0, 0],
    };
    let groups = [
        (cols / kernels::CHUNK).div_ceil(kernels::EMBED_WG as usize) as u32,
        tokens.len() as u32,
        1,
    ];
    run(ctx, p, &set, bytemuck::bytes_of(&push), groups);
    (read_f32(&x, n), read_f32(&xg, n))
}
