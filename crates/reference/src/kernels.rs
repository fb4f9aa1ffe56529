//! One plain scalar function per GPU kernel (as plain as llama2.c's `run.c` helpers).
//!
//! These are the yardsticks the Vulkan kernels in `shaders/` are tested against, so each
//! function's semantics are written down in its doc comment and nothing else is implied:
//! no fusion, no threading, f32 arithmetic throughout (sums of squares and angles are taken
//! in f64, which only makes the yardstick closer to exact).
//!
//! Slice-length preconditions are programming errors, not bad input: each function says
//! which lengths must agree and panics (like `copy_from_slice`) when they do not. Functions
//! that read packed GGUF weight bytes validate them and return [`RefError`].

use gguf::GgmlType;
use half::f16;

use crate::RefError;

/// Bytes taken by `n` elements of type `ty` (`n` must be a multiple of the block size).
fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, RefError> {
    crate::row_bytes(ty, n)
}

/// Dot product of two equally long f32 slices.
///
/// Eight running sums (one per lane) added pairwise at the end: the compiler vectorises
/// it, and the order is fixed, so results are reproducible.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += xa[i] * xb[i];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    let s4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail
}

/// Dequantises row `row` of an embedding table (`table`: rows of `row_len` elements of type
/// `ty`, packed back to back as GGUF stores them) into `out` (`row_len` elements).
pub fn embedding_row(
    ty: GgmlType,
    table: &[u8],
    row_len: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    check_len("embedding_row out", row_len, out.len())?;
    let rb = row_bytes(ty, row_len)?;
    let n_rows = table.len().checked_div(rb).unwrap_or(0);
    if row >= n_rows {
        return Err(RefError::RowOutOfRange { row, rows: n_rows });
    }
    gguf::quant::dequantize(ty, &table[row * rb..(row + 1) * rb], out)?;
    Ok(())
}

