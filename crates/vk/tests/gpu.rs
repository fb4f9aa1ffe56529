//! GPU tests of the runtime on whatever device is present (lavapipe in CI), with the
//! validation layer on: every test ends asserting zero validation messages.

use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use vk::checksum::{self, ChecksumPush};
use vk::{
    Buffer, BufferDesc, CommandBuffer, Context, ContextOptions, DescriptorKind, ImportedBuffer,
    MemLocation, Pipeline, PipelineDesc, QueryPool,
};

/// A validating context, or `None` (skip) when no device exists and
/// VKDECODE_ALLOW_NO_GPU=1; without that variable a missing device fails the test.
///
/// The tests of this file run one at a time (the context holds a lock until it drops):
/// once in CI (Mesa 22.3.6 lavapipe, the validation layer on, the machine loaded) this
/// binary died of SIGSEGV with two tests left running side by side, each on its own
/// device (every_kernel_builds_a_pipeline compiling every kernel, and
/// timestamps_and_host_waits); six reruns alone did not repeat it. Until the cause is
/// known, this file gives it no second device to race with.
fn ctx() -> Option<Serial> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("warn")
        .try_init();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    Some(Serial {
        ctx: vk::testing::validating_context()?,
        _guard: guard,
    })
}

/// A context and the lock that keeps this file's tests apart; the context is dropped
/// (its device destroyed) before the lock is released.
struct Serial {
    ctx: Arc<Context>,
    _guard: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Serial {
    type Target = Arc<Context>;
    fn deref(&self) -> &Arc<Context> {
        &self.ctx
    }
}

fn checksum_pipeline(ctx: &Arc<Context>) -> Pipeline {
    checksum::pipeline(ctx).expect("checksum pipeline")
}

/// Runs checksum.comp over parts `(binding, byte_offset, n_bytes, word_base)` all
/// adding into one pair of sums; returns the sums.
fn gpu_checksum(ctx: &Arc<Context>, parts: &[(vk::BufferBinding, u32, u32, u32)]) -> [u32; 2] {
    let p = checksum_pipeline(ctx);
    let out = Buffer::new(ctx, &BufferDesc::storage("sums", 8, MemLocation::GpuToCpu)).unwrap();
    let sets: Vec<_> = parts
        .iter()
        .map(|(b, ..)| p.descriptor_set(&[b.clone(), out.binding()]).unwrap())
        .collect();
    let mut cmd = CommandBuffer::new(ctx).unwrap();
    cmd.begin().unwrap();
    cmd.fill(&out, 0, 8, 0);
    cmd.barrier();
    for ((_, off, n, base), set) in parts.iter().zip(&sets) {
        let push = ChecksumPush {
            byte_offset: *off,
            n_bytes: *n,
            word_base: *base,
            out_index: 0,
        };
        cmd.dispatch(
            &p,
            set,
            bytemuck::bytes_of(&push),
            [checksum::groups_for(u64::from(*n)), 1, 1],
        );
    }
    cmd.host_barrier();
    cmd.end().unwrap();
    ctx.submit_and_wait(&cmd).unwrap();
    let mut sums = [0u32; 2];
    out.read(0, &mut sums).unwrap();
    sums
}

/// A host-visible storage buffer of exactly `data`'s bytes, holding them.
fn host_buffer(ctx: &Arc<Context>, name: &str, data: &[u8]) -> Buffer {
    let b = Buffer::new(
        ctx,
        &BufferDesc::storage(name, data.len() as u64, MemLocation::CpuToGpu),
    )
    .unwrap();
    b.write(0, data).unwrap();
    b
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen()).collect()
}

/// vk's own kernel is embedded whole, with the layout its SPIR-V declares, and builds a
/// pipeline (the engine's kernels are held to the same in its `kernels` tests).
#[test]
fn the_checksum_kernel_builds_a_pipeline() {
    let Some(ctx) = ctx() else { return };
    let k = vk::CHECKSUM;
    assert_eq!(k.name(), "checksum");
    assert_eq!(k.bindings(), 2);
    assert_eq!(k.descriptor_kinds(), &[DescriptorKind::StorageBuffer; 2]);
    assert!(
        k.spirv().len() > 5 && k.spirv()[0] == 0x0723_0203,
        "not SPIR-V"
    );
    let p = Pipeline::new(
        &ctx,
        &PipelineDesc {
            kernel: k,
            n_bindings: 2,
            push_size: 16,
            spec: vec![],
        },
    );
    assert!(p.is_ok(), "{:?}", p.err());
    assert_eq!(ctx.validation_errors(), 0);
}

