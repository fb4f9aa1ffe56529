//! Compute pipelines: shader module, set layout of storage buffers, push range, spec
//! constants, and a growable descriptor pool for the sets bound at load.

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::buffer::BufferBinding;
use crate::error::{VkError, VkResultExt};
use crate::pipeline_cache::{PipelineKey, PipelineObjects};
use crate::texel::BufferView;
use crate::{Context, Shader};

/// Sets per descriptor pool; a new pool is added when one runs out.
const SETS_PER_POOL: u32 = 64;

/// A directory of replacement SPIR-V modules, for shader experiments without a rebuild:
/// a pipeline of kernel `NAME` ([`Shader::name`], e.g. `matmul_mm.q8_0.t8.add`) is built
/// from `DIR/NAME.spv` when that file exists (a warning says so), else from the module
/// build.rs embedded. A replacement must declare the same bindings, push constants and
/// specialisation constants as the kernel it replaces: the layout comes from the embedded
/// module. Unset in normal use; compile a replacement with the glslc flags build.rs
/// gives that variant.
pub const SPIRV_DIR_ENV: &str = "VKDECODE_SPIRV_DIR";

/// The first word of every SPIR-V module.
const SPIRV_MAGIC: u32 = 0x0723_0203;

/// The replacement module of kernel `name` in `dir` ([`SPIRV_DIR_ENV`]): `None` when
/// there is no `dir/name.spv`; an error when the file cannot be read or is not SPIR-V.
pub fn spirv_override(dir: &Path, name: &'static str) -> Result<Option<Vec<u32>>, VkError> {
    let path = dir.join(format!("{name}.spv"));
    let bad = |why: String| VkError::Pipeline { kernel: name, why };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(format!("cannot read {}: {e}", path.display()))),
    };
    if bytes.len() < 20 || !bytes.len().is_multiple_of(4) {
        return Err(bad(format!(
            "{} is {} bytes: not a SPIR-V module (a header of 5 words, then whole words)",
            path.display(),
            bytes.len()
        )));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if words[0] != SPIRV_MAGIC {
        return Err(bad(format!(
            "{} does not start with the SPIR-V magic number (little-endian {SPIRV_MAGIC:#010x})",
            path.display()
        )));
    }
    Ok(Some(words))
}

/// Describes a compute pipeline.
#[derive(Clone, Debug)]
pub struct PipelineDesc {
    /// The kernel (SPIR-V).
    pub kernel: &'static Shader,
    /// Storage-buffer bindings 0..n in set 0.
    pub n_bindings: u32,
    /// Push-constant bytes (multiple of 4, at most `maxPushConstantsSize`; 0 = none).
    pub push_size: u32,
    /// Specialization constants with ids 0, 1, ... (u32 each).
    pub spec: Vec<u32>,
}

/// The descriptor pools of one [`Pipeline`] (the set layout is the context's, with the
/// pipeline); shared by the pipeline and its sets so a set never outlives the pool it
/// came from.
struct SetAllocator {
    layout: vk::DescriptorSetLayout,
    n_bindings: u32,
    /// Descriptor type of every binding.
    kinds: Vec<DescriptorKind>,
    pools: Mutex<(
        Vec<vk::DescriptorPool>,
        u32, /* sets left in the last pool */
    )>,
    ctx: Arc<Context>,
}

impl Drop for SetAllocator {
    fn drop(&mut self) {
        let dev = self.ctx.device();
        // SAFETY: no set from these pools is in use (every DescriptorSet holds an Arc of
        // this value, and GPU work using them has been waited for by contract).
        unsafe {
            if let Ok(p) = self.pools.get_mut() {
                for &pool in &p.0 {
                    dev.destroy_descriptor_pool(pool, None);
                }
            }
        }
    }
}

/// The descriptor type of one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DescriptorKind {
    /// `buffer` block in GLSL.
    StorageBuffer,
    /// `textureBuffer` / `utextureBuffer` read with `texelFetch` (no sampler).
    UniformTexelBuffer,
}

impl DescriptorKind {
    fn vk(self) -> vk::DescriptorType {
        match self {
            DescriptorKind::StorageBuffer => vk::DescriptorType::STORAGE_BUFFER,
            DescriptorKind::UniformTexelBuffer => vk::DescriptorType::UNIFORM_TEXEL_BUFFER,
        }
    }
}

/// What a binding of a set is written with; the set holds both kinds alive.
#[derive(Clone, Debug)]
pub enum Descriptor<'a> {
    /// A storage buffer range.
    Buffer(BufferBinding),
    /// A texel buffer view.
    Texel(&'a BufferView),
}

