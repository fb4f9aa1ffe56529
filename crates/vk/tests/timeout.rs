//! A fence wait that times out (forced with `VKDECODE_FAULT=fence-timeout`, which makes
//! the first wait of a context report a timeout at once) must not leave the submission
//! pending: the command buffer and its buffers are dropped right after the error, and
//! the same context then runs the work again. The validation layer watches both; it
//! tracks submissions through their fence, so before the fix it flagged the pool
//! destroyed while in use and the next submit with an unreset fence.
//!
//! One test in its own binary: the variable is set before the only context is created.

use vk::checksum::{self, ChecksumPush};
use vk::{
    Buffer, BufferDesc, CommandBuffer, Context, MemLocation, Pipeline, PipelineDesc, VkError,
};

const N_BYTES: u64 = 16 << 20;
const PATTERN: u32 = 0x0123_4567;

/// Fills a large buffer with `PATTERN` and checksums it into `out`.
fn record(
    cmd: &mut CommandBuffer,
    p: &Pipeline,
    set: &vk::DescriptorSet,
    data: &Buffer,
    out: &Buffer,
) {
    cmd.begin().unwrap();
    cmd.fill(data, 0, N_BYTES, PATTERN);
    cmd.fill(out, 0, 8, 0);
    cmd.barrier();
    let push = ChecksumPush {
        byte_offset: 0,
        n_bytes: N_BYTES as u32,
        word_base: 0,
        out_index: 0,
    };
    cmd.dispatch(
        p,
        set,
        bytemuck::bytes_of(&push),
        [checksum::groups_for(N_BYTES), 1, 1],
    );
    cmd.host_barrier();
    cmd.end().unwrap();
}

#[test]
fn a_timed_out_submission_is_finished_before_the_error_returns() {
    std::env::set_var("VKDECODE_FAULT", "fence-timeout");
    let Some(ctx) = vk::testing::validating_context() else {
        return;
    };
    std::env::remove_var("VKDECODE_FAULT");
    let expected = {
        let words = vec![PATTERN; (N_BYTES / 4) as usize];
        checksum::cpu(bytemuck::cast_slice(&words), 0)
    };
    let p = Pipeline::new(
        &ctx,
        &PipelineDesc {
            kernel: vk::CHECKSUM,
            n_bindings: 2,
            push_size: 16,
            spec: vec![],
        },
    )
    .unwrap();
    let new_buffers = |ctx: &std::sync::Arc<Context>| {
        let data = Buffer::new(
            ctx,
            &BufferDesc::storage("data", N_BYTES, MemLocation::GpuOnly),
        )
        .unwrap();
        let out = Buffer::new(ctx, &BufferDesc::storage("out", 8, MemLocation::GpuToCpu)).unwrap();
        (data, out)
    };

    // 1. The forced timeout: an error, but the work is done when it returns.
    let (data, out) = new_buffers(&ctx);
    let set = p.descriptor_set(&[data.binding(), out.binding()]).unwrap();
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    record(&mut cmd, &p, &set, &data, &out);
    let err = ctx.submit_and_wait(&cmd).unwrap_err();
    assert!(matches!(err, VkError::Timeout(_)), "{err}");
    let mut sums = [0u32; 2];
    out.read(0, &mut sums).unwrap();
    assert_eq!(sums, expected, "the timed-out work had not finished");
    // Dropped at once: destroying the pool and the buffers must be legal now.
    drop(cmd);
    drop(set);
    drop(data);
    drop(out);
    assert_eq!(
        ctx.validation_errors(),
        0,
        "validation messages after the timeout"
    );

    // 2. The context still works: the fence was reset.
    let (data, out) = new_buffers(&ctx);
    let set = p.descriptor_set(&[data.binding(), out.binding()]).unwrap();
    let mut cmd = CommandBuffer::new(&ctx).unwrap();
    record(&mut cmd, &p, &set, &data, &out);
    ctx.submit_and_wait(&cmd).unwrap();
    let mut sums = [0u32; 2];
    out.read(0, &mut sums).unwrap();
    assert_eq!(sums, expected);
    drop(cmd);
    assert_eq!(ctx.host_waits(), 2);
    assert_eq!(
        ctx.validation_errors(),
        0,
        "validation messages after the resubmit"
    );
}
