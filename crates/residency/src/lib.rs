//! Weight residency, the reason vkdecode exists: the GGUF file is mapped once and every
//! tensor becomes a view `(buffer, offset, range)`; kernels cannot tell whether the bytes
//! are the file's own pages (import), anonymous memory read from the file (import of a
//! copy, for drivers that refuse file pages), or a device-local copy (the baseline).
//! See docs/design.md, "Weight residency".
//!
//! - [`plan_shards`] / [`plan_for`]: which bytes go into which allocation, within the
//!   device's limits and the import alignment;
//! - [`Weights::load`]: the plan carried out (import, else copy) and the tensor views;
//! - [`auto_decision`]: what `--weights auto` picks on a device, and why;
//! - [`FileStamp`] and [`sigbus`]: a mapped file that changes or shrinks under the run;
//! - [`pagecache`] and [`memstats`]: the page-cache and process-memory facts the
//!   figures are made of.
//!
//! Depends on `gguf` and `vk` only. `unsafe` is denied here and allowed in three named
//! modules, each block with a SAFETY comment: `sys` (sysconf, mincore, the host-pointer
//! import calls), `sigbus` (the SIGBUS handler: sigaction, write, _exit) and `pagecache`
//! (fadvise, and the read-only map of a file that is only passed to mincore).
#![deny(unsafe_code)]

mod error;
pub mod memstats;
pub mod pagecache;
mod plan;
pub mod sigbus;
mod stamp;
mod sys;
mod weights;

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use vk::{BufferBinding, Capabilities, DeviceType};

pub use error::ResidencyError;
pub use memstats::MemStats;
pub use plan::{plan_shards, Placement, PlanError, Shard, ShardPlan};
pub use stamp::{FileChanged, FileStamp};
pub use weights::Weights;

/// How weights reach the GPU (`--weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsMode {
    /// Import where the device reads host memory at full speed, else copy.
    #[default]
    Auto,
    /// Import the file's pages (or, if refused, an anonymous copy); error if impossible.
    Import,
    /// Device-local buffers filled through a staging buffer.
    Copy,
}

impl fmt::Display for WeightsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightsMode::Auto => "auto",
            WeightsMode::Import => "import",
            WeightsMode::Copy => "copy",
        })
    }
}

impl FromStr for WeightsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WeightsMode::Auto),
            "import" => Ok(WeightsMode::Import),
            "copy" => Ok(WeightsMode::Copy),
            other => Err(format!(
                "unknown weights mode `{other}` (expected auto, import or copy)"
            )),
        }
    }
}

/// Residency options (`--weights`, `--import-cap`, `--mlock`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResidencyOptions {
    /// Mode asked.
    pub mode: WeightsMode,
    /// Upper bound on one shard (allocation), on top of the device's limits.
    pub import_cap: Option<u64>,
    /// Pin the mapped file in memory (gives up the kernel's freedom to reclaim clean pages).
    pub mlock: bool,
}

/// Simulated driver refusals (`VKDECODE_FAULT=import-file,import-anon`), for tests
/// (`fence-timeout` in the same list is `vk::Context`'s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Refuse imports of file-backed pages.
    pub import_file: bool,
    /// Refuse imports of anonymous memory.
    pub import_anon: bool,
}

impl Faults {
    /// Parses a comma list of `import-file`, `import-anon`.
    pub fn parse(s: &str) -> Result<Faults, ResidencyError> {
        let mut f = Faults::default();
        for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match item {
                "import-file" => f.import_file = true,
                "import-anon" => f.import_anon = true,
                // Read by `vk::Context` itself.
                "fence-timeout" => {}
                other => {
                    return Err(ResidencyError::Unsupported(format!(
                        "VKDECODE_FAULT entry `{other}` (expected import-file, import-anon, fence-timeout)"
                    )))
                }
            }
        }
        Ok(f)
    }

    /// From the `VKDECODE_FAULT` environment variable (none if unset).
    pub fn from_env() -> Result<Faults, ResidencyError> {
        match std::env::var("VKDECODE_FAULT") {
            Ok(v) => Faults::parse(&v),
            Err(_) => Ok(Faults::default()),
        }
    }
}

/// What `auto` picks on a device, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AutoDecision {
    /// `Import` or `Copy`.
    pub mode: WeightsMode,
    /// Why.
    pub reason: String,
}

/// Decides `--weights auto` from the capabilities record.
pub fn auto_decision(caps: &Capabilities) -> AutoDecision {
    let copy = |reason: String| AutoDecision {
        mode: WeightsMode::Copy,
        reason,
    };
    if !caps.external_memory_host {
        return copy("VK_EXT_external_memory_host is not supported: weights are copied".into());
    }
    let align = caps.min_imported_host_pointer_alignment.unwrap_or(0);
    match caps.device_type {
        DeviceType::Integrated | DeviceType::Cpu => AutoDecision {
            mode: WeightsMode::Import,
            reason: format!(
                "{} device with VK_EXT_external_memory_host (alignment {align}): the GPU reads \
                 the file's pages in place (anonymous memory if the driver refuses file pages)",
                caps.device_type.as_str()
            ),
        },
        DeviceType::Discrete => copy(
            "discrete GPU: host memory would be read across the bus on every use (measured \
             39x slower), so weights are copied to device memory"
                .into(),
        ),
        DeviceType::Virtual | DeviceType::Other => copy(format!(
            "{} device: unknown whether it reads host memory at full speed, so weights are copied",
            caps.device_type.as_str()
        )),
    }
}