/// `out = x / sqrt(mean(x²) + eps) * weight` (element-wise product with `weight`).
///
/// `x`, `weight` and `out` have the same length. The mean of squares is summed in f64.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), weight.len(), "rmsnorm: weight length");
    assert_eq!(x.len(), out.len(), "rmsnorm: out length");
    if x.is_empty() {
        return;
    }
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (ss / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// `out[r] = Σ_c W[r][c]·x[c]` for an f32 matrix `w` (`rows × cols`, row-major).
///
/// The CPU twin of every matvec variant once the weights are dequantised; [`matvec`] is
/// this over rows dequantised one at a time.
pub fn matvec_f32(w: &[f32], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    assert_eq!(w.len(), rows * cols, "matvec_f32: weight length");
    assert_eq!(x.len(), cols, "matvec_f32: x length");
    assert_eq!(out.len(), rows, "matvec_f32: out length");
    if cols == 0 {
        out.fill(0.0);
        return;
    }
    for (o, wr) in out.iter_mut().zip(w.chunks_exact(cols)) {
        *o = dot(wr, x);
    }
}

/// Checks that `w` holds `rows` rows of `cols` elements of `ty`; returns the row size.
fn check_matrix(ty: GgmlType, w: &[u8], rows: usize, cols: usize) -> Result<usize, RefError> {
    let rb = row_bytes(ty, cols)?;
    let need = rb * rows;
    if w.len() < need {
        return Err(RefError::ShortData {
            what: format!("{rows}x{cols} {ty} matrix"),
            need,
            have: w.len(),
        });
    }
    Ok(rb)
}

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<(), RefError> {
    if expected != found {
        return Err(RefError::Length {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// `out[r] = Σ_c W[r][c]·x[c]` with `W` stored as GGUF stores a 2-D weight: `rows` rows of
/// `cols` elements of type `ty`, row `r` at bytes `[r·row_bytes .. (r+1)·row_bytes]`.
///
/// Each row is dequantised to f32 and dotted with `x` by [`dot`]. `x` has `cols`
/// elements, `out` has `rows`.
pub fn matvec(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), RefError> {
    let rb = check_matrix(ty, w, rows, cols)?;
    check_len("matvec x", cols, x.len())?;
    check_len("matvec out", rows, out.len())?;
    let mut row = vec![0.0f32; cols];
    for (r, o) in out.iter_mut().enumerate() {
        gguf::quant::dequantize(ty, &w[r * rb..(r + 1) * rb], &mut row)?;
        *o = dot(&row, x);
    }
    Ok(())
}

/// Batched [`matvec`]: `x` holds `n_tok` rows of `cols` activations (token-major), and
/// `out[t·rows + r] = Σ_c W[r][c]·x[t·cols + c]` (`n_tok × rows`, token-major).
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    let rb = check_matrix(ty, w, rows, cols)?;
    check_len("matmul x", n_tok * cols, x.len())?;
    check_len("matmul out", n_tok * rows, out.len())?;
    let mut row = vec![0.0f32; cols];
    for r in 0..rows {
        gguf::quant::dequantize(ty, &w[r * rb..(r + 1) * rb], &mut row)?;
        for t in 0..n_tok {
            out[t * rows + r] = dot(&row, &x[t * cols..(t + 1) * cols]);
        }
    }
    Ok(())
}

pub use arch::RopeMode;

/// Rotary position embedding, in place, for `n_heads` heads of `head_dim` elements
/// (`x.len() == n_heads·head_dim`, `head_dim` even). [`rope_ext`] with scale 1 and no
/// frequency factors.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, pos: usize, base: f32, mode: RopeMode) {
    rope_ext(x, n_heads, head_dim, pos, base, 1.0, None, mode);
}

/// Rotary position embedding with linear position scaling and per-frequency divisors.
///
/// Pair `i` (for `i` in `0..head_dim/2`) of each head is rotated by
/// `theta_i = pos · scale · base^(-2i/head_dim) / factors[i]` (`factors` 1 when `None`;
/// Llama 3's `rope_freqs.weight`): `(a, b) -> (a·cos θ − b·sin θ, a·sin θ + b·cos θ)`,
/// where `(a, b)` is `(x[2i], x[2i+1])` in [`RopeMode::Normal`] and
/// `(x[i], x[i+head_dim/2])` in [`RopeMode::Neox`]. The angle, its cosine and sine are
/// computed in f64.
#[allow(clippy::too_many_arguments)]
pub fn rope_ext(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    base: f32,
    scale: f32,
    factors: Option<&[f32]>,
    mode: RopeMode,
) {
    assert_eq!(x.len(), n_heads * head_dim, "rope: x length");
    assert!(head_dim.is_multiple_of(2), "rope: head_dim must be even");
    let half = head_dim / 2;
    if let Some(f) = factors {
        assert_eq!(f.len(), half, "rope: factors length");
    }
    for head in x.chunks_exact_mut(head_dim.max(1)) {
        for i in 0..half {
            let freq = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
            let divisor = factors.map_or(1.0, |f| f64::from(f[i]));
            let theta = pos as f64 * f64::from(scale) * freq / divisor;
            let (sin, cos) = (theta.sin() as f32, theta.cos() as f32);
            let (ia, ib) = match mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * cos - b * sin;
            head[ib] = a * sin + b * cos;
        }
    }
}

/// Decode attention of one query over a KV cache, with grouped-query heads.
/// [`attention_ext`] with scale `1/sqrt(head_dim)` over every position `0..n_pos`.
#[allow(clippy::too_many_arguments)]
pub fn attention<T: Copy + Into<f32>>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_pos: usize,
    out: &mut [f32],
) {
    let scale = 1.0 / (head_dim as f32).sqrt();
    attention_ext(
        q, k_cache, v_cache, n_heads, n_kv_heads, head_dim, 0, n_pos, scale, out,
    );
}

/// Decode attention of one query over positions `first..n_pos` of a KV cache (a sliding
/// window when `first > 0`), with grouped-query heads and an explicit score scale.
///
/// - `q`: `n_heads·head_dim` (head-major);
/// - `k_cache`, `v_cache`: at least `n_pos` rows of `n_kv_heads·head_dim`, position-major
///   (row `t` is the key/value written at position `t`), f32 or (as the forward pass
///   keeps them, like the engine) f16;
/// - query head `h` reads kv head `h / (n_heads / n_kv_heads)`;
/// - for each head: `s_t = (q_h · k_t)·scale` for `t` in `first..n_pos`,
///   `p = softmax(s)`, `out_h = Σ_t p_t · v_t`; positions before `first` are not read;
/// - `out`: `n_heads·head_dim`.
#[allow(clippy::too_many_arguments)]
pub fn attention_ext<T: Copy + Into<f32>>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    first: usize,
    n_pos: usize,
    scale: f32,
    out: &mut [f32],
) {
    let kv_dim = n_kv_heads * head_dim;
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "attention: n_heads must be a multiple of n_kv_heads"
    );
    assert!(first < n_pos, "attention: empty window {first}..{n_pos}");
    assert_eq!(q.len(), n_heads * head_dim, "attention: q length");
    assert_eq!(out.len(), n_heads * head_dim, "attention: out length");
    assert!(
        k_cache.len() >= n_pos * kv_dim,
        "attention: k_cache too short"
    );
    assert!(
        v_cache.len() >= n_pos * kv_dim,
        "attention: v_cache too short"
    );
    let group = n_heads / n_kv_heads;
    let mut scores = vec![0.0f32; n_pos - first];
    let mut key = vec![0.0f32; head_dim];
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let at = |t: usize| t * kv_dim + kvh * head_dim..t * kv_dim + (kvh + 1) * head_dim;
        for (i, s) in scores.iter_mut().enumerate() {
            for (r, &x) in key.iter_mut().zip(&k_cache[at(first + i)]) {
                *r = x.into();
            }
            *s = dot(qh, &key) * scale;
        }
        softmax(&mut scores);
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        oh.fill(0.0);
        for (i, &p) in scores.iter().enumerate() {
            for (o, &v) in oh.iter_mut().zip(&v_cache[at(first + i)]) {
                *o += p * v.into();
            }
        }
    }
}