/// A descriptor set written once; keeps its pool and every buffer and view it binds
/// alive (command buffers that record it hold it in turn).
pub struct DescriptorSet {
    inner: Arc<RawSet>,
}

/// The set handle and what it references.
pub(crate) struct RawSet {
    set: vk::DescriptorSet,
    owner: Arc<SetAllocator>,
    _bound: Vec<Arc<dyn Any + Send + Sync>>,
}

impl DescriptorSet {
    pub(crate) fn raw(&self) -> vk::DescriptorSet {
        self.inner.set
    }

    pub(crate) fn keep(&self) -> Arc<RawSet> {
        Arc::clone(&self.inner)
    }
}

/// The pipeline handles a recording binds. The context owns and destroys them
/// ([`Context::pipelines_built`]); this value keeps the context alive while a recording
/// of the pipeline exists.
pub(crate) struct RawPipeline {
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    _ctx: Arc<Context>,
}

/// A compute pipeline: the context's objects for its description (built on first
/// request, see [`Context::pipelines_built`]) and descriptor pools of its own.
pub struct Pipeline {
    raw: Arc<RawPipeline>,
    sets: Arc<SetAllocator>,
    kernel: &'static Shader,
    push_size: u32,
    ctx: Arc<Context>,
}

impl Pipeline {
    /// Builds the pipeline (the driver may compile it lazily on first dispatch). Binding
    /// types come from the kernel's SPIR-V ([`Shader::descriptor_kinds`]); bindings past
    /// the shader's own are storage buffers.
    pub fn new(ctx: &Arc<Context>, desc: &PipelineDesc) -> Result<Pipeline, VkError> {
        let reflected = desc.kernel.descriptor_kinds();
        let kinds: Vec<DescriptorKind> = (0..desc.n_bindings as usize)
            .map(|i| {
                reflected
                    .get(i)
                    .copied()
                    .unwrap_or(DescriptorKind::StorageBuffer)
            })
            .collect();
        Pipeline::with_kinds(ctx, desc, &kinds)
    }

    /// [`Pipeline::new`] for a kernel that needs each workgroup to be one subgroup of
    /// `lanes` invocations: where the device guarantees that only when asked
    /// ([`crate::SubgroupGuarantee::Required`]), the pipeline requires subgroups of
    /// `lanes` and full subgroups; where the size is fixed at `lanes`, it is a plain
    /// pipeline; elsewhere an error (the caller picks another kernel).
    pub fn with_subgroup_size(
        ctx: &Arc<Context>,
        desc: &PipelineDesc,
        lanes: u32,
    ) -> Result<Pipeline, VkError> {
        let reflected = desc.kernel.descriptor_kinds();
        let kinds: Vec<DescriptorKind> = (0..desc.n_bindings as usize)
            .map(|i| {
                reflected
                    .get(i)
                    .copied()
                    .unwrap_or(DescriptorKind::StorageBuffer)
            })
            .collect();
        match ctx.caps().one_subgroup_of(lanes) {
            Some(crate::SubgroupGuarantee::Required) => Pipeline::build(ctx, desc, &kinds, Some(lanes)),
            Some(crate::SubgroupGuarantee::Fixed) => Pipeline::build(ctx, desc, &kinds, None),
            None => Err(VkError::Pipeline {
                kernel: desc.kernel.name(),
                why: format!(
                    "the device does not guarantee that a workgroup of {lanes} lanes is one subgroup"
                ),
            }),
        }
    }

    /// Builds a pipeline whose binding `i` has descriptor type `kinds[i]`
    /// (`kinds.len() == desc.n_bindings`).
    pub fn with_kinds(
        ctx: &Arc<Context>,
        desc: &PipelineDesc,
        kinds: &[DescriptorKind],
    ) -> Result<Pipeline, VkError> {
        Pipeline::build(ctx, desc, kinds, None)
    }

