//! Instance, validation messenger, device selection, the logical device and its queue.

use std::ffi::{c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};

use crate::caps::{self, Capabilities};
use crate::command::CommandBuffer;
use crate::error::{VkError, VkResultExt};
use crate::pipeline_cache::PipelineCache;
use crate::validation::{self, Counters};

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";
/// How long a fence wait may take before the GPU is declared hung.
const FENCE_TIMEOUT: Duration = Duration::from_secs(300);

/// How to create a [`Context`].
#[derive(Clone, Debug)]
pub struct ContextOptions {
    /// Use this device (index in enumeration order) instead of the automatic choice.
    pub device_index: Option<usize>,
    /// Enable `VK_LAYER_KHRONOS_validation` and count its messages.
    pub validate: bool,
}

impl Default for ContextOptions {
    /// No device override; validation on when `VKDECODE_VALIDATE=1`.
    fn default() -> Self {
        ContextOptions {
            device_index: None,
            validate: std::env::var("VKDECODE_VALIDATE").is_ok_and(|v| v == "1"),
        }
    }
}

/// Loader + instance (+ optional messenger); destroyed in reverse order in `Drop`.
struct InstanceOwner {
    // Field order: `entry` must outlive the instance; it is dropped last.
    instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Counters the messenger callback writes through; boxed so its address is stable.
    messages: Box<Counters>,
    /// API version the instance was created with (caps the effective device version).
    api: u32,
    entry: ash::Entry,
}

impl Drop for InstanceOwner {
    fn drop(&mut self) {
        // SAFETY: every child object (device, messenger) is destroyed before the
        // instance; the Context's Drop destroyed the device already.
        unsafe {
            if let Some((du, m)) = self.debug.take() {
                du.destroy_debug_utils_messenger(m, None);
            }
            self.instance.destroy_instance(None);
        }
        let _ = &self.entry;
    }
}

fn create_instance(validate: bool) -> Result<InstanceOwner, VkError> {
    // SAFETY: loading libvulkan runs its initialisers; we trust the system loader.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| VkError::Loading(e.to_string()))?;
    let messages = Box::<Counters>::default();
    let mut layers = Vec::new();
    let mut exts = Vec::new();
    if validate {
        // SAFETY: plain query on a loaded entry.
        let avail = unsafe { entry.enumerate_instance_layer_properties() }
            .call("vkEnumerateInstanceLayerProperties")?;
        let found = avail
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
        if !found {
            return Err(VkError::NoValidationLayer);
        }
        layers.push(VALIDATION_LAYER.as_ptr());
        exts.push(ash::ext::debug_utils::NAME.as_ptr());
        // provided by the layer: turns synchronization validation on (below)
        exts.push(ash::ext::validation_features::NAME.as_ptr());
    }
    // SAFETY: plain query on a loaded entry.
    let loader = unsafe { entry.try_enumerate_instance_version() }
        .call("vkEnumerateInstanceVersion")?
        .unwrap_or(vk::API_VERSION_1_0);
    let api = loader.min(vk::API_VERSION_1_3);
    let app = vk::ApplicationInfo::default()
        .application_name(c"vkdecode")
        .engine_name(c"vkdecode")
        .api_version(api.max(vk::API_VERSION_1_2));
    let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(validation::on_message))
        .user_data(&*messages as *const Counters as *mut c_void);
    // Hazards between dispatches (a read before the barrier that orders it) are what an
    // engine that orders layers with barriers gets wrong; the core checks do not see them.
    let enabled = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
    let mut features = vk::ValidationFeaturesEXT::default().enabled_validation_features(&enabled);
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&exts);
    if validate {
        // Also catches messages from vkCreateInstance/vkDestroyInstance.
        info = info.push_next(&mut messenger_info).push_next(&mut features);
    }
    // SAFETY: `info` and everything it points to live until the call returns.
    let instance = unsafe { entry.create_instance(&info, None) }.call("vkCreateInstance")?;
    let mut owner = InstanceOwner {
        instance,
        debug: None,
        messages,
        api,
        entry,
    };
    if validate {
        let du = ash::ext::debug_utils::Instance::new(&owner.entry, &owner.instance);
        // SAFETY: the instance was created with VK_EXT_debug_utils; the user-data
        // pointer targets the boxed counter owned by `owner`, which outlives the messenger.
        let m = unsafe { du.create_debug_utils_messenger(&messenger_info, None) }
            .call("vkCreateDebugUtilsMessengerEXT")?;
        owner.debug = Some((du, m));
    }
    Ok(owner)
}

