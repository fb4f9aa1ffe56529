//! Command buffers (RAII, re-recordable) and timestamp query pools.

use std::any::Any;
use std::sync::Arc;

use ash::vk;

use crate::buffer::Buffer;
use crate::error::{VkError, VkResultExt};
use crate::pipeline::{DescriptorSet, Pipeline};
use crate::Context;

/// A primary command buffer with its own pool (so recording needs no shared lock).
///
/// Recording errors (bad push size, a set from an incompatible layout) are kept and
/// returned by [`CommandBuffer::end`]. The command buffer holds every pipeline, set and
/// buffer it records until it is recorded again or dropped, both of which happen only
/// when no submission of it is pending ([`Context::submit_and_wait`] returns after
/// completion, even on a timeout).
pub struct CommandBuffer {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    recording: bool,
    executable: bool,
    error: Option<String>,
    /// What the recording references; released after the pool in `Drop`.
    used: Vec<Arc<dyn Any + Send + Sync>>,
    ctx: Arc<Context>,
}

impl CommandBuffer {
    /// Allocates a command buffer on the context's compute queue family.
    pub fn new(ctx: &Arc<Context>) -> Result<CommandBuffer, VkError> {
        let dev = ctx.device();
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(ctx.queue_family())
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create info on a live device.
        let pool = unsafe { dev.create_command_pool(&info, None) }.call("vkCreateCommandPool")?;
        let ainfo = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool was just created and is owned here.
        let cmd = match unsafe { dev.allocate_command_buffers(&ainfo) } {
            Ok(v) => v[0],
            Err(e) => {
                // SAFETY: the pool is unused.
                unsafe { dev.destroy_command_pool(pool, None) };
                return Err(VkError::Call {
                    call: "vkAllocateCommandBuffers",
                    result: e,
                });
            }
        };
        Ok(CommandBuffer {
            pool,
            cmd,
            recording: false,
            executable: false,
            error: None,
            used: Vec::new(),
            ctx: Arc::clone(ctx),
        })
    }

    /// Resets and begins recording (the previous recording must have completed on the GPU).
    pub fn begin(&mut self) -> Result<(), VkError> {
        let dev = self.ctx.device();
        // SAFETY: the command buffer is owned here and, by contract, not pending.
        unsafe {
            dev.reset_command_buffer(self.cmd, vk::CommandBufferResetFlags::empty())
                .call("vkResetCommandBuffer")?;
            dev.begin_command_buffer(self.cmd, &vk::CommandBufferBeginInfo::default())
                .call("vkBeginCommandBuffer")?;
        }
        self.recording = true;
        self.executable = false;
        self.error = None;
        self.used.clear();
        Ok(())
    }

    /// Ends recording; returns the first recording error, if any.
    pub fn end(&mut self) -> Result<(), VkError> {
        if !self.recording {
            return Err(VkError::Recording("end() without begin()".into()));
        }
        self.recording = false;
        // SAFETY: the buffer is in the recording state.
        unsafe { self.ctx.device().end_command_buffer(self.cmd) }.call("vkEndCommandBuffer")?;
        if let Some(e) = self.error.take() {
            return Err(VkError::Recording(e));
        }
        self.executable = true;
        Ok(())
    }

    fn recordable(&mut self, what: &str) -> bool {
        if !self.recording {
            if self.error.is_none() {
                self.error = Some(format!("{what} outside begin()/end()"));
            }
            return false;
        }
        self.error.is_none()
    }

