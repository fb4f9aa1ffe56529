//! Building the forward pass a generation runs on: the backend switch, the context
//! sizing (see [`super::fit`]) and what the start cost. A file with a tensor the GPU
//! kernels cannot read is refused before anything is allocated
//! ([`crate::support::check_gpu_readable`]).

use std::sync::Arc;
use std::time::Instant;

use arch::Config;

use crate::generate::fit::{self, CtxRequest};
use crate::generate::forward::{Checked, Forward, ReferenceForward};
use crate::generate::GenerateError;
use crate::session::{Session, SessionOptions};

/// Which implementation computes the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Vulkan compute (the engine).
    Vulkan,
    /// The plain f32 CPU reference (slow; for checking).
    Reference,
}

/// How to build the forward pass.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    /// Vulkan device index (`None`: the default device).
    pub device: Option<usize>,
    /// Session options for the Vulkan backend; its `ctx_len` is replaced by the resolved
    /// context.
    pub session: SessionOptions,
    /// The context asked for.
    pub ctx: CtxRequest,
    /// Run the reference beside the Vulkan session and compare logits (`--check`).
    pub check: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: BackendKind::Vulkan,
            device: None,
            session: SessionOptions::default(),
            ctx: CtxRequest::Default(2048),
            check: false,
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
    /// Bytes of the KV cache (`2 · n_layers · ctx · kv_dim · 4`).
    pub kv_bytes: u64,
    /// Positions the KV cache holds.
    pub ctx_len: usize,
    /// A line for the user when the context was chosen or capped for them (`-c 0`).
    pub ctx_note: Option<String>,
    /// The whole start: device, weights, pipelines, buffers.
    pub load_ms: f64,
    /// The part of `load_ms` that puts the weights where the backend reads them.
    pub weights_load_ms: f64,
}

/// A forward pass ready to generate, and its report.
pub struct Loaded {
    pub forward: Box<dyn Forward>,
    pub info: BackendInfo,
}

/// Builds the forward pass `opts` asks for on `file`. The context is resolved first and
/// a context that does not fit is refused before anything large is allocated.
pub fn load(file: &Arc<gguf::GgufFile>, opts: &LoadOptions) -> Result<Loaded, GenerateError> {
    let start = Instant::now();
    let cfg = Config::from_gguf(file.gguf())?;
    let model_bytes = file.bytes().len() as u64;
    let f32_bytes = file.gguf().tensors.iter().fold(0u64, |s, t| {
        s.saturating_add(t.n_elements().saturating_mul(4))
    });
    let mut info = BackendInfo::default();
    let forward: Box<dyn Forward> = match opts.backend {
        BackendKind::Reference => {
            let choice = fit::resolve(&cfg, opts.ctx, &fit::host_budget(f32_bytes))?;
            let model = reference::Model::load(file)?;
            info = BackendInfo {
                backend: "reference",
                device: "cpu (reference)".into(),
                driver: "reference".into(),
                weights_path: "f32 in RAM".into(),
                kernels: "reference".into(),
                kernels_why: "the CPU reference runs no GPU kernels".into(),
                device_bytes: 0,
                kv_bytes: fit::kv_cache_bytes(&cfg, choice.ctx_len as u64).unwrap_or(0),
                ctx_len: choice.ctx_len,
                ctx_note: choice.note,
                ..info
            };
            Box::new(ReferenceForward::new(model, choice.ctx_len)?)
        }
        BackendKind::Vulkan => {
            // before the device is even opened: a file the kernels cannot read is
            // refused naming the tensor and its type (Session::new checks it too)
            crate::support::check_gpu_readable(&cfg, file.gguf())?;
            let ctx = vk::Context::new(&vk::ContextOptions {
                device_index: opts.device,
                ..Default::default()
            })
            .map_err(crate::EngineError::from)?;
            let mut budget = fit::vulkan_budget(ctx.caps(), model_bytes);
            if opts.check {
                let host = fit::host_budget(f32_bytes);
                if host.bytes < budget.bytes {
                    budget.bytes = host.bytes;
                    budget.what = format!("{} (--check runs the reference too)", host.what);
                }
            }
            let choice = fit::resolve(&cfg, opts.ctx, &budget)?;
            let session_opts = SessionOptions {
                ctx_len: choice.ctx_len,
                ..opts.session.clone()
            };
            let session = Session::new(ctx.clone(), file.clone(), &session_opts)?;
            let report = session.weights().report();
            let kv_bytes = fit::kv_cache_bytes(&cfg, session.ctx_len() as u64).unwrap_or(0);
            info = BackendInfo {
                backend: "vulkan",
                device: ctx.caps().name.clone(),
                driver: format!("{} {}", ctx.caps().driver_name, ctx.caps().driver_info),
                weights_path: report.path.clone(),
                kernels: session.profile().profile.as_str().into(),
                kernels_why: session.profile().why.clone(),
                device_bytes: report.device_bytes.saturating_add(kv_bytes),
                kv_bytes,
                ctx_len: session.ctx_len(),
                ctx_note: choice.note,
                weights_load_ms: report.load_ms,
                ..info
            };
            if opts.check {
                let model = reference::Model::load(file)?;
                let reference = ReferenceForward::new(model, session.ctx_len())?;
                Box::new(Checked::new(session, reference))
            } else {
                Box::new(session)
            }
        }
    };
    info.load_ms = start.elapsed().as_secs_f64() * 1e3;
    if opts.backend == BackendKind::Reference {
        info.weights_load_ms = info.load_ms;
    }
    Ok(Loaded { forward, info })
}