/// Every physical device with its capabilities record (for `vkdecode info`).
pub fn enumerate_devices() -> Result<Vec<Capabilities>, VkError> {
    let inst = create_instance(false)?;
    // SAFETY: live instance.
    let pds =
        unsafe { inst.instance.enumerate_physical_devices() }.call("vkEnumeratePhysicalDevices")?;
    pds.iter()
        .enumerate()
        .map(|(i, &pd)| caps::read(&inst.instance, inst.api, pd, i))
        .collect()
}

/// The device [`Context::new`] picks without an override: the first suitable one in the
/// order integrated, discrete, CPU, anything else.
pub fn default_device(all: &[Capabilities]) -> Option<usize> {
    all.iter()
        .filter(|c| c.unsuitable.is_none())
        .min_by_key(|c| (c.device_type.rank(), c.index))
        .map(|c| c.index)
}

/// Picks a device: the override, else integrated, discrete, CPU, anything (suitable only).
fn choose(all: &[Capabilities], index: Option<usize>) -> Result<usize, VkError> {
    if let Some(i) = index {
        let c = all.get(i).ok_or(VkError::DeviceIndex {
            index: i,
            count: all.len(),
        })?;
        if let Some(why) = &c.unsuitable {
            return Err(VkError::Unsuitable {
                device: c.name.clone(),
                why: why.clone(),
            });
        }
        return Ok(i);
    }
    default_device(all).ok_or(VkError::NoDevice)
}

/// Whether the comma list in `VKDECODE_FAULT` (simulated failures, for tests) names
/// `what`. The engine reads the same variable for its own entries.
fn fault_from_env(what: &str) -> bool {
    std::env::var("VKDECODE_FAULT").is_ok_and(|v| v.split(',').any(|x| x.trim() == what))
}

/// Queue + fence guarded together: submissions must be externally synchronised.
struct QueueState {
    queue: vk::Queue,
    fence: vk::Fence,
}

/// The Vulkan context every other object hangs off (through an `Arc`).
pub struct Context {
    // Drop order is explicit in `Drop`: wait idle, pipelines, allocator, fence, device,
    // instance.
    allocator: ManuallyDrop<Mutex<Allocator>>,
    /// Every pipeline built on this device, by description (pipeline_cache.rs).
    pipelines: PipelineCache,
    queue: Mutex<QueueState>,
    device: ash::Device,
    host_memory: Option<ash::ext::external_memory_host::Device>,
    physical_device: vk::PhysicalDevice,
    queue_family: u32,
    caps: Capabilities,
    host_waits: AtomicU64,
    device_bytes: AtomicU64,
    imported_bytes: AtomicU64,
    /// Device memory allocations alive now / made so far (allocator-backed buffers and
    /// host-pointer imports: one each).
    live_allocations: AtomicU64,
    total_allocations: AtomicU64,
    /// `VKDECODE_FAULT=fence-timeout` (tests): the next fence wait reports a timeout.
    fault_timeout: AtomicBool,
    instance: ManuallyDrop<InstanceOwner>,
}

