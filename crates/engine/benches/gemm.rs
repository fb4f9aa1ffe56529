//! criterion: the prefill GEMM (`matmul_mm.comp`) against the 4-token matmul it replaces
//! (`matmul.comp`, tb = 4), on Q8_0 and Q4_1 weights at the default model's shapes, for
//! a 64-token chunk; throughput in prompt tokens per second of that one matrix.
//!
//! Each iteration submits one pre-recorded command buffer holding the dispatch 8 times
//! (a barrier between) and waits on its fence. Before timing, every arm's output is
//! checked against `reference::kernels::matmul`, so a broken kernel cannot post a figure.
//! Shapes tried: `GEMM_PAIRS` row pairs per lane one after another (1, 2, 4).
//!
//! `cargo bench -p engine --bench gemm [-- --quick]`. No Vulkan device: fails, unless
//! VKDECODE_ALLOW_NO_GPU=1 (then it prints a note and returns).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::kernels::{
    self, InMode, Kernels, MatmulBindings, MatmulKey, MatmulPush, OutMode, Slot,
};
use engine::kernels::{CPU, GEMM_SHAPE};
use gguf::GgmlType;
use vk::{
    Buffer, BufferDesc, BufferView, CommandBuffer, Context, ContextOptions, MemLocation,
    TexelFormat,
};

/// (columns, rows) of SmolLM2-135M's prefill matmuls: q / attn_output, gate and up, down.
const SHAPES: [(usize, usize, &str); 3] = [
    (576, 576, "q,o"),
    (576, 1536, "gate,up"),
    (1536, 576, "down"),
];
/// Prompt tokens of one chunk.
const N_TOK: usize = 64;
/// Dispatches per submission.
const REPEAT: usize = 8;

/// Dependency-free xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A finite f16 in about ±[2^-8, 2^-4): a plausible block scale.
    fn scale(&mut self) -> [u8; 2] {
        let v = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        let s = (0.004 + 0.06 * v) * if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        half::f16::from_f32(s).to_le_bytes()
    }
}

/// `rows × cols` weights of `ty` as raw GGUF blocks: random quants, valid scales.
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let bs = ty.type_size();
    let mut out = vec![0u8; rows * cols / ty.block_size() * bs];
    for block in out.chunks_exact_mut(bs) {
        for chunk in block.chunks_mut(8) {
            let r = rng.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        block[0..2].copy_from_slice(&rng.scale());
        if ty == GgmlType::Q4_1 {
            block[2..4].copy_from_slice(&rng.scale());
        }
    }
    out
}

/// A host-writable storage buffer holding `data` (padded to 16 bytes).
fn upload<T: bytemuck::Pod>(ctx: &Arc<Context>, name: &str, data: &[T]) -> Buffer {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let size = (bytes.len() as u64).max(16).next_multiple_of(16);
    let b =
        Buffer::new(ctx, &BufferDesc::storage(name, size, MemLocation::CpuToGpu)).expect("buffer");
    let mut padded = bytes.to_vec();
    padded.resize(size as usize, 0);
    b.write(0, &padded).expect("upload");
    b
}

fn context() -> Option<Arc<Context>> {
    match Context::new(&ContextOptions {
        device_index: None,
        validate: false,
    }) {
        Ok(c) => Some(c),
        Err(e) if std::env::var("VKDECODE_ALLOW_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("note: no Vulkan device ({e}); skipping (VKDECODE_ALLOW_NO_GPU=1)");
            None
        }
        Err(e) => panic!("no usable Vulkan device: {e} (set VKDECODE_ALLOW_NO_GPU=1 to skip)"),
    }
}