/// A context builds each distinct pipeline once and keeps it: the same description again,
/// or after every pipeline of it was dropped, reuses it (and runs); another push size,
/// binding count or specialisation is another pipeline.
#[test]
fn a_context_builds_each_pipeline_once() {
    let Some(ctx) = ctx() else { return };
    assert_eq!(ctx.pipelines_built(), 0);
    let a = checksum_pipeline(&ctx);
    let b = checksum_pipeline(&ctx);
    assert_eq!(ctx.pipelines_built(), 1);
    drop((a, b));
    let data = random_bytes(1000, 3);
    let buf = host_buffer(&ctx, "data", &data);
    assert_eq!(
        gpu_checksum(&ctx, &[(buf.binding(), 0, 1000, 0)]),
        checksum::cpu(&data, 0)
    );
    assert_eq!(ctx.pipelines_built(), 1);
    let other = |n_bindings: u32, push_size: u32, spec: Vec<u32>| {
        Pipeline::new(
            &ctx,
            &PipelineDesc {
                kernel: vk::CHECKSUM,
                n_bindings,
                push_size,
                spec,
            },
        )
        .expect("pipeline")
    };
    other(2, 32, vec![]);
    assert_eq!(ctx.pipelines_built(), 2);
    other(3, 16, vec![]);
    assert_eq!(ctx.pipelines_built(), 3);
    other(2, 16, vec![7]);
    other(2, 16, vec![7]);
    assert_eq!(ctx.pipelines_built(), 4);
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn capabilities_are_read_from_the_driver() {
    let Some(ctx) = ctx() else { return };
    let c = ctx.caps();
    assert!(!c.name.is_empty());
    assert!(c.api_version >= (1, 2, 0));
    assert!(c.max_storage_buffer_range > 0 && c.min_storage_buffer_offset_alignment > 0);
    assert!(c.max_memory_allocation_size > 0);
    assert!(!c.memory_types.is_empty() && !c.memory_heaps.is_empty());
    if c.external_memory_host {
        let a = c.min_imported_host_pointer_alignment.unwrap();
        assert!(a.is_power_of_two(), "alignment {a}");
    }
    let all = vk::enumerate_devices().unwrap();
    assert!(all.iter().any(|d| d.name == c.name));
    // The chosen device is the best-ranked suitable one.
    let best = all
        .iter()
        .filter(|d| d.unsuitable.is_none())
        .map(|d| d.device_type.rank())
        .min()
        .unwrap();
    assert_eq!(c.device_type.rank(), best);
    assert!(format!("{c}").contains("maxStorageBufferRange"));
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn device_index_out_of_range_is_an_error() {
    if ctx().is_none() {
        return;
    }
    let err = Context::new(&ContextOptions {
        device_index: Some(999),
        validate: false,
    })
    .unwrap_err();
    assert!(err.to_string().contains("999"), "{err}");
}

#[test]
fn buffer_write_read_and_bounds() {
    let Some(ctx) = ctx() else { return };
    let b = Buffer::new(&ctx, &BufferDesc::storage("rw", 64, MemLocation::CpuToGpu)).unwrap();
    let data: Vec<u32> = (0..16).collect();
    b.write(0, &data).unwrap();
    let mut back = [0u32; 4];
    b.read(16, &mut back).unwrap();
    assert_eq!(back, [4, 5, 6, 7]);
    let err = b.write(60, &[1u32, 2]).unwrap_err();
    assert!(err.to_string().contains("outside buffer `rw`"), "{err}");
    assert!(b.read(u64::MAX, &mut back).is_err());
    assert!(ctx.device_bytes() >= 64);
    assert!(Buffer::new(&ctx, &BufferDesc::storage("empty", 0, MemLocation::GpuOnly)).is_err());
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn allocations_are_counted_as_they_are_made_and_freed() {
    let Some(ctx) = ctx() else { return };
    assert_eq!((ctx.live_allocations(), ctx.total_allocations()), (0, 0));
    let a = Buffer::new(&ctx, &BufferDesc::storage("a", 64, MemLocation::GpuOnly)).unwrap();
    let b = Buffer::new(&ctx, &BufferDesc::storage("b", 64, MemLocation::GpuToCpu)).unwrap();
    assert_eq!((ctx.live_allocations(), ctx.total_allocations()), (2, 2));
    drop(a);
    assert_eq!((ctx.live_allocations(), ctx.total_allocations()), (1, 2));
    // a refused buffer is not counted
    assert!(Buffer::new(&ctx, &BufferDesc::storage("empty", 0, MemLocation::GpuOnly)).is_err());
    drop(b);
    assert_eq!((ctx.live_allocations(), ctx.total_allocations()), (0, 2));
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn checksum_kernel_matches_cpu_on_odd_lengths_and_parts() {
    let Some(ctx) = ctx() else { return };
    let data = random_bytes(1_000_003, 7);
    let buf = Buffer::new(
        &ctx,
        &BufferDesc::storage("data", 1_000_004, MemLocation::CpuToGpu),
    )
    .unwrap();
    let mut padded = data.clone();
    padded.push(0xAB); // garbage past the range must be masked out
    buf.write(0, &padded).unwrap();
    let whole = gpu_checksum(&ctx, &[(buf.binding(), 0, data.len() as u32, 0)]);
    assert_eq!(whole, checksum::cpu(&data, 0));
    // Two parts, the second bound at an aligned offset with a residual byte offset.
    let split = 400_020u32; // multiple of 4
    let align = ctx.caps().min_storage_buffer_offset_alignment;
    let bind_off = u64::from(split) / align * align;
    let rest = u64::from(split) - bind_off;
    let b2 = buf.binding_range(bind_off, 1_000_004 - bind_off);
    let parts = gpu_checksum(
        &ctx,
        &[
            (buf.binding_range(0, u64::from(split)), 0, split, 0),
            (b2, rest as u32, data.len() as u32 - split, split / 4),
        ],
    );
    assert_eq!(parts, whole);
    // One changed byte changes the GPU sum.
    buf.write(500_000, &[data[500_000] ^ 0x10]).unwrap();
    assert_ne!(
        gpu_checksum(&ctx, &[(buf.binding(), 0, data.len() as u32, 0)]),
        whole
    );
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn staging_copy_and_fill_reach_device_buffers() {
    let Some(ctx) = ctx() else { return };
    let data = random_bytes(3 << 20, 11);
    let staging = host_buffer(&ctx, "staging", &data);
    let dev = Buffer::new(
        &ctx,
        &BufferDesc::storage("dev", data.len() as u64 + 256, MemLocation::GpuOnly),
    )
    .unwrap();
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    cmd.begin().unwrap();
    cmd.fill(&dev, 0, dev.size(), 0xFFFF_FFFF);
    cmd.barrier();
    cmd.copy_buffer(&staging, &dev, &[(0, 256, data.len() as u64)]);
    cmd.barrier();
    cmd.end().unwrap();
    ctx.submit_and_wait(&cmd).unwrap();
    let got = gpu_checksum(&ctx, &[(dev.binding(), 256, data.len() as u32, 0)]);
    assert_eq!(got, checksum::cpu(&data, 0));
    let head = gpu_checksum(&ctx, &[(dev.binding(), 0, 256, 0)]);
    assert_eq!(head, checksum::cpu(&[0xFF; 256], 0));
    assert_eq!(ctx.validation_errors(), 0);
}

/// Page-aligned host memory, freed on drop.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}
impl Aligned {
    fn new(len: usize, align: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, align).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }
    fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: allocated with this length, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}
impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[test]
fn imported_host_memory_is_read_in_place() {
    let Some(ctx) = ctx() else { return };
    if !ctx.caps().external_memory_host {
        eprintln!("device has no VK_EXT_external_memory_host; nothing to test");
        return;
    }
    let align = ctx.caps().min_imported_host_pointer_alignment.unwrap() as usize;
    let len = 64 * align;
    let mut host = Aligned::new(len, align);
    let data = random_bytes(len, 3);
    host.slice_mut().copy_from_slice(&data);
    // SAFETY: `host` is aligned, `len` long, and outlives `imp` (dropped first below).
    let imp = unsafe { ImportedBuffer::import(&ctx, host.ptr, len as u64, Arc::new(())) }.unwrap();
    assert_eq!(ctx.imported_bytes(), len as u64);
    assert_eq!(ctx.live_allocations(), 1);
    assert_eq!(
        gpu_checksum(&ctx, &[(imp.binding(), 0, len as u32, 0)]),
        checksum::cpu(&data, 0)
    );
    // The GPU sees host writes made after the import: no copy was taken.
    host.slice_mut()[100] ^= 0xFF;
    let mut changed = data.clone();
    changed[100] ^= 0xFF;
    assert_eq!(
        gpu_checksum(&ctx, &[(imp.binding(), 0, len as u32, 0)]),
        checksum::cpu(&changed, 0)
    );
    drop(imp);
    assert_eq!(ctx.imported_bytes(), 0);
    assert_eq!(ctx.live_allocations(), 0);
    // Misaligned pointer or length is refused before the driver sees it.
    // SAFETY: refused before any driver call (alignment check).
    let err = unsafe { ImportedBuffer::import(&ctx, host.ptr.add(16), align as u64, Arc::new(())) }
        .unwrap_err();
    assert!(
        err.to_string().contains("minImportedHostPointerAlignment"),
        "{err}"
    );
    // SAFETY: as above.
    let err = unsafe { ImportedBuffer::import(&ctx, host.ptr, align as u64 + 4, Arc::new(())) }
        .unwrap_err();
    assert!(err.to_string().contains("multiples"), "{err}");
    drop(host);
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn timestamps_and_host_waits() {
    let Some(ctx) = ctx() else { return };
    let p = checksum_pipeline(&ctx);
    let data = random_bytes(1 << 20, 5);
    let buf = host_buffer(&ctx, "d", &data);
    let out = Buffer::new(&ctx, &BufferDesc::storage("o", 8, MemLocation::GpuToCpu)).unwrap();
    out.write(0, &[0u32, 0]).unwrap();
    let set = p.descriptor_set(&[buf.binding(), out.binding()]).unwrap();
    let q = QueryPool::new(&ctx, 2).unwrap();
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    let before = ctx.host_waits();
    for _ in 0..2 {
        cmd.begin().unwrap();
        cmd.reset_queries(&q, 0, 2);
        cmd.timestamp(&q, 0);
        let push = ChecksumPush {
            byte_offset: 0,
            n_bytes: data.len() as u32,
            word_base: 0,
            out_index: 0,
        };
        cmd.dispatch(
            &p,
            &set,
            bytemuck::bytes_of(&push),
            [checksum::groups_for(data.len() as u64), 1, 1],
        );
        cmd.timestamp(&q, 1);
        cmd.host_barrier();
        cmd.end().unwrap();
        ctx.submit_and_wait(&cmd).unwrap();
        let t = q.read_ns(0, 2).unwrap();
        assert!(t[1] >= t[0], "{t:?}");
    }
    assert_eq!(ctx.host_waits() - before, 2);
    // Two runs added twice.
    let mut sums = [0u32; 2];
    out.read(0, &mut sums).unwrap();
    let one = checksum::cpu(&data, 0);
    assert_eq!(sums, checksum::combine(one, one));
    assert!(q.read_ns(1, 2).is_err());
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn recording_errors_surface_at_end() {
    let Some(ctx) = ctx() else { return };
    let p = checksum_pipeline(&ctx);
    let buf = Buffer::new(&ctx, &BufferDesc::storage("b", 64, MemLocation::GpuOnly)).unwrap();
    let set = p.descriptor_set(&[buf.binding(), buf.binding()]).unwrap();
    assert!(p.descriptor_set(&[buf.binding()]).is_err());
    assert!(
        p.descriptor_set(&[buf.binding_range(4, 16), buf.binding()])
            .is_err()
            || ctx.caps().min_storage_buffer_offset_alignment <= 4
    );
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    cmd.begin().unwrap();
    cmd.dispatch(&p, &set, &[0u8; 20], [1, 1, 1]); // push too large
    let err = cmd.end().unwrap_err();
    assert!(err.to_string().contains("push bytes"), "{err}");
    assert!(ctx.submit_and_wait(&cmd).is_err());
    assert!(Pipeline::new(
        &ctx,
        &PipelineDesc {
            kernel: vk::CHECKSUM,
            n_bindings: 2,
            push_size: 6,
            spec: vec![]
        }
    )
    .is_err());
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn handles_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Context>();
    send_sync::<Buffer>();
    send_sync::<ImportedBuffer>();
    send_sync::<Pipeline>();
    send_sync::<vk::DescriptorSet>();
    fn send<T: Send>() {}
    send::<CommandBuffer>();
    send::<QueryPool>();
}

/// A descriptor set holds the buffers it binds, and a recording holds its pipeline, sets
/// and copy/fill targets: dropping the owners' handles before the submission is safe,
/// and the memory goes when the last holder does.
#[test]
fn sets_and_recordings_keep_what_they_bind_alive() {
    let Some(ctx) = ctx() else { return };
    let p = checksum_pipeline(&ctx);
    let data = random_bytes(4096, 9);
    let buf = host_buffer(&ctx, "data", &data);
    let out = Buffer::new(&ctx, &BufferDesc::storage("sums", 8, MemLocation::GpuToCpu)).unwrap();
    let set = p.descriptor_set(&[buf.binding(), out.binding()]).unwrap();
    drop(buf);
    assert_eq!(ctx.live_allocations(), 2, "the set holds `data`");
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    cmd.begin().unwrap();
    cmd.fill(&out, 0, 8, 0);
    cmd.barrier();
    let push = ChecksumPush {
        byte_offset: 0,
        n_bytes: 4096,
        word_base: 0,
        out_index: 0,
    };
    cmd.dispatch(
        &p,
        &set,
        bytemuck::bytes_of(&push),
        [checksum::groups_for(4096), 1, 1],
    );
    cmd.host_barrier();
    cmd.end().unwrap();
    drop(set);
    drop(p);
    ctx.submit_and_wait(&cmd).unwrap();
    let mut sums = [0u32; 2];
    out.read(0, &mut sums).unwrap();
    assert_eq!(sums, checksum::cpu(&data, 0));
    drop(cmd);
    assert_eq!(ctx.live_allocations(), 1, "only `sums` is left");
    drop(out);
    assert_eq!(ctx.live_allocations(), 0);
    assert_eq!(ctx.validation_errors(), 0);
}

/// A message whose id is not on the allow-list counts as an error, whatever it says; a
/// driver's message (id 0) does too. Only the ids in `vk::validation::ALLOWED` pass.
#[test]
fn a_message_not_on_the_allow_list_fails_the_run() {
    let Some(ctx) = ctx() else { return };
    assert!(ctx.validating());
    assert_eq!(ctx.validation_errors(), 0);
    // an id no layer uses, with text that reads harmless: still an error
    let unknown = 0x0bad_c0de;
    assert!(!vk::validation::allowed(unknown));
    ctx.submit_debug_message(unknown, c"UNASSIGNED-test", c"harmless-looking text");
    assert_eq!(ctx.validation_errors(), 1);
    // what Mesa's own messages look like: id 0, a source location as the name
    ctx.submit_debug_message(
        0,
        c"src/vulkan/runtime/vk_shader_module.c:1",
        c"driver message",
    );
    assert_eq!(ctx.validation_errors(), 2);
    // every id on the list is let through and counted apart
    for &(id, _) in vk::validation::ALLOWED {
        ctx.submit_debug_message(id, c"allowed", c"allowed message");
    }
    assert_eq!(ctx.validation_errors(), 2);
    assert_eq!(
        ctx.validation_allowed(),
        vk::validation::ALLOWED.len() as u64
    );
}
