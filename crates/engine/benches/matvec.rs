//! criterion: the decode matvec (`matmul.comp` with the engine's decode shape, one token)
//! on Q8_0 and Q4_1 weights at the default model's shapes, on Q8_0 and the K-quants at
//! shapes whose rows are whole super-blocks, and on Q8_0 at Gemma 3 270M's 640-column
//! shapes (its output head among them), in GB/s of weight bytes read.
//!
//! Each iteration submits one pre-recorded command buffer (the dispatch, then a host
//! barrier) and waits on its fence, so the clock stops only once the GPU is done.
//! Weights are random but valid blocks (finite f16 scales) in a GPU buffer, bound through
//! the same texel views, descriptor layout, push constants and `matmul_layout` as the
//! engine's decode path. The `x16` variants record the dispatch 16 times in one command
//! buffer (a barrier between, as in a decode token), so the ~70 us of submit + fence wait
//! is spread over 16 matvecs and the GB/s is closer to the kernel's own; but they reread
//! one matrix, which the caches keep. The `cold` variants (at the K shapes) stream 64 MiB
//! of copies per submission, so every dispatch reads its weights from memory as a decode
//! token does ([`Cold`]). Before timing, each shape's output is checked against
//! `reference::kernels::matmul`, so a broken kernel cannot post a fast figure.
//!
//! `cargo bench -p engine --bench matvec [-- --quick]`. No Vulkan device: fails, unless
//! VKDECODE_ALLOW_NO_GPU=1 (then it prints a note and returns).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::kernels::{self, Batch, InMode, Kernels, MatmulBindings, MatmulPush, OutMode, Slot};
use engine::kernels::{MatmulVariant, CPU};
use gguf::GgmlType;
use vk::{
    Buffer, BufferDesc, BufferView, CommandBuffer, Context, ContextOptions, MemLocation,
    TexelFormat,
};

/// (input length = columns, output length = rows) of SmolLM2-135M's decode matvecs:
/// q / attn_output, k and v, gate and up, down, and the logits (tied embedding).
const SHAPES: [(usize, usize, &str); 5] = [
    (576, 576, "q,o"),
    (576, 192, "k,v"),
    (576, 1536, "gate,up"),
    (1536, 576, "down"),
    (576, 49152, "logits"),
];

/// Shapes whose rows are whole K-quant super-blocks (a multiple of 256 columns), where
/// the K types are compared with Q8_0 at the same shape: SmolLM2's ffn_down, Gemma 3
/// 270M's ffn_down, and a larger matrix (17.8 MB in Q8_0) that no CPU cache holds.
const K_SHAPES: [(usize, usize, &str); 3] = [
    (1536, 576, "down"),
    (2048, 640, "gemma down"),
    (2048, 8192, "large"),
];

/// Gemma 3 270M's 640-column matvecs in Q8_0: gate/up, and the tied embedding as the
/// output head (262144 rows, 178 MB: the bulk of a Gemma decode token), so the head's GB/s
/// can be set against a small matrix of the same row length in one run.
const GEMMA_SHAPES: [(usize, usize, &str); 2] =
    [(640, 2048, "gemma gate"), (640, 262_144, "gemma logits")];

/// The types timed at [`SHAPES`] and, with Q8_0 as the yardstick, at [`K_SHAPES`].
const TYPES: [GgmlType; 2] = [GgmlType::Q8_0, GgmlType::Q4_1];
const K_TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
];

/// Dispatches per submission in the `x16` variants.
const REPEAT: usize = 16;

/// Dependency-free xorshift64*: the blocks only need to be valid, not good random numbers.
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
        let v = (self.next() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        let s = (0.004 + 0.06 * v) * if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        half::f16::from_f32(s).to_le_bytes()
    }
}

/// `rows × cols` weights of `ty` as raw GGUF blocks: random quants, valid scales (the
/// K-quants: random weights in [-1, 1) through gguf's quantiser, so every header is one
/// the format can hold).
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if ty.block_size() == gguf::quant::QK_K {
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect();
        return gguf::quant::quantize(ty, &x).expect("quantize");
    }
    let n_blocks = rows * cols / ty.block_size();
    let bs = ty.type_size();
    let mut out = vec![0u8; n_blocks * bs];
    for block in out.chunks_exact_mut(bs) {
        for chunk in block.chunks_mut(8) {
            let r = rng.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        // Q8_0: d, then 32 int8; Q4_1: d, m, then 16 bytes of nibbles.
        block[0..2].copy_from_slice(&rng.scale());
        if ty == GgmlType::Q4_1 {
            block[2..4].copy_from_slice(&rng.scale());
        }
    }
    out
}