fn gemm(c: &mut Criterion) {
    let Some(ctx) = context() else { return };
    let mut ks = Kernels::new(&ctx).expect("kernels");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let dummy = upload(&ctx, "dummy", &[0f32; 4]);
    let step = upload(
        &ctx,
        "step",
        &vec![0u32; (kernels::STEP_TOKENS_OFFSET / 4) as usize + N_TOK],
    );
    let mut arms = vec![("matvec tb4".to_string(), CPU.prefill)];
    for pairs in [2, 4, 8] {
        let mut s = GEMM_SHAPE;
        s.pairs = pairs;
        arms.push((format!("gemm t{} p{pairs}", s.tb), s));
    }

    let mut group = c.benchmark_group("prefill_matmul");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(2));
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let format = kernels::weight_texel_format(ty);
        let dummy_w = BufferView::new(&ctx, dummy.binding(), format).expect("view");
        for &(cols, rows, what) in &SHAPES {
            let w = random_blocks(ty, rows, cols, &mut rng);
            let x: Vec<f32> = (0..cols * N_TOK)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let wbuf = upload(&ctx, "w", &w);
            let wv = BufferView::new(&ctx, wbuf.binding(), format).expect("view");
            let xbuf = upload(&ctx, "x", &x);
            let xv = BufferView::new(&ctx, xbuf.binding(), TexelFormat::Rgba32Float).expect("view");
            let out = upload(&ctx, "out", &vec![0f32; rows * N_TOK]);
            let mut want = vec![0f32; rows * N_TOK];
            reference::kernels::matmul(ty, &w, rows, cols, &x, N_TOK, &mut want)
                .expect("reference");
            let mag = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (arm, shape) in &arms {
                let slots = [Slot {
                    slot: 0,
                    nrows: rows as u32,
                    wofs: 0,
                    orow: 0,
                }];
                let key = MatmulKey {
                    wtype: ty,
                    in_mode: InMode::Plain,
                    out_mode: OutMode::Add,
                    wg: shape.wg,
                    pairs: shape.pairs,
                    tb: shape.tb,
                    split_k: 0,
                    texel_aligned: kernels::k_texel_aligned(ty, &slots),
                };
                let p = ks.matmul(key).expect("matmul pipeline");
                let set = p
                    .descriptor_set_with(
                        &MatmulBindings {
                            w0: &wv,
                            w1: &dummy_w,
                            x: &xv,
                            aux: dummy.binding(),
                            out0: out.binding(),
                            out1: dummy.binding(),
                            out2: dummy.binding(),
                            step: step.binding(),
                            xr: &xv,
                        }
                        .descriptors(),
                    )
                    .expect("descriptor set");
                let mut push = MatmulPush {
                    n_tok: N_TOK as u32,
                    ncols: cols as u32,
                    x_ld: cols as u32,
                    out_ld: rows as u32,
                    ..Default::default()
                };
                let groups = kernels::matmul_layout(&key, &mut push, &slots);
                let record = |n: usize| {
                    let mut cmd = CommandBuffer::new(&ctx).expect("command buffer");
                    cmd.begin().expect("begin");
                    for _ in 0..n {
                        cmd.dispatch(p, &set, bytemuck::bytes_of(&push), groups);
                        cmd.barrier();
                    }
                    cmd.host_barrier();
                    cmd.end().expect("end");
                    cmd
                };
                // one checked run (out starts at zero; Add adds) before timing
                out.write(0, &vec![0f32; rows * N_TOK]).expect("zero");
                ctx.submit_and_wait(&record(1)).expect("submit");
                let mut got = vec![0f32; rows * N_TOK];
                out.read(0, &mut got).expect("read back");
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * mag + 1e-5,
                        "{arm} {ty:?} {cols}->{rows}: token {} row {}: gpu {g} vs reference {e}",
                        i / rows,
                        i % rows
                    );
                }
                let cmd = record(REPEAT);
                group.throughput(Throughput::Elements((REPEAT * N_TOK) as u64));
                let id = BenchmarkId::new(format!("{ty:?} {arm}"), format!("{cols}x{rows} {what}"));
                group.bench_function(id, |b| {
                    b.iter(|| ctx.submit_and_wait(&cmd).expect("submit"));
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, gemm);
criterion_main!(benches);
