//! Subgroup facts beyond the size: `VK_EXT_subgroup_size_control` (core in Vulkan 1.3)
//! and whether a compute workgroup of some number of lanes is exactly one subgroup, which
//! kernels reducing a workgroup with one `subgroupAdd` need.

use super::Capabilities;

/// What `VK_EXT_subgroup_size_control` (core in Vulkan 1.3) says about a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubgroupSizeControl {
    /// `minSubgroupSize`.
    pub min: u32,
    /// `maxSubgroupSize`.
    pub max: u32,
    /// `maxComputeWorkgroupSubgroups`.
    pub max_compute_workgroup_subgroups: u32,
    /// `requiredSubgroupSizeStages` includes compute.
    pub required_in_compute: bool,
    /// The `subgroupSizeControl` feature (a pipeline may require a size).
    pub feature: bool,
    /// The `computeFullSubgroups` feature (a pipeline may require full subgroups).
    pub full_subgroups: bool,
}

/// Why a compute workgroup of some number of lanes is exactly one subgroup on a device
/// (see [`Capabilities::one_subgroup_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubgroupGuarantee {
    /// The subgroup size is fixed at that many lanes (`minSubgroupSize == maxSubgroupSize
    /// == subgroupSize`, or no size control and `subgroupSize` equal): the SPIR-V here is
    /// 1.5, so a pipeline without flags runs subgroups of `subgroupSize`.
    Fixed,
    /// The device can be told: the pipeline is created with
    /// `VkPipelineShaderStageRequiredSubgroupSizeCreateInfo` (and full subgroups).
    Required,
}

impl SubgroupGuarantee {
    /// `fixed` or `required`.
    pub fn as_str(self) -> &'static str {
        match self {
            SubgroupGuarantee::Fixed => "fixed",
            SubgroupGuarantee::Required => "required",
        }
    }
}

impl Capabilities {
    /// Whether a compute workgroup of `lanes` invocations is guaranteed to be exactly one
    /// subgroup with subgroup arithmetic, and why; `None` when it is not (kernels that
    /// reduce a workgroup with one `subgroupAdd` must then not be used).
    ///
    /// Preferred: a size the device lets a compute pipeline require (in its
    /// min..max range, with full subgroups so no lane is left out); else a device whose
    /// subgroup size is fixed at `lanes`.
    pub fn one_subgroup_of(&self, lanes: u32) -> Option<SubgroupGuarantee> {
        if lanes == 0
            || !self.subgroup_in_compute
            || !self.subgroup_operations.contains(&"arithmetic")
        {
            return None;
        }
        match self.subgroup_size_control {
            Some(c)
                if c.feature
                    && c.full_subgroups
                    && c.required_in_compute
                    && lanes.is_power_of_two()
                    && (c.min..=c.max).contains(&lanes)
                    && lanes <= self.max_compute_work_group_size[0] =>
            {
                Some(SubgroupGuarantee::Required)
            }
            Some(c) if c.min == lanes && c.max == lanes && self.subgroup_size == lanes => {
                Some(SubgroupGuarantee::Fixed)
            }
            None if self.subgroup_size == lanes => Some(SubgroupGuarantee::Fixed),
            _ => None,
        }
    }
}
