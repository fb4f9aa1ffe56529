//! The pipelines a context has built: each distinct description (kernel, binding types,
//! push range, specialisation constants, subgroup size) is made once per context and kept
//! until the context is dropped. Pipeline creation is most of what loading a small model
//! costs (on lavapipe about 0.3 s a session, twice that under the validation layer, all
//! of it the driver's and the layer's work on the shaders), so a second session on the
//! same context, a model reloaded by `chat`, or a test that builds hundreds of sessions
//! pays it once.

use std::collections::HashMap;
use std::sync::Mutex;

use ash::vk;

use crate::error::VkError;

/// What makes two pipelines the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    /// The kernel, by the address of its `&'static Shader`.
    pub shader: usize,
    /// Descriptor type of every binding of set 0.
    pub kinds: Vec<vk::DescriptorType>,
    pub push_size: u32,
    pub spec: Vec<u32>,
    /// Subgroups of this many lanes, required with full subgroups.
    pub required_lanes: Option<u32>,
    /// The module's words when a developer replaced it (`VKDECODE_SPIRV_DIR`).
    pub replaced: Option<Vec<u32>>,
}

/// The Vulkan objects of one pipeline, owned by the context's [`PipelineCache`] (the
/// shader module is destroyed once the pipeline exists).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PipelineObjects {
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    pub pipeline: vk::Pipeline,
}

impl PipelineObjects {
    /// Destroys the three objects.
    ///
    /// # Safety
    /// `dev` made them, and no recording, descriptor set or pool still uses them.
    pub unsafe fn destroy(&self, dev: &ash::Device) {
        // SAFETY: as the caller promises.
        unsafe {
            dev.destroy_pipeline(self.pipeline, None);
            dev.destroy_pipeline_layout(self.layout, None);
            dev.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

/// Every pipeline a context has built, by description.
#[derive(Debug, Default)]
pub(crate) struct PipelineCache {
    built: Mutex<HashMap<PipelineKey, PipelineObjects>>,
}

impl PipelineCache {
    /// The objects of `key`, made by `make` the first time (the lock is held meanwhile,
    /// so two threads asking for the same pipeline build it once).
    pub fn get_or_make(
        &self,
        key: PipelineKey,
        make: impl FnOnce() -> Result<PipelineObjects, VkError>,
    ) -> Result<PipelineObjects, VkError> {
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = built.get(&key) {
            return Ok(*o);
        }
        let o = make()?;
        built.insert(key, o);
        Ok(o)
    }

    /// How many distinct pipelines exist.
    pub fn len(&self) -> usize {
        self.built.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Destroys every pipeline.
    ///
    /// # Safety
    /// `dev` made them all, and nothing uses any of them any more.
    pub unsafe fn destroy_all(&mut self, dev: &ash::Device) {
        let built = self.built.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, o) in built.drain() {
            // SAFETY: as the caller promises.
            unsafe { o.destroy(dev) };
        }
    }
}