/// The per-allocation cap: the smallest of `maxMemoryAllocationSize`, `maxBufferSize`
/// and the user's cap.
pub fn allocation_cap(caps: &Capabilities, import_cap: Option<u64>) -> u64 {
    let mut cap = caps.max_memory_allocation_size;
    if let Some(b) = caps.max_buffer_size {
        cap = cap.min(b);
    }
    if let Some(u) = import_cap {
        cap = cap.min(u);
    }
    cap
}

/// The shard plan of `file` on a device (what `inspect --plan` prints and `load` uses).
pub fn plan_for(
    caps: &Capabilities,
    file: &gguf::GgufFile,
    import_cap: Option<u64>,
) -> Result<ShardPlan, ResidencyError> {
    let g = file.gguf();
    let tensors: Vec<(u64, u64, u64)> = g
        .tensors
        .iter()
        .map(|t| (g.data_offset + t.offset, t.n_bytes(), t.row_bytes()))
        .collect();
    let file_len = file.bytes().len() as u64;
    let page = sys::page_size();
    let mapping_len = file_len.div_ceil(page) * page;
    let align = caps.min_imported_host_pointer_alignment.unwrap_or(page);
    Ok(plan_shards(
        &tensors,
        file_len,
        mapping_len,
        align,
        allocation_cap(caps, import_cap),
        caps.max_storage_buffer_range,
        caps.min_storage_buffer_offset_alignment,
    )?)
}

/// How one shard got onto the GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardReport {
    /// Absolute file offset.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// `import(file)`, `import(anon)` or `copy`.
    pub path: &'static str,
    /// Why this shard did not take the preferred path, if it did not.
    pub note: Option<String>,
}

/// What `Weights::load` did.
#[derive(Clone, Debug, Serialize)]
pub struct ResidencyReport {
    /// Mode asked.
    pub mode: WeightsMode,
    /// Path taken: `import(file)`, `import(anon)`, `copy`, or `mixed(...)`.
    pub path: String,
    /// Why that path.
    pub reason: String,
    /// Per shard.
    pub shards: Vec<ShardReport>,
    /// Model file size.
    pub model_bytes: u64,
    /// Bytes of device memory allocated for weights (copy path).
    pub device_bytes: u64,
    /// Bytes imported from host memory (file pages or anonymous copies).
    pub imported_bytes: u64,
    /// Bytes of anonymous memory holding copies of file pages (anon import path).
    pub anon_bytes: u64,
    /// Load time (planning, importing/copying), ms.
    pub load_ms: f64,
    /// Bytes of the model file in the page cache when loading started.
    pub file_resident_bytes: u64,
    /// Whether the mapping is pinned with mlock.
    pub mlocked: bool,
    /// Import alignment used by the plan.
    pub alignment: u64,
    /// Effective per-shard cap.
    pub cap: u64,
}

/// One bindable piece: a whole tensor, or a row range of one larger than the cap or
/// `maxStorageBufferRange`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewPart {
    /// Buffer range to bind (offset aligned to `minStorageBufferOffsetAlignment`).
    pub binding: BufferBinding,
    /// Where this part's first row starts inside the binding; a multiple of 4.
    pub byte_offset: u64,
    /// First row of the tensor in this part.
    pub first_row: u64,
    /// Rows in this part.
    pub n_rows: u64,
}

/// A tensor on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorView {
    /// GGUF name.
    pub name: String,
    /// Element type.
    pub ty: gguf::GgmlType,
    /// Shape, fastest dimension first.
    pub shape: Vec<u64>,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Parts in row order (one for most tensors).
    pub parts: Vec<ViewPart>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [WeightsMode::Auto, WeightsMode::Import, WeightsMode::Copy] {
            assert_eq!(m.to_string().parse::<WeightsMode>().unwrap(), m);
        }
        assert!("mmap"
            .parse::<WeightsMode>()
            .unwrap_err()
            .contains("auto, import or copy"));
    }

    #[test]
    fn auto_imports_on_integrated_and_cpu_copies_on_discrete() {
        let mut c = Capabilities {
            external_memory_host: true,
            min_imported_host_pointer_alignment: Some(4096),
            device_type: DeviceType::Cpu,
            ..Default::default()
        };
        let d = auto_decision(&c);
        assert_eq!(d.mode, WeightsMode::Import);
        assert!(d.reason.contains("alignment 4096"), "{}", d.reason);
        c.device_type = DeviceType::Integrated;
        assert_eq!(auto_decision(&c).mode, WeightsMode::Import);
        c.device_type = DeviceType::Discrete;
        let d = auto_decision(&c);
        assert_eq!(d.mode, WeightsMode::Copy);
        assert!(d.reason.contains("discrete"), "{}", d.reason);
        c.device_type = DeviceType::Integrated;
        c.external_memory_host = false;
        let d = auto_decision(&c);
        assert_eq!(d.mode, WeightsMode::Copy);
        assert!(
            d.reason.contains("VK_EXT_external_memory_host"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn cap_is_the_smallest_limit() {
        let mut c = Capabilities {
            max_memory_allocation_size: 2 << 30,
            ..Default::default()
        };
        assert_eq!(allocation_cap(&c, None), 2 << 30);
        c.max_buffer_size = Some(1 << 30);
        assert_eq!(allocation_cap(&c, None), 1 << 30);
        assert_eq!(allocation_cap(&c, Some(1 << 20)), 1 << 20);
    }

    #[test]
    fn faults_parse() {
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        assert_eq!(
            Faults::parse("import-file, import-anon").unwrap(),
            Faults {
                import_file: true,
                import_anon: true
            }
        );
        assert!(Faults::parse("import-gpu")
            .unwrap_err()
            .to_string()
            .contains("import-gpu"));
    }
}