/// In-place softmax: `x_i = exp(x_i − max) / Σ_j exp(x_j − max)`. Subtracting the maximum
/// keeps large inputs finite. An empty slice is left as is.
pub fn softmax(x: &mut [f32]) {
    let Some(max) = x.iter().copied().reduce(f32::max) else {
        return;
    };
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `silu(x) = x / (1 + exp(−x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU: `out_i = silu(gate_i) · up_i` (all three the same length).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: up length");
    assert_eq!(gate.len(), out.len(), "swiglu: out length");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// GELU, tanh approximation (ggml's `ggml_gelu`, PyTorch's `gelu(approximate="tanh")`):
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, evaluated in f64.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let c = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// GeGLU: `out_i = gelu_tanh(gate_i) · up_i` (all three the same length).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: up length");
    assert_eq!(gate.len(), out.len(), "geglu: out length");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// [`rmsnorm`] of each `weight.len()`-element head of `x`, in place, every head with the
/// same weight (qwen3's and gemma3's Q/K norms).
pub fn rmsnorm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    let hd = weight.len();
    assert!(
        hd > 0 && x.len().is_multiple_of(hd),
        "rmsnorm_heads: x length"
    );
    let mut out = vec![0.0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        rmsnorm(head, weight, eps, &mut out);
        head.copy_from_slice(&out);
    }
}

/// Final logit softcapping, in place: `x_i = cap·tanh(x_i / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// `dst = src` as f16: a KV-cache row as the engine stores it (f16, llama.cpp's default
/// cache type).
pub fn store_f16(dst: &mut [f16], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

/// Residual add: `acc_i += b_i` (same length).
pub fn add(acc: &mut [f32], b: &[f32]) {
    assert_eq!(acc.len(), b.len(), "add: length mismatch");
    for (a, &v) in acc.iter_mut().zip(b) {
        *a += v;
    }
}

/// Index of the first maximum of `x` (NaNs never win; 0 for an empty slice).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best
}
