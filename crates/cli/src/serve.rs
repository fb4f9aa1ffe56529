//! `vkdecode serve -m model.gguf`: the OpenAI-compatible HTTP server (crates/server).
//!
//! Glue: parses the flags, loads the slots on the engine thread, binds, serves until
//! SIGTERM or Ctrl-C, then shuts down gracefully (no new connections, in-flight
//! requests finish within `--shutdown-grace` or are cancelled) and exits 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use engine::generate::CtxRequest;

use crate::stats::parse_size;

/// Arguments of `vkdecode serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Path to the GGUF model file.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,

    /// Address to bind (localhost by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0: any free port, printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Slots: requests generated at the same time, each with its own KV cache of
    /// --ctx-size positions (sized and reported at start).
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: usize,

    /// Context of EACH slot in tokens (prompt plus generated); default 2048 (or the
    /// model's context if smaller); 0: the model's trained context, capped to what fits
    /// for all the slots. A request's max_tokens is capped by what its slot's context
    /// leaves after the prompt.
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,

    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,

    /// Largest request body, e.g. 4MiB (413 above).
    #[arg(long = "max-body", value_name = "SIZE", value_parser = parse_size, default_value = "4MiB")]
    pub max_body: u64,

    /// Requests that may wait for a free slot; beyond, 503 with Retry-After.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,

    /// The model's name in /v1/models (default: the file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,

    /// Seconds in-flight requests may run after SIGTERM before they are cancelled.
    #[arg(long = "shutdown-grace", default_value_t = 10.0)]
    pub shutdown_grace: f64,

    /// Vulkan device index (see `vkdecode info`).
    #[arg(long)]
    pub device: Option<usize>,

    /// How the weights reach the GPU: auto, import (file pages, shared by every slot) or
    /// copy (one copy per slot).
    #[arg(long, value_enum, default_value_t = crate::run::WeightsArg::Auto)]
    pub weights: crate::run::WeightsArg,
}

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if args.queue == 0 {
        bail!("--queue must be at least 1");
    }
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        bail!("--shutdown-grace must be 0 or more seconds");
    }
    let max_body = usize::try_from(args.max_body).context("--max-body is too large")?;
    let path = &args.model;
    let file = Arc::new(
        gguf::GgufFile::open(path).with_context(|| format!("opening model {}", path.display()))?,
    );
    // a SIGBUS in the mapping (the file shrank under the server) names the file, exit 74
    engine::residency::sigbus::install(&file).context("installing the SIGBUS handler")?;
    let template = tokenizer::ChatTemplate::from_gguf(file.gguf())
        .context("reading the model's chat template")?;
    if template.is_none() {
        eprintln!("note: the model has no chat template: /v1/chat/completions answers 400, use /v1/completions");
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = file_name
        .strip_suffix(".gguf")
        .unwrap_or(&file_name)
        .to_string();
    let model_id = args.alias.clone().unwrap_or_else(|| stem.clone());

    let slots_opts = server::SlotsOptions {
        slots: args.parallel,
        ctx: match args.ctx_size {
            None => CtxRequest::Default(2048),
            Some(0) => CtxRequest::Model,
            Some(n) => CtxRequest::Exact(n),
        },
        device: args.device,
        session: engine::SessionOptions {
            weights: engine::ResidencyOptions {
                mode: args.weights.into(),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let metrics = Arc::new(server::Metrics::default());
    // before every engine step: stop with an error if the model file was rewritten in
    // place (as the main command checks between chunks and tokens)
    let stamp = engine::residency::FileStamp::take(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let guard: server::scheduler::Guard =
        Box::new(move || stamp.check().map_err(|e| e.to_string()));
    let build_file = file.clone();
    // the HTTP side (tokenize, detokenize, chat prompts) shares the engine's tokenizer
    let (scheduler, (info, tok), engine_thread) = server::Scheduler::spawn(
        move || {
            let slots = server::Slots::load(&build_file, &slots_opts)?;
            let info = slots.info().clone();
            let tok = Arc::clone(slots.tokenizer());
            Ok((slots, (info, tok)))
        },
        args.queue,
        metrics.clone(),
        Some(guard),
    )?;
    if let Some(note) = &info.ctx_note {
        eprintln!("{note}");
    }
    eprintln!(
        "vkdecode serve: {} on {} | weights {} | {} slot(s) x {} tokens, KV cache {:.1} MiB per slot ({:.1} MiB in all) | load {:.0} ms",
        model_id,
        info.device,
        info.weights_path,
        args.parallel,
        info.ctx_per_slot,
        info.kv_bytes_per_slot as f64 / (1 << 20) as f64,
        (info.kv_bytes_per_slot * args.parallel as u64) as f64 / (1 << 20) as f64,
        info.load_ms,
    );
    let opts = server::ServerOptions {
        model_id: model_id.clone(),
        model_aliases: vec![file_name, stem, path.display().to_string()],
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body,
        queue: args.queue,
        ctx_len: info.ctx_per_slot,
        n_slots: args.parallel,
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
    };
    let state = Arc::new(server::AppState::new(
        opts, scheduler, tok, template, metrics,
    ));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", args.host, args.port);
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        eprintln!("vkdecode serve: listening on http://{local}");
        server::serve(listener, state, shutdown_signal())
            .await
            .context("serving")
    })?;
    drop(runtime);
    // every handle on the queue is gone: the engine thread ends once its jobs have
    engine_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    eprintln!("vkdecode serve: stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                eprintln!("warning: cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("vkdecode serve: shutting down");
}
