//! The capabilities record: what the driver reports, read once per physical device.

use std::ffi::CStr;
use std::fmt;

use ash::vk;

mod defects;
mod subgroup;

pub use subgroup::{SubgroupGuarantee, SubgroupSizeControl};

/// Kind of physical device, as the driver reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceType {
    /// GPU sharing the host's memory.
    Integrated,
    /// GPU with its own memory behind a bus.
    Discrete,
    /// A virtualised GPU.
    Virtual,
    /// The CPU itself (lavapipe, SwiftShader).
    Cpu,
    /// Anything else.
    #[default]
    Other,
}

impl DeviceType {
    pub(crate) fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::Integrated,
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::Discrete,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        }
    }

    /// Selection rank: integrated first, then discrete, then CPU, then anything.
    pub fn rank(self) -> u32 {
        match self {
            DeviceType::Integrated => 0,
            DeviceType::Discrete => 1,
            DeviceType::Cpu => 2,
            DeviceType::Virtual | DeviceType::Other => 3,
        }
    }

    /// Lower-case name (`integrated`, `discrete`, `virtual`, `cpu`, `other`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Integrated => "integrated",
            DeviceType::Discrete => "discrete",
            DeviceType::Virtual => "virtual",
            DeviceType::Cpu => "cpu",
            DeviceType::Other => "other",
        }
    }
}

/// One memory heap.
#[derive(Clone, Debug, Default)]
pub struct MemoryHeapInfo {
    /// Size in bytes.
    pub size: u64,
    /// `VK_MEMORY_HEAP_DEVICE_LOCAL_BIT`.
    pub device_local: bool,
}

/// One memory type.
#[derive(Clone, Debug, Default)]
pub struct MemoryTypeInfo {
    /// Heap it allocates from.
    pub heap_index: u32,
    /// Property flags, e.g. `DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT`.
    pub flags: String,
    /// `HOST_VISIBLE` set.
    pub host_visible: bool,
    /// `DEVICE_LOCAL` set.
    pub device_local: bool,
}

/// Everything vkdecode needs to know about a device, read from the driver.
/// (`Default` is all-zero, for tests of code that decides from a record.)
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    /// Index in `vkEnumeratePhysicalDevices` order (what `--device N` means).
    pub index: usize,
    /// Device name.
    pub name: String,
    /// Device type.
    pub device_type: DeviceType,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// Vulkan API version the device supports, `(major, minor, patch)`.
    pub api_version: (u32, u32, u32),
    /// Driver name (`llvmpipe`, `radv`, ...), empty if unknown.
    pub driver_name: String,
    /// Driver info string (e.g. Mesa version).
    pub driver_info: String,
    /// `VK_EXT_external_memory_host` is supported.
    pub external_memory_host: bool,
    /// `minImportedHostPointerAlignment` (only with the extension).
    pub min_imported_host_pointer_alignment: Option<u64>,
    /// `maxMemoryAllocationSize` (Vulkan 1.1 maintenance3).
    pub max_memory_allocation_size: u64,
    /// `maxBufferSize` (Vulkan 1.3 maintenance4); `None` when the device does not say.
    pub max_buffer_size: Option<u64>,
    /// `maxStorageBufferRange`.
    pub max_storage_buffer_range: u64,
    /// `minStorageBufferOffsetAlignment`.
    pub min_storage_buffer_offset_alignment: u64,
    /// `nonCoherentAtomSize`.
    pub non_coherent_atom_size: u64,
    /// `maxPushConstantsSize`.
    pub max_push_constants_size: u32,
    /// `maxComputeWorkGroupCount`.
    pub max_compute_work_group_count: [u32; 3],
    /// `maxComputeWorkGroupSize`.
    pub max_compute_work_group_size: [u32; 3],
    /// `maxComputeWorkGroupInvocations`.
    pub max_compute_work_group_invocations: u32,
    /// `maxComputeSharedMemorySize`.
    pub max_compute_shared_memory_size: u32,
    /// `storageBuffer8BitAccess`.
    pub storage_buffer_8bit: bool,
    /// `storageBuffer16BitAccess`.
    pub storage_buffer_16bit: bool,
    /// `shaderInt8`.
    pub shader_int8: bool,
    /// `shaderInt16`.
    pub shader_int16: bool,
    /// `shaderInt64`.
    pub shader_int64: bool,
    /// `shaderFloat16`.
    pub shader_float16: bool,
    /// `shaderIntegerDotProduct` (Vulkan 1.3).
    pub integer_dot_product: bool,
    /// `integerDotProduct4x8BitPackedSignedAccelerated`.
    pub integer_dot_product_accelerated: bool,
    /// `subgroupSize`.
    pub subgroup_size: u32,
    /// Subgroup operations supported (`basic`, `arithmetic`, `ballot`, `shuffle`, ...).
    pub subgroup_operations: Vec<&'static str>,
    /// Subgroup operations are available in compute shaders.
    pub subgroup_in_compute: bool,
    /// Subgroup size control (Vulkan 1.3 core, or `VK_EXT_subgroup_size_control`): the
    /// range and where a pipeline may require a size; `None` when the device has neither.
    pub subgroup_size_control: Option<SubgroupSizeControl>,
    /// `timestampComputeAndGraphics`.
    pub timestamp_compute_and_graphics: bool,
    /// `timestampPeriod`: nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
    /// `timestampValidBits` of the compute queue family (0 = no timestamps).
    pub timestamp_valid_bits: u32,
    /// Queue family used for compute, if any.
    pub compute_queue_family: Option<u32>,
    /// Memory heaps.
    pub memory_heaps: Vec<MemoryHeapInfo>,
    /// Memory types.
    pub memory_types: Vec<MemoryTypeInfo>,
    /// Every device-local memory type is also host-visible (unified memory).
    pub unified_memory: bool,
    /// Why this runtime cannot use the device, if it cannot.
    pub unsuitable: Option<String>,
}