    /// The pipeline, with subgroups of `required_lanes` (and full subgroups) when given.
    fn build(
        ctx: &Arc<Context>,
        desc: &PipelineDesc,
        kinds: &[DescriptorKind],
        required_lanes: Option<u32>,
    ) -> Result<Pipeline, VkError> {
        let kernel = desc.kernel.name();
        let bad = |why: String| VkError::Pipeline { kernel, why };
        if kinds.len() != desc.n_bindings as usize {
            return Err(bad(format!(
                "{} binding kinds for {} bindings",
                kinds.len(),
                desc.n_bindings
            )));
        }
        if !desc.push_size.is_multiple_of(4) || desc.push_size > ctx.caps().max_push_constants_size
        {
            return Err(bad(format!(
                "push_size {} must be a multiple of 4 and at most {}",
                desc.push_size,
                ctx.caps().max_push_constants_size
            )));
        }
        // read before any handle exists, so an unreadable replacement leaks nothing
        let replaced = match std::env::var_os(SPIRV_DIR_ENV) {
            Some(dir) => spirv_override(Path::new(&dir), kernel)?,
            None => None,
        };
        if replaced.is_some() {
            tracing::warn!(kernel, "SPIR-V replaced from {SPIRV_DIR_ENV}");
        }
        let key = PipelineKey {
            shader: desc.kernel as *const Shader as usize,
            kinds: kinds.iter().map(|k| k.vk()).collect(),
            push_size: desc.push_size,
            spec: desc.spec.clone(),
            required_lanes,
            replaced,
        };
        let objects = ctx
            .pipeline_cache()
            .get_or_make(key.clone(), || make_objects(ctx, desc, &key))?;
        let sets = Arc::new(SetAllocator {
            layout: objects.set_layout,
            n_bindings: desc.n_bindings,
            kinds: kinds.to_vec(),
            pools: Mutex::new((Vec::new(), 0)),
            ctx: Arc::clone(ctx),
        });
        Ok(Pipeline {
            raw: Arc::new(RawPipeline {
                pipeline: objects.pipeline,
                layout: objects.layout,
                _ctx: Arc::clone(ctx),
            }),
            sets,
            kernel: desc.kernel,
            push_size: desc.push_size,
            ctx: Arc::clone(ctx),
        })
    }

    /// Allocates a set and writes `bindings` to bindings 0..n (all of them, in order;
    /// every binding of the layout must be a storage buffer).
    pub fn descriptor_set(&self, bindings: &[BufferBinding]) -> Result<DescriptorSet, VkError> {
        let d: Vec<Descriptor<'_>> = bindings
            .iter()
            .map(|b| Descriptor::Buffer(b.clone()))
            .collect();
        self.descriptor_set_with(&d)
    }