impl Context {
    /// Creates instance, device, queue and allocator on the chosen device.
    pub fn new(opts: &ContextOptions) -> Result<Arc<Context>, VkError> {
        let inst = create_instance(opts.validate)?;
        // From here on, an early return drops `inst` (destroying the instance).
        // SAFETY: live instance.
        let pds = unsafe { inst.instance.enumerate_physical_devices() }
            .call("vkEnumeratePhysicalDevices")?;
        let all: Vec<Capabilities> = pds
            .iter()
            .enumerate()
            .map(|(i, &pd)| caps::read(&inst.instance, inst.api, pd, i))
            .collect::<Result<_, _>>()?;
        let chosen = choose(&all, opts.device_index)?;
        let caps = all[chosen].clone();
        let pd = pds[chosen];
        let queue_family = caps
            .compute_queue_family
            .ok_or_else(|| VkError::Unsuitable {
                device: caps.name.clone(),
                why: "no compute queue".into(),
            })?;

        let v13 = caps.api_version >= (1, 3, 0) && inst.api >= vk::API_VERSION_1_3;
        let mut ext_names = Vec::new();
        if caps.external_memory_host {
            ext_names.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        // Enable exactly the optional features the device has.
        let core = vk::PhysicalDeviceFeatures::default()
            .shader_int16(caps.shader_int16)
            .shader_int64(caps.shader_int64);
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(caps.storage_buffer_16bit);
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .storage_buffer8_bit_access(caps.storage_buffer_8bit)
            .shader_int8(caps.shader_int8)
            .shader_float16(caps.shader_float16);
        // Subgroup size control, where the device has it, so that kernels which need a
        // workgroup to be one subgroup can require their size (caps::one_subgroup_of).
        let ssc = caps.subgroup_size_control.unwrap_or_default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default()
            .shader_integer_dot_product(caps.integer_dot_product)
            .subgroup_size_control(ssc.feature)
            .compute_full_subgroups(ssc.full_subgroups);
        let size_control_ext = !v13 && ssc.feature;
        if size_control_ext {
            ext_names.push(ash::ext::subgroup_size_control::NAME.as_ptr());
        }
        let mut fssc = vk::PhysicalDeviceSubgroupSizeControlFeatures::default()
            .subgroup_size_control(ssc.feature)
            .compute_full_subgroups(ssc.full_subgroups);
        let prio = [1.0f32];
        let qinfo = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&prio)];
        let mut dinfo = vk::DeviceCreateInfo::default()
            .queue_create_infos(&qinfo)
            .enabled_extension_names(&ext_names)
            .enabled_features(&core)
            .push_next(&mut f11)
            .push_next(&mut f12);
        if v13 {
            dinfo = dinfo.push_next(&mut f13);
        } else if size_control_ext {
            dinfo = dinfo.push_next(&mut fssc);
        }
        // SAFETY: `pd` belongs to the instance; only supported features/extensions are enabled.
        let device =
            unsafe { inst.instance.create_device(pd, &dinfo, None) }.call("vkCreateDevice")?;
        // SAFETY: queue family/index 0 was requested above.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        // SAFETY: live device.
        let fence = match unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: nothing else was created on the device.
                unsafe { device.destroy_device(None) };
                return Err(VkError::Call {
                    call: "vkCreateFence",
                    result: e,
                });
            }
        };
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: inst.instance.clone(),
            device: device.clone(),
            physical_device: pd,
            debug_settings: Default::default(),
            buffer_device_address: false,
            allocation_sizes: Default::default(),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: only the fence was created on the device.
                unsafe {
                    device.destroy_fence(fence, None);
                    device.destroy_device(None);
                }
                return Err(VkError::Alloc {
                    name: "allocator".into(),
                    size: 0,
                    source: e,
                });
            }
        };
        let host_memory = caps
            .external_memory_host
            .then(|| ash::ext::external_memory_host::Device::new(&inst.instance, &device));
        tracing::info!(
            device = %caps.name,
            kind = caps.device_type.as_str(),
            validate = opts.validate,
            "vulkan device"
        );
        if let Some(defect) = caps.known_defect() {
            tracing::warn!("{defect}");
        }
        Ok(Arc::new(Context {
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            queue: Mutex::new(QueueState { queue, fence }),
            device,
            host_memory,
            physical_device: pd,
            queue_family,
            caps,
            host_waits: AtomicU64::new(0),
            device_bytes: AtomicU64::new(0),
            imported_bytes: AtomicU64::new(0),
            live_allocations: AtomicU64::new(0),
            total_allocations: AtomicU64::new(0),
            fault_timeout: AtomicBool::new(fault_from_env("fence-timeout")),
            pipelines: PipelineCache::default(),
            instance: ManuallyDrop::new(inst),
        }))
    }

    /// The chosen device's capabilities.
    pub fn caps(&self) -> &Capabilities {
        &self.caps
    }

    pub(crate) fn pipeline_cache(&self) -> &PipelineCache {
        &self.pipelines
    }

    /// How many distinct pipelines this context has built (each is built once and kept
    /// until the context goes).
    pub fn pipelines_built(&self) -> usize {
        self.pipelines.len()
    }

    /// Validation and driver messages (warnings + errors) seen so far that are not on the
    /// allow-list ([`crate::validation::ALLOWED`]); 0 without validation.
    pub fn validation_errors(&self) -> u64 {
        self.instance.messages.errors.load(Ordering::Relaxed)
    }

    /// Messages let through by id ([`crate::validation::ALLOWED`]) so far.
    pub fn validation_allowed(&self) -> u64 {
        self.instance.messages.allowed.load(Ordering::Relaxed)
    }

    /// Sends a message through the validation messenger as the layer would (for tests of
    /// the allow-list); does nothing without validation.
    pub fn submit_debug_message(&self, id: i32, name: &CStr, text: &CStr) {
        let Some((du, _)) = &self.instance.debug else {
            return;
        };
        let data = vk::DebugUtilsMessengerCallbackDataEXT::default()
            .message_id_number(id)
            .message_id_name(name)
            .message(text);
        // SAFETY: the instance was created with VK_EXT_debug_utils (that is when `debug`
        // is set); `data` and its strings live until the call returns.
        unsafe {
            du.submit_debug_utils_message(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION,
                &data,
            )
        };
    }

    /// Whether the validation layer is on.
    pub fn validating(&self) -> bool {
        self.instance.debug.is_some()
    }

    /// Fence waits done by [`Context::submit_and_wait`] so far.
    pub fn host_waits(&self) -> u64 {
        self.host_waits.load(Ordering::Relaxed)
    }

    /// Bytes currently held in allocator-backed [`crate::Buffer`]s.
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes.load(Ordering::Relaxed)
    }

    /// Bytes currently imported through [`crate::ImportedBuffer`]s.
    pub fn imported_bytes(&self) -> u64 {
        self.imported_bytes.load(Ordering::Relaxed)
    }

    /// Device memory allocations alive now: every [`crate::Buffer`] and
    /// [`crate::ImportedBuffer`] created on this context and not yet destroyed (each owns
    /// one allocation). A leak per token shows up here.
    pub fn live_allocations(&self) -> u64 {
        self.live_allocations.load(Ordering::Relaxed)
    }

    /// Device memory allocations made on this context so far, freed or not. An
    /// allocation per token shows up here even when it is freed again.
    pub fn total_allocations(&self) -> u64 {
        self.total_allocations.load(Ordering::Relaxed)
    }

    /// Submits one recorded command buffer and waits for its fence (one host wait).
    ///
    /// On return the submission has completed (or the device is lost), whatever the
    /// result: the command buffer and everything it recorded may be reset or dropped.
    /// When the fence does not signal within the deadline, the wait continues without
    /// one before [`VkError::Timeout`] is returned, so that dropping the command buffer
    /// (which destroys its pool) never frees work the GPU is still running, and the fence
    /// is reset for the next submission. A GPU that really hangs is reported by the
    /// driver as lost, which ends that second wait.
    pub fn submit_and_wait(&self, cmd: &CommandBuffer) -> Result<(), VkError> {
        cmd.check_submittable()?;
        let bufs = [cmd.raw()];
        let submit = [vk::SubmitInfo::default().command_buffers(&bufs)];
        let q = self
            .queue
            .lock()
            .map_err(|_| VkError::Recording("queue mutex poisoned".into()))?;
        // `VKDECODE_FAULT=fence-timeout`: the first wait of this context times out at once.
        let forced = self.fault_timeout.swap(false, Ordering::Relaxed);
        let timeout = if forced {
            0
        } else {
            FENCE_TIMEOUT.as_nanos() as u64
        };
        // SAFETY: the queue and fence are externally synchronised by the mutex; the
        // command buffer is in the executable state (checked above) and owned by `cmd`,
        // which the caller keeps alive across this call; the fence is unsignalled (every
        // path below that returns after the submit has waited for it and reset it, or
        // the device is lost).
        unsafe {
            self.device
                .queue_submit(q.queue, &submit, q.fence)
                .call("vkQueueSubmit")?;
            let mut waited = self.device.wait_for_fences(&[q.fence], true, timeout);
            if forced {
                waited = Err(vk::Result::TIMEOUT);
            }
            self.host_waits.fetch_add(1, Ordering::Relaxed);
            match waited {
                Ok(()) => {}
                Err(vk::Result::TIMEOUT) => {
                    tracing::error!(
                        timeout_s = FENCE_TIMEOUT.as_secs(),
                        forced,
                        "the GPU did not finish in time; waiting for it before reporting"
                    );
                    // The command buffer is still pending: wait until it is not.
                    let done = self.device.wait_for_fences(&[q.fence], true, u64::MAX);
                    if done.is_ok() {
                        self.device.reset_fences(&[q.fence]).call("vkResetFences")?;
                    }
                    return Err(VkError::Timeout(FENCE_TIMEOUT.as_secs()));
                }
                Err(e) => {
                    return Err(VkError::Call {
                        call: "vkWaitForFences",
                        result: e,
                    })
                }
            }
            self.device.reset_fences(&[q.fence]).call("vkResetFences")?;
        }
        // With validation on, a message that is not on the allow-list fails the work it
        // came with (and all work after it): a validated run must not pass by printing.
        match self.validation_errors() {
            0 => Ok(()),
            count => Err(VkError::Validation { count }),
        }
    }

    /// `(uniformTexelBufferOffsetAlignmentBytes or minTexelBufferOffsetAlignment,
    /// maxTexelBufferElements)`, read from the driver.
    pub fn texel_limits(&self) -> (u64, u32) {
        // SAFETY: live instance and physical device.
        let props = unsafe {
            self.instance
                .instance
                .get_physical_device_properties(self.physical_device)
        };
        (
            props.limits.min_texel_buffer_offset_alignment,
            props.limits.max_texel_buffer_elements,
        )
    }

    pub(crate) fn device(&self) -> &ash::Device {
        &self.device
    }

    pub(crate) fn queue_family(&self) -> u32 {
        self.queue_family
    }

    pub(crate) fn host_memory(&self) -> Option<&ash::ext::external_memory_host::Device> {
        self.host_memory.as_ref()
    }

    pub(crate) fn allocator(&self) -> &Mutex<Allocator> {
        &self.allocator
    }

    pub(crate) fn add_device_bytes(&self, n: u64, add: bool) {
        if add {
            self.device_bytes.fetch_add(n, Ordering::Relaxed);
        } else {
            self.device_bytes.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Counts one allocation made (`true`) or freed (`false`).
    pub(crate) fn count_allocation(&self, made: bool) {
        if made {
            self.live_allocations.fetch_add(1, Ordering::Relaxed);
            self.total_allocations.fetch_add(1, Ordering::Relaxed);
        } else {
            self.live_allocations.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_imported_bytes(&self, n: u64, add: bool) {
        if add {
            self.imported_bytes.fetch_add(n, Ordering::Relaxed);
        } else {
            self.imported_bytes.fetch_sub(n, Ordering::Relaxed);
        }
    }

    #[allow(dead_code)]
    pub(crate) fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical_device
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: children hold an `Arc<Context>`, so none is alive now. Wait for the
        // GPU, destroy the pipelines (no pipeline, set or recording is left to use them),
        // free the allocator's memory blocks, then the fence, device and instance.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.pipelines.destroy_all(&self.device);
            ManuallyDrop::drop(&mut self.allocator);
            if let Ok(q) = self.queue.get_mut() {
                self.device.destroy_fence(q.fence, None);
            }
            self.device.destroy_device(None);
            ManuallyDrop::drop(&mut self.instance);
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.caps.name)
            .finish_non_exhaustive()
    }
}
