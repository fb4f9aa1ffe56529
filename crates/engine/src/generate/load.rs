//! Loading a model for generation: the device, the context sizing (see [`super::fit`]),
//! the [`Session`] and what the start cost. A file with a tensor the GPU kernels cannot
//! read is refused before anything is allocated ([`crate::support::check_gpu_readable`]).
//! Other backends (the CPU reference, `--check`) are built outside the engine and
//! report the same [`BackendInfo`].

use std::sync::Arc;
use std::time::Instant;

use arch::Config;

use crate::generate::fit::{self, CtxRequest};
use crate::generate::GenerateError;
use crate::session::{Session, SessionOptions};

/// How to load.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Vulkan device index (`None`: the default device).
    pub device: Option<usize>,
    /// Session options; its `ctx_len` is replaced by the resolved context. With several
    /// `slots` the context is resolved per slot, against the device budget divided by
    /// the slots (every slot's rows of a layer share one buffer).
    pub session: SessionOptions,
    /// The context asked for (per slot).
    pub ctx: CtxRequest,
    /// A tighter budget for the KV cache than the device's, when the caller also holds
    /// something large (`--check` holds the f32 reference in RAM).
    pub budget_cap: Option<fit::Budget>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: None,
            session: SessionOptions::default(),
            ctx: CtxRequest::Default(2048),
            budget_cap: None,
        }
    }
}

/// What was built and what it cost.
#[derive(Clone, Debug, Default)]
pub struct BackendInfo {
    /// `vulkan` or `reference`.
    pub backend: &'static str,
    /// Device name (`cpu (reference)` for the reference).
    pub device: String,
    /// The driver's name and version.
    pub driver: String,
    /// Where the weights live (`import`, `copy`, `f32 in RAM`).
    pub weights_path: String,
    /// The kernel profile run (`cpu`, `gpu`; `reference` for the reference) and why
    /// (`kernels::Shapes::for_profile`).
    pub kernels: String,
    pub kernels_why: String,
    /// Bytes of device memory: the weights the device holds plus the KV cache.
    pub device_bytes: u64,
    /// Bytes of the KV cache, every slot's (`slots · 2 · n_layers · ctx · kv_dim · 4`).
    pub kv_bytes: u64,
    /// Positions the KV cache holds (per slot).
    pub ctx_len: usize,
    /// Sequences the backend holds, each with `ctx_len` positions.
    pub slots: usize,
    /// A line for the user when the context was chosen or capped for them (`-c 0`).
    pub ctx_note: Option<String>,
    /// The whole start: device, weights, pipelines, buffers.
    pub load_ms: f64,
    /// The part of `load_ms` that puts the weights where the backend reads them.
    pub weights_load_ms: f64,
}

/// A session ready to generate, and its report.
pub struct Loaded {
    pub session: Session,
    pub info: BackendInfo,
}

/// Loads `file` on the Vulkan device as `opts` asks. The context is resolved first and a
/// context that does not fit is refused before anything large is allocated.
pub fn load(file: &Arc<gguf::GgufFile>, opts: &LoadOptions) -> Result<Loaded, GenerateError> {
    let start = Instant::now();
    let cfg = Config::from_gguf(file.gguf())?;
    // before the device is even opened: a file the kernels cannot read is refused
    // naming the tensor and its type (Session::new checks it too)
    crate::support::check_gpu_readable(&cfg, file.gguf())?;
    let ctx = vk::Context::new(&vk::ContextOptions {
        device_index: opts.device,
        ..Default::default()
    })
    .map_err(crate::EngineError::from)?;
    let n = opts.session.slots.max(1) as u64;
    let whole = fit::vulkan_budget(ctx.caps(), file.bytes().len() as u64);
    let mut budget = match n {
        1 => whole,
        n => fit::Budget {
            bytes: whole.bytes / n,
            max_buffer: whole.max_buffer / n,
            what: format!("{} shared by {n} slot(s)", whole.what),
        },
    };
    if let Some(cap) = opts.budget_cap.as_ref().filter(|c| c.bytes < budget.bytes) {
        budget.bytes = cap.bytes;
        budget.what.clone_from(&cap.what);
    }
    let choice = fit::resolve(&cfg, opts.ctx, &budget)?;
    let session_opts = SessionOptions {
        ctx_len: choice.ctx_len,
        ..opts.session.clone()
    };
    let session = Session::new(ctx.clone(), file.clone(), &session_opts)?;
    let report = session.weights().report();
    let kv_bytes = cfg
        .kv_cache_bytes(session.ctx_len() as u64)
        .unwrap_or(0)
        .saturating_mul(n);
    let info = BackendInfo {
        backend: "vulkan",
        device: ctx.caps().name.clone(),
        driver: format!("{} {}", ctx.caps().driver_name, ctx.caps().driver_info),
        weights_path: report.path.clone(),
        kernels: session.profile().profile.as_str().into(),
        kernels_why: session.profile().why.clone(),
        device_bytes: report.device_bytes.saturating_add(kv_bytes),
        kv_bytes,
        ctx_len: session.ctx_len(),
        slots: session.slots(),
        ctx_note: choice.note,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
        weights_load_ms: report.load_ms,
    };
    Ok(Loaded { session, info })
}