    /// Allocates a set and writes `descriptors` to bindings 0..n (all of them, in order),
    /// each of the kind the layout declares.
    pub fn descriptor_set_with(
        &self,
        descriptors: &[Descriptor<'_>],
    ) -> Result<DescriptorSet, VkError> {
        let kernel = self.kernel.name();
        let caps = self.ctx.caps();
        if descriptors.len() as u32 != self.sets.n_bindings {
            return Err(VkError::Pipeline {
                kernel,
                why: format!(
                    "{} bindings given, the layout has {}",
                    descriptors.len(),
                    self.sets.n_bindings
                ),
            });
        }
        for (i, (d, kind)) in descriptors.iter().zip(&self.sets.kinds).enumerate() {
            match (d, kind) {
                (Descriptor::Buffer(b), DescriptorKind::StorageBuffer) => {
                    if b.offset % caps.min_storage_buffer_offset_alignment.max(1) != 0 {
                        return Err(VkError::Pipeline {
                            kernel,
                            why: format!(
                                "binding {i}: offset {} is not a multiple of minStorageBufferOffsetAlignment {}",
                                b.offset, caps.min_storage_buffer_offset_alignment
                            ),
                        });
                    }
                    if b.range == 0 || b.range > caps.max_storage_buffer_range {
                        return Err(VkError::Pipeline {
                            kernel,
                            why: format!(
                                "binding {i}: range {} is 0 or above maxStorageBufferRange {}",
                                b.range, caps.max_storage_buffer_range
                            ),
                        });
                    }
                }
                (Descriptor::Texel(_), DescriptorKind::UniformTexelBuffer) => {}
                _ => {
                    return Err(VkError::Pipeline {
                        kernel,
                        why: format!(
                            "binding {i}: a {d:?} given where the layout declares {kind:?}"
                        ),
                    })
                }
            }
        }
        let dev = self.ctx.device();
        let set = {
            let mut pools = self
                .sets
                .pools
                .lock()
                .map_err(|_| VkError::Recording("descriptor pool mutex poisoned".into()))?;
            if pools.1 == 0 {
                let count =
                    |k: DescriptorKind| self.sets.kinds.iter().filter(|&&x| x == k).count() as u32;
                let sizes: Vec<vk::DescriptorPoolSize> = [
                    DescriptorKind::StorageBuffer,
                    DescriptorKind::UniformTexelBuffer,
                ]
                .into_iter()
                .filter(|&k| count(k) > 0)
                .map(|k| vk::DescriptorPoolSize {
                    ty: k.vk(),
                    descriptor_count: SETS_PER_POOL * count(k),
                })
                .collect();
                let info = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(SETS_PER_POOL)
                    .pool_sizes(&sizes);
                // SAFETY: valid create info on a live device.
                let pool = unsafe { dev.create_descriptor_pool(&info, None) }
                    .call("vkCreateDescriptorPool")?;
                pools.0.push(pool);
                pools.1 = SETS_PER_POOL;
            }
            let pool = *pools.0.last().expect("a pool was just ensured");
            let layouts = [self.sets.layout];
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: the pool is externally synchronised by the mutex and has room.
            let set =
                unsafe { dev.allocate_descriptor_sets(&info) }.call("vkAllocateDescriptorSets")?[0];
            pools.1 -= 1;
            set
        };
        let buffer_infos: Vec<[vk::DescriptorBufferInfo; 1]> = descriptors
            .iter()
            .map(|d| match d {
                Descriptor::Buffer(b) => [vk::DescriptorBufferInfo {
                    buffer: b.buffer.raw(),
                    offset: b.offset,
                    range: b.range,
                }],
                Descriptor::Texel(_) => [vk::DescriptorBufferInfo::default()],
            })
            .collect();
        let views: Vec<[vk::BufferView; 1]> = descriptors
            .iter()
            .map(|d| match d {
                Descriptor::Texel(v) => [v.raw()],
                Descriptor::Buffer(_) => [vk::BufferView::null()],
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet> = descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let w = vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32);
                match d {
                    Descriptor::Buffer(_) => w
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(&buffer_infos[i]),
                    Descriptor::Texel(_) => w
                        .descriptor_type(vk::DescriptorType::UNIFORM_TEXEL_BUFFER)
                        .texel_buffer_view(&views[i]),
                }
            })
            .collect();
        // SAFETY: the set is freshly allocated and not in use; buffers and views are live
        // handles, and the set holds them alive from here on.
        unsafe { dev.update_descriptor_sets(&writes, &[]) };
        let bound = descriptors
            .iter()
            .map(|d| -> Arc<dyn Any + Send + Sync> {
                match d {
                    Descriptor::Buffer(b) => b.buffer.0.clone(),
                    Descriptor::Texel(v) => v.keep(),
                }
            })
            .collect();
        Ok(DescriptorSet {
            inner: Arc::new(RawSet {
                set,
                owner: Arc::clone(&self.sets),
                _bound: bound,
            }),
        })
    }

    /// The kernel.
    pub fn kernel(&self) -> &'static Shader {
        self.kernel
    }

    /// Push-constant bytes declared.
    pub fn push_size(&self) -> u32 {
        self.push_size
    }

    pub(crate) fn raw(&self) -> vk::Pipeline {
        self.raw.pipeline
    }

    pub(crate) fn layout(&self) -> vk::PipelineLayout {
        self.raw.layout
    }

    pub(crate) fn keep(&self) -> Arc<RawPipeline> {
        Arc::clone(&self.raw)
    }

    /// Whether `set` fits this pipeline's layout (same number of storage bindings:
    /// identically defined set layouts are compatible).
    pub(crate) fn accepts(&self, set: &DescriptorSet) -> bool {
        Arc::ptr_eq(&self.sets, &set.inner.owner) || self.sets.kinds == set.inner.owner.kinds
    }
}