    /// Binds `p` and `set`, pushes `push` (≤ the pipeline's push size, multiple of 4)
    /// and dispatches `groups` workgroups.
    pub fn dispatch(&mut self, p: &Pipeline, set: &DescriptorSet, push: &[u8], groups: [u32; 3]) {
        if !self.recordable("dispatch") {
            return;
        }
        let kernel = p.kernel().name();
        if !push.len().is_multiple_of(4) || push.len() as u32 > p.push_size() {
            self.error = Some(format!(
                "{kernel}: {} push bytes, pipeline declares {} (multiple of 4 needed)",
                push.len(),
                p.push_size()
            ));
            return;
        }
        if !p.accepts(set) {
            self.error = Some(format!(
                "{kernel}: descriptor set from an incompatible layout"
            ));
            return;
        }
        let limit = self.ctx.caps().max_compute_work_group_count;
        if groups.iter().zip(limit.iter()).any(|(g, l)| g > l) {
            self.error = Some(format!("{kernel}: {groups:?} workgroups exceed {limit:?}"));
            return;
        }
        if groups.contains(&0) {
            return; // nothing to do; a zero dispatch is legal but pointless
        }
        self.used.push(p.keep());
        self.used.push(set.keep());
        let dev = self.ctx.device();
        // SAFETY: recording state; pipeline, layout and set are live and compatible, and
        // held by `used` until the recording is done with.
        unsafe {
            dev.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, p.raw());
            dev.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                p.layout(),
                0,
                &[set.raw()],
                &[],
            );
            if !push.is_empty() {
                dev.cmd_push_constants(
                    self.cmd,
                    p.layout(),
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push,
                );
            }
            dev.cmd_dispatch(self.cmd, groups[0], groups[1], groups[2]);
        }
    }

    /// Global memory barrier: compute/transfer writes before compute/transfer reads and writes.
    pub fn barrier(&mut self) {
        if !self.recordable("barrier") {
            return;
        }
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE,
            )];
        // SAFETY: recording state.
        unsafe {
            self.ctx.device().cmd_pipeline_barrier(
                self.cmd,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    /// Makes compute/transfer writes visible to host reads after the fence.
    pub fn host_barrier(&mut self) {
        if !self.recordable("host_barrier") {
            return;
        }
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        // SAFETY: recording state.
        unsafe {
            self.ctx.device().cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    /// Copies `(src_offset, dst_offset, size)` regions from `src` to `dst`.
    pub fn copy_buffer(&mut self, src: &Buffer, dst: &Buffer, regions: &[(u64, u64, u64)]) {
        if !self.recordable("copy_buffer") || regions.is_empty() {
            return;
        }
        let r: Vec<vk::BufferCopy> = regions
            .iter()
            .map(|&(s, d, n)| vk::BufferCopy {
                src_offset: s,
                dst_offset: d,
                size: n,
            })
            .collect();
        self.used.push(src.buffer_ref().0);
        self.used.push(dst.buffer_ref().0);
        // SAFETY: recording state; both buffers are live (held by `used`) and were
        // created with TRANSFER_SRC | TRANSFER_DST usage by `Buffer::new`.
        unsafe {
            self.ctx
                .device()
                .cmd_copy_buffer(self.cmd, src.raw(), dst.raw(), &r)
        };
    }

    /// Fills `size` bytes (multiple of 4, or `u64::MAX` for the rest) at `offset` with `value`.
    pub fn fill(&mut self, buf: &Buffer, offset: u64, size: u64, value: u32) {
        if !self.recordable("fill") {
            return;
        }
        if !offset.is_multiple_of(4) || (size != vk::WHOLE_SIZE && !size.is_multiple_of(4)) {
            self.error = Some(format!(
                "fill at {offset} of {size} bytes: both must be multiples of 4"
            ));
            return;
        }
        self.used.push(buf.buffer_ref().0);
        // SAFETY: recording state; live buffer (held by `used`) with TRANSFER_DST usage.
        unsafe {
            self.ctx
                .device()
                .cmd_fill_buffer(self.cmd, buf.raw(), offset, size, value)
        };
    }

    /// Resets `count` queries from `first` (needed before writing them again).
    pub fn reset_queries(&mut self, pool: &QueryPool, first: u32, count: u32) {
        if !self.recordable("reset_queries") {
            return;
        }
        // SAFETY: recording state; the pool is live.
        unsafe {
            self.ctx
                .device()
                .cmd_reset_query_pool(self.cmd, pool.pool, first, count)
        };
    }

    /// Writes a timestamp once all previous commands finished.
    pub fn timestamp(&mut self, pool: &QueryPool, index: u32) {
        if !self.recordable("timestamp") {
            return;
        }
        if index >= pool.count {
            self.error = Some(format!(
                "timestamp index {index} >= pool size {}",
                pool.count
            ));
            return;
        }
        // SAFETY: recording state; the pool is live and `index` in range.
        unsafe {
            self.ctx.device().cmd_write_timestamp(
                self.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                pool.pool,
                index,
            )
        };
    }

    pub(crate) fn raw(&self) -> vk::CommandBuffer {
        self.cmd
    }

    pub(crate) fn check_submittable(&self) -> Result<(), VkError> {
        if self.executable {
            Ok(())
        } else {
            Err(VkError::Recording(
                "submit of a command buffer that was not ended successfully".into(),
            ))
        }
    }
}

impl Drop for CommandBuffer {
    fn drop(&mut self) {
        // SAFETY: the buffer is not pending: submit_and_wait returns only once the
        // submission completed, even after a fence timeout; destroying the pool frees
        // the command buffer.
        unsafe { self.ctx.device().destroy_command_pool(self.pool, None) };
    }
}

/// A pool of timestamp queries.
pub struct QueryPool {
    pool: vk::QueryPool,
    count: u32,
    ctx: Arc<Context>,
}

impl QueryPool {
    /// Creates `count` timestamp queries; errors if the queue has no timestamps.
    pub fn new(ctx: &Arc<Context>, count: u32) -> Result<QueryPool, VkError> {
        if ctx.caps().timestamp_valid_bits == 0 {
            return Err(VkError::Unsuitable {
                device: ctx.caps().name.clone(),
                why: "the compute queue has no timestamp support".into(),
            });
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count);
        // SAFETY: valid create info on a live device.
        let pool =
            unsafe { ctx.device().create_query_pool(&info, None) }.call("vkCreateQueryPool")?;
        Ok(QueryPool {
            pool,
            count,
            ctx: Arc::clone(ctx),
        })
    }

    /// Number of queries.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Reads `count` timestamps from `first` in nanoseconds (after the fence signalled).
    pub fn read_ns(&self, first: u32, count: u32) -> Result<Vec<u64>, VkError> {
        if first.checked_add(count).is_none_or(|e| e > self.count) {
            return Err(VkError::Recording(format!(
                "queries {first}..{} out of a pool of {}",
                first as u64 + count as u64,
                self.count
            )));
        }
        let mut raw = vec![0u64; count as usize];
        // SAFETY: range checked; 64-bit results into a slice of that many u64; WAIT
        // because the caller reads after the submission completed.
        unsafe {
            self.ctx.device().get_query_pool_results(
                self.pool,
                first,
                &mut raw,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .call("vkGetQueryPoolResults")?;
        let bits = self.ctx.caps().timestamp_valid_bits;
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let period = f64::from(self.ctx.caps().timestamp_period_ns);
        Ok(raw
            .iter()
            .map(|&t| ((t & mask) as f64 * period) as u64)
            .collect())
    }
}

impl Drop for QueryPool {
    fn drop(&mut self) {
        // SAFETY: no pending work writes these queries (caller contract).
        unsafe { self.ctx.device().destroy_query_pool(self.pool, None) };
    }
}