/// A host-writable storage buffer holding `data` (padded to 16 bytes and to a word).
fn upload<T: bytemuck::Pod>(ctx: &Arc<Context>, name: &str, data: &[T]) -> Buffer {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    // A multiple of 16 bytes: quantised weights are read as 16-byte texels.
    let size = (bytes.len() as u64).max(16).next_multiple_of(16);
    let b =
        Buffer::new(ctx, &BufferDesc::storage(name, size, MemLocation::CpuToGpu)).expect("buffer");
    let mut padded = bytes.to_vec();
    padded.resize(size as usize, 0);
    b.write(0, &padded).expect("upload");
    b
}

/// Bytes the `cold` variants stream per submission: twice this machine's 32 MiB L3, so
/// a matrix is gone from every cache level by the time its turn comes round again.
const COLD_BYTES: usize = 64 << 20;

/// One matrix laid `copies` times end to end in one buffer (each copy at a 256-byte
/// boundary), for the `cold` variants: a submission dispatches the matvec once per copy,
/// a barrier between, so every dispatch reads weights no cache holds, as each matrix of a
/// decode token is read once per token from memory. The `x16` variants reread one copy,
/// which the caches keep from the second dispatch on for all but the largest shape: they
/// measure a cache-resident kernel, where a type that decodes more arithmetic per byte
/// (the K-quants) loses to one that reads more bytes (Q8_0) for a reason the model never
/// meets.
struct Cold {
    view: BufferView,
    _buf: Buffer,
    stride: usize,
    copies: usize,
}

impl Cold {
    fn new(ctx: &Arc<Context>, w: &[u8], format: TexelFormat) -> Cold {
        let stride = w.len().next_multiple_of(256);
        let copies = COLD_BYTES.div_ceil(stride).max(REPEAT);
        let mut all = vec![0u8; stride * copies];
        for c in all.chunks_exact_mut(stride) {
            c[..w.len()].copy_from_slice(w);
        }
        let buf = upload(ctx, "w cold", &all);
        let view = BufferView::new(ctx, buf.binding(), format).expect("view");
        Cold {
            view,
            _buf: buf,
            stride,
            copies,
        }
    }

