//! The error type of the Vulkan runtime.

use ash::vk;

/// Everything that can go wrong in `vk`.
#[derive(Debug, thiserror::Error)]
pub enum VkError {
    /// The Vulkan loader (libvulkan.so.1) could not be opened.
    #[error("cannot load the Vulkan library: {0}")]
    Loading(String),
    /// A Vulkan call returned an error.
    #[error("{call} failed: {result}")]
    Call {
        /// The Vulkan entry point.
        call: &'static str,
        /// What it returned.
        result: vk::Result,
    },
    /// No physical device exposes Vulkan 1.2 compute.
    #[error("no Vulkan device found (install mesa-vulkan-drivers for lavapipe, or set VKDECODE_ALLOW_NO_GPU=1 in tests)")]
    NoDevice,
    /// `--device N` is out of range.
    #[error("device index {index} out of range: {count} device(s) found")]
    DeviceIndex {
        /// Asked index.
        index: usize,
        /// How many devices exist.
        count: usize,
    },
    /// The device lacks something this runtime needs.
    #[error("device `{device}` is unsuitable: {why}")]
    Unsuitable {
        /// Device name.
        device: String,
        /// What is missing.
        why: String,
    },
    /// Validation was asked for but the layer is not installed.
    #[error("VKDECODE_VALIDATE=1 but VK_LAYER_KHRONOS_validation is not installed (apt install vulkan-validationlayers)")]
    NoValidationLayer,
    /// gpu-allocator failed.
    #[error("allocating `{name}` ({size} bytes): {source}")]
    Alloc {
        /// Buffer name.
        name: String,
        /// Requested size.
        size: u64,
        /// Allocator error.
        #[source]
        source: gpu_allocator::AllocationError,
    },
    /// Host access to a buffer that is not host-visible (or not coherent).
    #[error("buffer `{0}` is not host-visible and coherent; use a staging buffer")]
    NotHostVisible(String),
    /// A host read/write outside the buffer.
    #[error("access of {len} bytes at offset {offset} is outside buffer `{name}` of {size} bytes")]
    OutOfBounds {
        /// Buffer name.
        name: String,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Buffer size.
        size: u64,
    },
    /// A host-pointer import was refused before or by the driver.
    #[error("host-pointer import of {len} bytes at {ptr:#x} refused: {why}")]
    Import {
        /// The pointer.
        ptr: usize,
        /// The length.
        len: u64,
        /// Why.
        why: String,
    },
    /// A pipeline or dispatch description is invalid.
    #[error("kernel `{kernel}`: {why}")]
    Pipeline {
        /// The kernel name.
        kernel: &'static str,
        /// Why.
        why: String,
    },
    /// An error recorded while recording commands (reported by `end`).
    #[error("recording: {0}")]
    Recording(String),
    /// A fence wait timed out (device hang).
    #[error("GPU did not finish within {0} s")]
    Timeout(u64),
    /// Validation is on and the layer or the driver reported messages that are not on
    /// the allow-list (`vk::validation::ALLOWED`).
    #[error("the Vulkan validation layer or driver reported {count} message(s) (logged above; validation is on)")]
    Validation {
        /// Messages counted so far.
        count: u64,
    },
}

/// Wraps a raw `vk::Result` with the call's name.
pub(crate) trait VkResultExt<T> {
    fn call(self, call: &'static str) -> Result<T, VkError>;
}

impl<T> VkResultExt<T> for Result<T, vk::Result> {
    fn call(self, call: &'static str) -> Result<T, VkError> {
        self.map_err(|result| VkError::Call { call, result })
    }
}