/// Creates the set layout, pipeline layout and pipeline of `key` (the shader module
/// only for as long as creating the pipeline needs it), destroying what was made when a
/// step fails.
fn make_objects(
    ctx: &Context,
    desc: &PipelineDesc,
    key: &PipelineKey,
) -> Result<PipelineObjects, VkError> {
    let dev = ctx.device();
    let bindings: Vec<vk::DescriptorSetLayoutBinding> = key
        .kinds
        .iter()
        .enumerate()
        .map(|(b, &kind)| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b as u32)
                .descriptor_type(kind)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let set_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
    // SAFETY: valid create info on a live device.
    let set_layout = unsafe { dev.create_descriptor_set_layout(&set_info, None) }
        .call("vkCreateDescriptorSetLayout")?;
    let set_layouts = [set_layout];
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .offset(0)
        .size(desc.push_size)];
    let mut pl_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
    if desc.push_size > 0 {
        pl_info = pl_info.push_constant_ranges(&ranges);
    }
    // SAFETY: valid create info referencing a live set layout.
    let layout = match unsafe { dev.create_pipeline_layout(&pl_info, None) } {
        Ok(l) => l,
        Err(e) => {
            // SAFETY: unused set layout.
            unsafe { dev.destroy_descriptor_set_layout(set_layout, None) };
            return Err(VkError::Call {
                call: "vkCreatePipelineLayout",
                result: e,
            });
        }
    };
    // SAFETY: neither is in use yet.
    let undo = || unsafe {
        dev.destroy_pipeline_layout(layout, None);
        dev.destroy_descriptor_set_layout(set_layout, None);
    };
    let embedded;
    let code: &[u32] = match key.replaced.as_deref() {
        Some(c) => c,
        None => {
            embedded = desc.kernel.spirv();
            &embedded
        }
    };
    let mod_info = vk::ShaderModuleCreateInfo::default().code(code);
    // SAFETY: `code` is SPIR-V produced by glslc at build time, unless a developer set
    // VKDECODE_SPIRV_DIR: a replacement is checked for the SPIR-V header only, and its
    // validity is theirs to ensure (as glslc's output is ours).
    let module = match unsafe { dev.create_shader_module(&mod_info, None) } {
        Ok(m) => m,
        Err(e) => {
            undo();
            return Err(VkError::Call {
                call: "vkCreateShaderModule",
                result: e,
            });
        }
    };
    let entries: Vec<vk::SpecializationMapEntry> = (0..desc.spec.len() as u32)
        .map(|i| vk::SpecializationMapEntry {
            constant_id: i,
            offset: i * 4,
            size: 4,
        })
        .collect();
    let spec_data: &[u8] = bytemuck::cast_slice(&desc.spec);
    let spec_info = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(spec_data);
    let mut stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(c"main");
    if !desc.spec.is_empty() {
        stage = stage.specialization_info(&spec_info);
    }
    let mut required = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
        .required_subgroup_size(key.required_lanes.unwrap_or(0));
    if key.required_lanes.is_some() {
        // `one_subgroup_of` checked the size range, compute in
        // requiredSubgroupSizeStages and computeFullSubgroups; the context enabled both
        // features.
        stage = stage
            .flags(vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS)
            .push_next(&mut required);
    }
    let cinfo = [vk::ComputePipelineCreateInfo::default()
        .stage(stage)
        .layout(layout)];
    // SAFETY: module and layout are live; arrays outlive the call.
    let created = unsafe { dev.create_compute_pipelines(vk::PipelineCache::null(), &cinfo, None) };
    // SAFETY: a pipeline keeps what it needs of its module; nothing else uses it.
    unsafe { dev.destroy_shader_module(module, None) };
    match created {
        Ok(p) => Ok(PipelineObjects {
            set_layout,
            layout,
            pipeline: p[0],
        }),
        Err((p, e)) => {
            for x in p {
                if x != vk::Pipeline::null() {
                    // SAFETY: never used.
                    unsafe { dev.destroy_pipeline(x, None) };
                }
            }
            undo();
            Err(VkError::Call {
                call: "vkCreateComputePipelines",
                result: e,
            })
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("kernel", &self.kernel.name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory.
    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vk-spirv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        dir
    }

    #[test]
    fn a_replacement_module_is_read_when_present_and_checked() {
        let kernel = crate::CHECKSUM;
        let name = kernel.name();
        let dir = scratch("override");
        // absent: the embedded module is used
        assert!(spirv_override(&dir, name)
            .expect("no file is not an error")
            .is_none());
        // present: its words, as written
        let words = kernel.spirv();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{name}.spv")), &bytes).expect("write");
        let got = spirv_override(&dir, name).expect("read").expect("present");
        assert_eq!(got, words);
        // another kernel's file does not stand in for it
        assert!(spirv_override(&dir, "argmax").expect("read").is_none());
        // not whole words, too short, or without the magic number: refused, naming the file
        std::fs::write(dir.join(format!("{name}.spv")), &bytes[..bytes.len() - 1]).expect("write");
        let e = spirv_override(&dir, name)
            .expect_err("odd length")
            .to_string();
        assert!(e.contains(name) && e.contains(".spv"), "{e}");
        std::fs::write(dir.join(format!("{name}.spv")), &bytes[..16]).expect("write");
        assert!(spirv_override(&dir, name).is_err(), "a header cut short");
        let mut bad = bytes.clone();
        bad[0] ^= 0xFF;
        std::fs::write(dir.join(format!("{name}.spv")), &bad).expect("write");
        let e = spirv_override(&dir, name)
            .expect_err("bad magic")
            .to_string();
        assert!(e.contains("magic"), "{e}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