    /// The word offset of copy `i`.
    fn wofs(&self, i: usize) -> u32 {
        u32::try_from(i * self.stride / 4).expect("offset")
    }
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

fn matvec(c: &mut Criterion) {
    let Some(ctx) = context() else { return };
    let mut ks = Kernels::new(&ctx).expect("kernels");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let dummy = upload(&ctx, "dummy", &[0f32; 4]);
    let mut step_words = vec![0u32; (kernels::STEP_TOKENS_OFFSET / 4) as usize + 4];
    step_words[0] = 0; // pos0
    let step = upload(&ctx, "step", &step_words);

    let mut group = c.benchmark_group("matvec");
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let runs = TYPES
        .iter()
        .flat_map(|&ty| SHAPES.iter().map(move |&s| (ty, s)))
        .chain(
            K_SHAPES
                .iter()
                .flat_map(|&s| K_TYPES.iter().map(move |&ty| (ty, s)))
                .filter(|(ty, s)| !(TYPES.contains(ty) && SHAPES.contains(s))),
        )
        .chain(GEMMA_SHAPES.iter().map(|&s| (GgmlType::Q8_0, s)));
    for (ty, (cols, rows, what)) in runs {
        let format = kernels::weight_texel_format(ty);
        let dummy_w = BufferView::new(&ctx, dummy.binding(), format).expect("view");
        {
            let w = random_blocks(ty, rows, cols, &mut rng);
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let wbuf = upload(&ctx, "w", &w);
            let wv = BufferView::new(&ctx, wbuf.binding(), format).expect("view");
            let xbuf = upload(&ctx, "x", &x);
            let xv = BufferView::new(&ctx, xbuf.binding(), TexelFormat::Rgba32Float).expect("view");
            let out = upload(&ctx, "out", &vec![0f32; rows]);
            // the engine's decode key for a plain matvec added to the residual (attn_output,
            // ffn_down: see model::matmul_key), its row pairs balanced for this device's
            // threads as the engine's are
            let split_k = ks.column_split(CPU.decode.wg, cols as u32);
            // at word 0 (the cold copies: at multiples of 64 words)
            let slots = [Slot {
                slot: 0,
                nrows: rows as u32,
                wofs: 0,
                orow: 0,
            }];
            let variant = MatmulVariant {
                wtype: ty,
                in_mode: InMode::Plain,
                out_mode: OutMode::Add,
                last_token_only: false,
                split_k,
                pairs: ks.decode_pairs(split_k, false, &[rows as u32]),
                texel_aligned: kernels::k_texel_aligned(ty, &slots),
            };
            let key = ks.matmul_key(&variant, Batch::Decode);
            let p = ks.matmul(key).expect("matmul pipeline");
            // the weights `w` behind binding 0, the rest as the engine binds a plain matvec
            let set_over = |w: &BufferView| {
                p.descriptor_set_with(
                    &MatmulBindings {
                        w0: w,
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
                .expect("descriptor set")
            };
            let set = set_over(&wv);
            let mut push = MatmulPush {
                n_tok: 1,
                ncols: cols as u32,
                x_ld: cols as u32,
                out_ld: rows as u32,
                ..Default::default()
            };
            let groups = kernels::matmul_layout(&key, &mut push, &slots);
            let mut cmd = CommandBuffer::new(&ctx).expect("command buffer");
            cmd.begin().expect("begin");
            cmd.dispatch(p, &set, bytemuck::bytes_of(&push), groups);
            cmd.host_barrier();
            cmd.end().expect("end");

            // one checked run (also compiles the pipeline on lavapipe) before timing
            ctx.submit_and_wait(&cmd).expect("submit");
            let mut got = vec![0f32; rows];
            out.read(0, &mut got).expect("read back");
            let mut want = vec![0f32; rows];
            reference::kernels::matmul(ty, &w, rows, cols, &x, 1, &mut want).expect("reference");
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (r, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-4 * scale + 1e-5,
                    "{ty:?} {cols}->{rows}: row {r}: gpu {g} vs reference {e}"
                );
            }

            group.throughput(Throughput::BytesDecimal(w.len() as u64));
            let id = BenchmarkId::new(format!("{ty:?}"), format!("{cols}x{rows} {what}"));
            group.bench_function(id, |b| {
                b.iter(|| ctx.submit_and_wait(&cmd).expect("submit"));
            });

            // the same dispatch REPEAT times in one submission, a barrier between them (as
            // in a decode token): the submit + fence cost is spread over REPEAT matvecs
            let mut rep = CommandBuffer::new(&ctx).expect("command buffer");
            rep.begin().expect("begin");
            for _ in 0..REPEAT {
                rep.dispatch(p, &set, bytemuck::bytes_of(&push), groups);
                rep.barrier();
            }
            rep.host_barrier();
            rep.end().expect("end");
            ctx.submit_and_wait(&rep).expect("submit");
            group.throughput(Throughput::BytesDecimal(REPEAT as u64 * w.len() as u64));
            let id = BenchmarkId::new(format!("{ty:?} x{REPEAT}"), format!("{cols}x{rows} {what}"));
            group.bench_function(id, |b| {
                b.iter(|| ctx.submit_and_wait(&rep).expect("submit"));
            });

            if K_SHAPES.contains(&(cols, rows, what)) {
                let cold = Cold::new(&ctx, &w, format);
                let set = set_over(&cold.view);
                let dispatch_copy = |cmd: &mut CommandBuffer, i: usize| {
                    let mut push = push;
                    let slots = [Slot {
                        wofs: cold.wofs(i),
                        ..slots[0]
                    }];
                    let groups = kernels::matmul_layout(&key, &mut push, &slots);
                    cmd.dispatch(p, &set, bytemuck::bytes_of(&push), groups);
                };
                // the last copy alone, on a zeroed output: the offsets must be right
                out.write(0, &vec![0f32; rows]).expect("zero");
                let mut last = CommandBuffer::new(&ctx).expect("command buffer");
                last.begin().expect("begin");
                dispatch_copy(&mut last, cold.copies - 1);
                last.host_barrier();
                last.end().expect("end");
                ctx.submit_and_wait(&last).expect("submit");
                out.read(0, &mut got).expect("read back");
                for (r, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * scale + 1e-5,
                        "{ty:?} {cols}->{rows} cold copy: row {r}: gpu {g} vs reference {e}"
                    );
                }
                let mut all = CommandBuffer::new(&ctx).expect("command buffer");
                all.begin().expect("begin");
                for i in 0..cold.copies {
                    dispatch_copy(&mut all, i);
                    all.barrier();
                }
                all.host_barrier();
                all.end().expect("end");
                group.throughput(Throughput::BytesDecimal(
                    cold.copies as u64 * w.len() as u64,
                ));
                let id = BenchmarkId::new(format!("{ty:?} cold"), format!("{cols}x{rows} {what}"));
                group.bench_function(id, |b| {
                    b.iter(|| ctx.submit_and_wait(&all).expect("submit"));
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, matvec);
criterion_main!(benches);
