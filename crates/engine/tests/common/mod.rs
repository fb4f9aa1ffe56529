//! Shared helpers of the GPU tests: a validating context, buffers from host data,
//! model paths.
#![allow(dead_code)]

pub mod gpu;

use std::path::PathBuf;
use std::sync::Arc;

use vk::{Buffer, BufferDesc, Context, MemLocation};

/// A validating context, or `None` (skip) when no device exists and
/// VKDECODE_ALLOW_NO_GPU=1; without that variable a missing device fails the test.
pub fn ctx() -> Option<Arc<Context>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("warn")
        .try_init();
    vk::testing::validating_context()
}

/// Largest |gpu - reference| logit allowed on the real models (logits of O(10); a wrong
/// row, tile bound, scale or norm moves them by O(1)). Both sides keep keys and values as
/// f16; a key whose f32 values on the two sides (or on two GPU paths that sum in another
/// order) straddle an f16 rounding edge is stored one f16 step apart (about 1 key in 400:
/// tests/kernels_arch.rs), which attention carries to the logits: up to 0.0042 (SmolLM2,
/// second position) and 0.0054 (Gemma 3, 600 tokens) measured, where f32 caches held
/// within 0.002.
#[allow(dead_code)]
pub const LOGIT_TOL: f32 = 0.01;

/// A host-visible storage buffer holding `data` (at least 16 bytes).
pub fn upload<T: bytemuck::Pod>(ctx: &Arc<Context>, name: &str, data: &[T]) -> Buffer {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let size = (bytes.len() as u64).max(16).next_multiple_of(4);
    let b = Buffer::new(ctx, &BufferDesc::storage(name, size, MemLocation::GpuToCpu)).unwrap();
    let mut padded = bytes.to_vec();
    padded.resize(size as usize, 0);
    b.write(0, &padded).unwrap();
    b
}

/// A zeroed host-visible buffer of `n` f32.
pub fn zeros(ctx: &Arc<Context>, name: &str, n: usize) -> Buffer {
    upload(ctx, name, &vec![0.0f32; n.max(4)])
}

pub fn read_f32(b: &Buffer, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    b.read(0, &mut out).unwrap();
    out
}

/// A zeroed host-visible KV cache of `n` f16 elements (the engine's cache type).
pub fn zeros_f16(ctx: &Arc<Context>, name: &str, n: usize) -> Buffer {
    upload(ctx, name, &vec![half::f16::ZERO; n.max(8)])
}

/// A KV cache of f16 elements holding `data` (each value rounded to f16).
pub fn upload_f16(ctx: &Arc<Context>, name: &str, data: &[f32]) -> Buffer {
    let h: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
    upload(ctx, name, &h)
}

/// The first `n` f16 elements of a KV cache, as f32.
pub fn read_f16(b: &Buffer, n: usize) -> Vec<f32> {
    let mut out = vec![half::f16::ZERO; n];
    b.read(0, &mut out).unwrap();
    out.iter().map(|h| h.to_f32()).collect()
}

/// `x` rounded to f16 and back: what a KV cache holds of it.
pub fn f16_round(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// The step buffer: header (pos0), rope frequencies, token ids, then token t's position
/// and cache row, both `pos0 + t` (one sequence from cache row 0).
pub fn step_buffer(ctx: &Arc<Context>, pos0: u32, freqs: &[f32], tokens: &[u32]) -> Buffer {
    use engine::kernels::{STEP_FREQS_MAX, STEP_MAX_BATCH};
    let mut words = vec![0u32; 4 + STEP_FREQS_MAX];
    words[0] = pos0;
    for (i, f) in freqs.iter().enumerate() {
        words[4 + i] = f.to_bits();
    }
    let mut ids = tokens.to_vec();
    ids.resize(STEP_MAX_BATCH, 0);
    words.extend_from_slice(&ids);
    let pos = (0..STEP_MAX_BATCH as u32).map(|t| pos0 + t);
    words.extend(pos.clone());
    words.extend(pos);
    upload(ctx, "step", &words)
}

/// `models/<name>` of the workspace; fails the test with a hint when missing.
pub fn model_path(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run models/fetch (it downloads and converts the default model)",
        p.display()
    );
    p
}

/// Asserts the validation layer stayed quiet.
pub fn assert_no_validation_errors(ctx: &Context) {
    assert_eq!(
        ctx.validation_errors(),
        0,
        "validation layer messages were logged (see the test output)"
    );
}