fn cstr(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn subgroup_ops(f: vk::SubgroupFeatureFlags) -> Vec<&'static str> {
    let all = [
        (vk::SubgroupFeatureFlags::BASIC, "basic"),
        (vk::SubgroupFeatureFlags::VOTE, "vote"),
        (vk::SubgroupFeatureFlags::ARITHMETIC, "arithmetic"),
        (vk::SubgroupFeatureFlags::BALLOT, "ballot"),
        (vk::SubgroupFeatureFlags::SHUFFLE, "shuffle"),
        (
            vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE,
            "shuffle_relative",
        ),
        (vk::SubgroupFeatureFlags::CLUSTERED, "clustered"),
        (vk::SubgroupFeatureFlags::QUAD, "quad"),
    ];
    all.iter()
        .filter(|(b, _)| f.contains(*b))
        .map(|(_, n)| *n)
        .collect()
}

/// Device extensions supported by `pd`.
pub(crate) fn device_extensions(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<Vec<String>, crate::VkError> {
    use crate::error::VkResultExt;
    // SAFETY: `pd` was enumerated from this live instance.
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
        .call("vkEnumerateDeviceExtensionProperties")?;
    Ok(exts.iter().map(|e| cstr(&e.extension_name)).collect())
}

pub(crate) fn has_ext(exts: &[String], name: &CStr) -> bool {
    let n = name.to_string_lossy();
    exts.iter().any(|e| *e == n)
}

/// Reads the record of one physical device.
pub(crate) fn read(
    instance: &ash::Instance,
    instance_api: u32,
    pd: vk::PhysicalDevice,
    index: usize,
) -> Result<Capabilities, crate::VkError> {
    let exts = device_extensions(instance, pd)?;
    let external_memory_host = has_ext(&exts, ash::ext::external_memory_host::NAME);
    let size_control_ext = has_ext(&exts, ash::ext::subgroup_size_control::NAME);
    // SAFETY: `pd` belongs to the live `instance`.
    let base = unsafe { instance.get_physical_device_properties(pd) };
    let api = base.api_version;
    // Structures of a version are only valid if both device and instance have it.
    let effective = api.min(instance_api);
    let v12 = effective >= vk::API_VERSION_1_2;
    let v13 = effective >= vk::API_VERSION_1_3;

    let mut p11 = vk::PhysicalDeviceVulkan11Properties::default();
    let mut p12 = vk::PhysicalDeviceVulkan12Properties::default();
    let mut p13 = vk::PhysicalDeviceVulkan13Properties::default();
    let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut maint4 = vk::PhysicalDeviceMaintenance4Properties::default();
    let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
    let mut hostp = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    // The extension's struct only without Vulkan13Properties (which holds the same
    // fields: chaining both is invalid).
    let mut ssc = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut maint3)
        .push_next(&mut sub);
    if v12 {
        props2 = props2.push_next(&mut p11).push_next(&mut p12);
    }
    if v13 {
        props2 = props2.push_next(&mut p13).push_next(&mut maint4);
    }
    if external_memory_host {
        props2 = props2.push_next(&mut hostp);
    }
    if !v13 && size_control_ext {
        props2 = props2.push_next(&mut ssc);
    }
    // SAFETY: every struct chained is supported by the device's API version or extension.
    unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    let props = props2.properties;
    // Drop the borrows of the chained structs.
    let _ = props2;

    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut fssc = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
    let mut feats2 = vk::PhysicalDeviceFeatures2::default();
    if v12 {
        feats2 = feats2.push_next(&mut f11).push_next(&mut f12);
    }
    if v13 {
        feats2 = feats2.push_next(&mut f13);
    } else if size_control_ext {
        feats2 = feats2.push_next(&mut fssc);
    }
    // SAFETY: as above.
    unsafe { instance.get_physical_device_features2(pd, &mut feats2) };
    let core = feats2.features;
    let _ = feats2;

    // SAFETY: as above.
    let qf = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let compute_qf = qf
        .iter()
        .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .map(|i| i as u32);
    let timestamp_valid_bits = compute_qf
        .map(|i| qf[i as usize].timestamp_valid_bits)
        .unwrap_or(0);

    // SAFETY: as above.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    let memory_heaps: Vec<MemoryHeapInfo> = mem.memory_heaps[..mem.memory_heap_count as usize]
        .iter()
        .map(|h| MemoryHeapInfo {
            size: h.size,
            device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
        })
        .collect();
    let memory_types: Vec<MemoryTypeInfo> = mem.memory_types[..mem.memory_type_count as usize]
        .iter()
        .map(|t| MemoryTypeInfo {
            heap_index: t.heap_index,
            flags: format!("{:?}", t.property_flags),
            host_visible: t
                .property_flags
                .contains(vk::MemoryPropertyFlags::HOST_VISIBLE),
            device_local: t
                .property_flags
                .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL),
        })
        .collect();
    let unified_memory = memory_types.iter().any(|t| t.device_local)
        && memory_types
            .iter()
            .filter(|t| t.device_local)
            .all(|t| t.host_visible);

    let subgroup_size_control = if v13 {
        Some(SubgroupSizeControl {
            min: p13.min_subgroup_size,
            max: p13.max_subgroup_size,
            max_compute_workgroup_subgroups: p13.max_compute_workgroup_subgroups,
            required_in_compute: p13
                .required_subgroup_size_stages
                .contains(vk::ShaderStageFlags::COMPUTE),
            feature: f13.subgroup_size_control == vk::TRUE,
            full_subgroups: f13.compute_full_subgroups == vk::TRUE,
        })
    } else if size_control_ext {
        Some(SubgroupSizeControl {
            min: ssc.min_subgroup_size,
            max: ssc.max_subgroup_size,
            max_compute_workgroup_subgroups: ssc.max_compute_workgroup_subgroups,
            required_in_compute: ssc
                .required_subgroup_size_stages
                .contains(vk::ShaderStageFlags::COMPUTE),
            feature: fssc.subgroup_size_control == vk::TRUE,
            full_subgroups: fssc.compute_full_subgroups == vk::TRUE,
        })
    } else {
        None
    };

    let limits = &props.limits;
    let unsuitable = if !v12 {
        Some(format!(
            "Vulkan {}.{} < 1.2",
            vk::api_version_major(api),
            vk::api_version_minor(api)
        ))
    } else if compute_qf.is_none() {
        Some("no compute queue".to_string())
    } else {
        None
    };
    let (driver_name, driver_info) = if v12 {
        (cstr(&p12.driver_name), cstr(&p12.driver_info))
    } else {
        (String::new(), String::new())
    };
    Ok(Capabilities {
        index,
        name: cstr(&props.device_name),
        device_type: DeviceType::from_vk(props.device_type),
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        api_version: (
            vk::api_version_major(api),
            vk::api_version_minor(api),
            vk::api_version_patch(api),
        ),
        driver_name,
        driver_info,
        external_memory_host,
        min_imported_host_pointer_alignment: external_memory_host
            .then_some(hostp.min_imported_host_pointer_alignment),
        max_memory_allocation_size: maint3.max_memory_allocation_size,
        max_buffer_size: v13.then_some(maint4.max_buffer_size),
        max_storage_buffer_range: u64::from(limits.max_storage_buffer_range),
        min_storage_buffer_offset_alignment: limits.min_storage_buffer_offset_alignment,
        non_coherent_atom_size: limits.non_coherent_atom_size,
        max_push_constants_size: limits.max_push_constants_size,
        max_compute_work_group_count: limits.max_compute_work_group_count,
        max_compute_work_group_size: limits.max_compute_work_group_size,
        max_compute_work_group_invocations: limits.max_compute_work_group_invocations,
        max_compute_shared_memory_size: limits.max_compute_shared_memory_size,
        storage_buffer_8bit: f12.storage_buffer8_bit_access == vk::TRUE,
        storage_buffer_16bit: f11.storage_buffer16_bit_access == vk::TRUE,
        shader_int8: f12.shader_int8 == vk::TRUE,
        shader_int16: core.shader_int16 == vk::TRUE,
        shader_int64: core.shader_int64 == vk::TRUE,
        shader_float16: f12.shader_float16 == vk::TRUE,
        integer_dot_product: f13.shader_integer_dot_product == vk::TRUE,
        integer_dot_product_accelerated: p13.integer_dot_product4x8_bit_packed_signed_accelerated
            == vk::TRUE,
        subgroup_size: sub.subgroup_size,
        subgroup_operations: subgroup_ops(sub.supported_operations),
        subgroup_in_compute: sub.supported_stages.contains(vk::ShaderStageFlags::COMPUTE),
        subgroup_size_control,
        timestamp_compute_and_graphics: limits.timestamp_compute_and_graphics == vk::TRUE,
        timestamp_period_ns: limits.timestamp_period,
        timestamp_valid_bits,
        compute_queue_family: compute_qf,
        memory_heaps,
        memory_types,
        unified_memory,
        unsuitable,
    })
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn bytes(n: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if n >= GIB && n.is_multiple_of(MIB) {
        format!("{n} ({:.2} GiB)", n as f64 / GIB as f64)
    } else if n >= MIB {
        format!("{n} ({:.1} MiB)", n as f64 / MIB as f64)
    } else {
        n.to_string()
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ma, mi, pa) = self.api_version;
        writeln!(
            f,
            "device {}: {} ({})",
            self.index,
            self.name,
            self.device_type.as_str()
        )?;
        writeln!(
            f,
            "  vendor/device id             {:#06x}/{:#06x}",
            self.vendor_id, self.device_id
        )?;
        writeln!(f, "  api version                  {ma}.{mi}.{pa}")?;
        writeln!(
            f,
            "  driver                       {} {}",
            self.driver_name, self.driver_info
        )?;
        writeln!(
            f,
            "  VK_EXT_external_memory_host  {}",
            yes(self.external_memory_host)
        )?;
        match self.min_imported_host_pointer_alignment {
            Some(a) => writeln!(f, "  minImportedHostPointerAlign  {a}")?,
            None => writeln!(f, "  minImportedHostPointerAlign  -")?,
        }
        writeln!(
            f,
            "  maxMemoryAllocationSize      {}",
            bytes(self.max_memory_allocation_size)
        )?;
        match self.max_buffer_size {
            Some(b) => writeln!(f, "  maxBufferSize                {}", bytes(b))?,
            None => writeln!(f, "  maxBufferSize                (not reported)")?,
        }
        writeln!(
            f,
            "  maxStorageBufferRange        {}",
            bytes(self.max_storage_buffer_range)
        )?;
        writeln!(
            f,
            "  minStorageBufferOffsetAlign  {}",
            self.min_storage_buffer_offset_alignment
        )?;
        writeln!(
            f,
            "  maxPushConstantsSize         {}",
            self.max_push_constants_size
        )?;
        writeln!(
            f,
            "  compute workgroup            size {:?}, invocations {}, shared {} B",
            self.max_compute_work_group_size,
            self.max_compute_work_group_invocations,
            self.max_compute_shared_memory_size
        )?;
        writeln!(
            f,
            "  8/16-bit storage             {}/{}",
            yes(self.storage_buffer_8bit),
            yes(self.storage_buffer_16bit)
        )?;
        writeln!(
            f,
            "  int8/int16/int64/float16     {}/{}/{}/{}",
            yes(self.shader_int8),
            yes(self.shader_int16),
            yes(self.shader_int64),
            yes(self.shader_float16)
        )?;
        writeln!(
            f,
            "  integer dot product          {} (accelerated: {})",
            yes(self.integer_dot_product),
            yes(self.integer_dot_product_accelerated)
        )?;
        writeln!(
            f,
            "  subgroups                    size {}, compute {}, ops {}",
            self.subgroup_size,
            yes(self.subgroup_in_compute),
            self.subgroup_operations.join(",")
        )?;
        match &self.subgroup_size_control {
            Some(c) => writeln!(
                f,
                "  subgroup size control        min {}, max {}, required in compute {}, full subgroups {}, feature {}, max {} per workgroup",
                c.min,
                c.max,
                yes(c.required_in_compute),
                yes(c.full_subgroups),
                yes(c.feature),
                c.max_compute_workgroup_subgroups
            )?,
            None => writeln!(f, "  subgroup size control        no")?,
        }
        writeln!(
            f,
            "  timestamps                   {} bits, {} ns/tick",
            self.timestamp_valid_bits, self.timestamp_period_ns
        )?;
        for (i, h) in self.memory_heaps.iter().enumerate() {
            writeln!(
                f,
                "  heap {i}                       {}{}",
                bytes(h.size),
                if h.device_local { " DEVICE_LOCAL" } else { "" }
            )?;
        }
        for (i, t) in self.memory_types.iter().enumerate() {
            writeln!(
                f,
                "  memory type {i}                heap {} {}",
                t.heap_index, t.flags
            )?;
        }
        writeln!(
            f,
            "  unified memory               {}",
            yes(self.unified_memory)
        )?;
        if let Some(why) = &self.unsuitable {
            writeln!(f, "  UNSUITABLE                   {why}")?;
        }
        Ok(())
    }
}
