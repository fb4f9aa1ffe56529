//! `vkdecode serve -m model.gguf`: the OpenAI-compatible HTTP server (crates/server).
//!
//! Glue: parses the flags, loads the slots on the engine thread, binds, serves until
//! SIGTERM or Ctrl-C, then shuts down gracefully (no new connections, in-flight
//! requests finish within `--shutdown-grace` or are cancelled) and exits 0.
//!
//! Who may reach it (README "Security"): `--api-key` or `VKDECODE_API_KEY` (never
//! empty), `--allowed-hosts` (Host names besides loopback and the bound address),
//! `--cors-origin` (web origins allowed to call it); how long and how many connections
//! may be held: the timeouts and `--max-connections`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

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

    /// Most prompt tokens one prefill submission takes (llama.cpp's `-ub`); default: the
    /// device's (64 on lavapipe). The activation buffers are sized for this many tokens.
    #[arg(long = "ubatch-size", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ubatch_size: Option<u32>,

    /// Require `Authorization: Bearer KEY` on every route but /health. The environment
    /// variable VKDECODE_API_KEY gives it too, without showing it in `ps`.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,

    /// Names the Host header may carry besides loopback names and the bound address,
    /// comma-separated (`*`: any). Other Hosts get 403: a web page reaching the server
    /// through DNS rebinding sends its own name.
    #[arg(long = "allowed-hosts", value_name = "NAMES", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// Web origins (scheme://host[:port]) whose pages may call the server,
    /// comma-separated (`*`: any). Requests with another Origin get 403, and only these
    /// origins get CORS headers.
    #[arg(long = "cors-origin", value_name = "ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Open connections at most (default 512, fewer under a low `ulimit -n`). Past it a
    /// new connection closes the longest-idle one, or gets 503 when all are busy.
    #[arg(long = "max-connections", value_name = "N")]
    pub max_connections: Option<usize>,

    /// Seconds a request head may take to arrive whole (from the connect, or from its
    /// first byte on a kept-alive connection).
    #[arg(long = "header-timeout", value_name = "SECS", default_value_t = 10.0)]
    pub header_timeout: f64,

    /// Seconds a request body may take to arrive whole (408 after), and a client may
    /// stall taking its answer.
    #[arg(long = "body-timeout", value_name = "SECS", default_value_t = 60.0)]
    pub body_timeout: f64,

    /// Seconds a kept-alive connection may wait for its next request.
    #[arg(long = "idle-timeout", value_name = "SECS", default_value_t = 60.0)]
    pub idle_timeout: f64,

    /// Largest request body, e.g. 4MiB (413 above).
    #[arg(long = "max-body", value_name = "SIZE", value_parser = parse_size, default_value = "4MiB")]
    pub max_body: u64,

    /// Requests that may wait for a free slot; beyond, 503 with Retry-After.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,

    /// The model's name in /v1/models (default: the file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,

    /// Seconds in-flight requests may run after SIGTERM before they are cancelled. The
    /// default (1 s) keeps the promise that a signalled server is gone within 2 s, as
    /// `timeout`, service managers and scripts expect; a longer grace gives that up.
    #[arg(long = "shutdown-grace", default_value_t = 1.0)]
    pub shutdown_grace: f64,

    /// The seed of requests that give none (default: from the clock per request), as
    /// llama-server's --seed.
    #[arg(long)]
    pub seed: Option<u64>,

    /// The max_tokens of requests that give none (-1: until the end or a full context),
    /// as llama-server's -n.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,

    /// A chat template (Jinja, as in tokenizer.chat_template) to use instead of the
    /// model's own.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,

    /// Vulkan device index (see `vkdecode info`).
    #[arg(long)]
    pub device: Option<usize>,

    /// How the weights reach the GPU: auto, import (file pages, shared by every slot) or
    /// copy (one copy per slot).
    #[arg(long, value_enum, default_value_t = crate::run::WeightsArg::Auto)]
    pub weights: crate::run::WeightsArg,

    #[command(flatten)]
    pub kernels: crate::kernels_arg::KernelsArg,
}

pub fn run(args: Args) -> Result<()> {
    let n_predict = checked_n_predict(&args)?;
    let api_key = api_key(args.api_key.as_deref())?;
    if api_key.is_none() && !is_loopback(&args.host) {
        errln!(
            "WARNING: serving on {} without an API key: anyone who can reach this address can use the model. Set VKDECODE_API_KEY (or --api-key KEY) to require one.",
            args.host
        );
    }
    let limits = conn_limits(&args)?;
    let max_body = usize::try_from(args.max_body).context("--max-body is too large")?;
    let path = &args.model;
    let file = Arc::new(
        gguf::GgufFile::open(path).with_context(|| format!("opening model {}", path.display()))?,
    );
    // a SIGBUS in the mapping (the file shrank under the server) names the file, exit 74
    residency::sigbus::install(&file).context("installing the SIGBUS handler")?;
    let template = chat_template(&args, &file)?;
    let names = ModelNames::of(path, args.alias.as_deref());

    let metrics = Arc::new(server::Metrics::default());
    // before every engine step: stop with an error if the model file was rewritten in
    // place (as the main command checks between chunks and tokens)
    let stamp =
        residency::FileStamp::take(path).with_context(|| format!("reading {}", path.display()))?;
    let guard: server::scheduler::Guard =
        Box::new(move || stamp.check().map_err(|e| e.to_string()));
    let build_file = file.clone();
    let slots_opts = slots_options(&args);
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
        errln!("{note}");
    }
    announce(&names.id, &info, args.parallel);
    let opts = server::ServerOptions {
        model_id: names.id,
        model_aliases: names.aliases,
        api_key,
        max_body,
        queue: args.queue,
        ctx_len: info.ctx_per_slot,
        n_slots: args.parallel,
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
        access: access(&args),
        limits,
        seed: args.seed,
        n_predict,
        model_path: path.display().to_string(),
    };
    let state = Arc::new(server::AppState::new(
        opts, scheduler, tok, template, metrics,
    ));
    listen(&args, state)?;
    // every handle on the queue is gone: the engine thread ends once its jobs have
    engine_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    errln!("vkdecode serve: stopped");
    Ok(())
}

/// The connection limits of `--max-connections` and the three timeouts.
fn conn_limits(args: &Args) -> Result<server::ConnLimits> {
    Ok(server::ConnLimits {
        max_connections: max_connections(args.max_connections)?,
        header_timeout: seconds("--header-timeout", args.header_timeout)?,
        body_timeout: seconds("--body-timeout", args.body_timeout)?,
        idle_timeout: seconds("--idle-timeout", args.idle_timeout)?,
    })
}

/// The line that says what was loaded, on what, and how the KV cache is split.
fn announce(id: &str, info: &server::SlotsInfo, parallel: usize) {
    errln!(
        "vkdecode serve: {} on {} | kernels {} | weights {} | {} slot(s) x {} tokens, KV cache {:.1} MiB per slot ({:.1} MiB in all) | load {:.0} ms",
        id,
        info.device,
        info.kernels,
        info.weights_path,
        parallel,
        info.ctx_per_slot,
        info.kv_bytes_per_slot as f64 / (1 << 20) as f64,
        (info.kv_bytes_per_slot * parallel as u64) as f64 / (1 << 20) as f64,
        info.load_ms,
    );
}

/// `-n` as the server's default token limit (`None`: no limit), after the checks of
/// the flags that need no model.
fn checked_n_predict(args: &Args) -> Result<Option<usize>> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if args.queue == 0 {
        bail!("--queue must be at least 1");
    }
    if args.ctx_size == Some(1) {
        bail!("--ctx-size 1 is too small: a slot needs at least 2 positions (a prompt token and a generated one); use -c 2 or more, or -c 0 for the model's own context");
    }
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        bail!("--shutdown-grace must be 0 or more seconds");
    }
    match args.n_predict {
        -1 => Ok(None),
        n if n >= 1 => Ok(Some(n as usize)),
        n => bail!("-n/--n-predict must be -1 (no limit) or at least 1 (got {n})"),
    }
}

/// Which hosts and origins may reach the server: `--allowed-host` and the bound host;
/// `--cors-origin`.
fn access(args: &Args) -> server::Access {
    let mut allowed_hosts: Vec<String> = (args.allowed_hosts.iter())
        .filter(|h| !h.trim().is_empty())
        .map(|h| server::guard::normal_host(h))
        .collect();
    allowed_hosts.push(server::guard::normal_host(&args.host));
    server::Access {
        allowed_hosts,
        cors_origins: (args.cors_origins.iter())
            .filter(|o| !o.trim().is_empty())
            .map(|o| server::guard::normal_origin(o))
            .collect(),
    }
}

/// `--chat-template-file`, else the model's own template (none: chat completions are
/// refused, said once here).
fn chat_template(args: &Args, file: &gguf::GgufFile) -> Result<Option<tokenizer::ChatTemplate>> {
    let template = match &args.chat_template_file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("--chat-template-file: cannot read {}", f.display()))?;
            Some(
                tokenizer::ChatTemplate::new(text)
                    .with_context(|| format!("--chat-template-file {}", f.display()))?,
            )
        }
        None => tokenizer::ChatTemplate::from_gguf(file.gguf())
            .context("reading the model's chat template")?,
    };
    if template.is_none() {
        errln!("note: the model has no chat template: /v1/chat/completions answers 400, use /v1/completions");
    }
    Ok(template)
}

/// The names requests may give the model: its id (`--alias`, else the file's stem) and
/// the aliases also accepted (file name, stem, path).
struct ModelNames {
    id: String,
    aliases: Vec<String>,
}

impl ModelNames {
    fn of(path: &std::path::Path, alias: Option<&str>) -> ModelNames {
        let file_name = (path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = (file_name.strip_suffix(".gguf"))
            .unwrap_or(&file_name)
            .to_string();
        ModelNames {
            id: alias.map_or_else(|| stem.clone(), str::to_string),
            aliases: vec![file_name, stem, path.display().to_string()],
        }
    }
}

/// The engine's slots as the flags ask.
fn slots_options(args: &Args) -> server::SlotsOptions {
    server::SlotsOptions {
        slots: args.parallel,
        ctx: crate::run::ctx_request(args.ctx_size),
        device: args.device,
        session: engine::SessionOptions {
            weights: engine::ResidencyOptions {
                mode: args.weights.into(),
                ..Default::default()
            },
            kernels: args.kernels.profile,
            prefill_chunk: args.ubatch_size.map(|n| n as usize),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Binds `--host:--port` and serves until a signal asks the server to stop.
fn listen(args: &Args, state: Arc<server::AppState>) -> Result<()> {
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
        errln!("vkdecode serve: listening on http://{local}");
        server::serve(listener, state, shutdown_signal())
            .await
            .context("serving")
    })
}

/// The API key: `--api-key`, else `VKDECODE_API_KEY`; an empty one is refused (it would
/// read as "no key" and leave the server open).
fn api_key(flag: Option<&str>) -> Result<Option<String>> {
    let (key, from) = match flag {
        Some(k) => (k.to_string(), "--api-key"),
        None => match std::env::var("VKDECODE_API_KEY") {
            Ok(k) => (k, "VKDECODE_API_KEY"),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => bail!("VKDECODE_API_KEY is not valid UTF-8"),
        },
    };
    if key.trim().is_empty() {
        bail!("{from} is empty: give a key (or leave {from} out to serve without one)");
    }
    Ok(Some(key))
}

/// Whether `--host` is reachable from this machine only.
fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A timeout flag's value.
fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v < 1e9) {
        bail!("{flag} must be a positive number of seconds (got {v})");
    }
    Ok(Duration::from_secs_f64(v))
}

/// Descriptors the server needs besides its connections (the model, the driver, the
/// listener, refusals in flight).
const FD_RESERVE: u64 = 128;

/// `--max-connections`, or 512 (fewer when the descriptor limit leaves less room); a
/// value the limit cannot hold is refused, as it would stop the accepting.
fn max_connections(flag: Option<usize>) -> Result<usize> {
    let limit = open_files_limit();
    match flag {
        Some(0) => bail!("--max-connections must be at least 1"),
        Some(n) => {
            if let Some(l) = limit.filter(|&l| n as u64 + FD_RESERVE > l) {
                bail!(
                    "--max-connections {n} needs about {} open files but the limit is {l}: lower --max-connections or raise the limit (ulimit -n)",
                    n as u64 + FD_RESERVE
                );
            }
            Ok(n)
        }
        None => {
            let room = limit.map_or(512, |l| l.saturating_sub(FD_RESERVE));
            Ok(room.clamp(16, 512) as usize)
        }
    }
}

/// This process's soft limit on open files (`None` where /proc does not say).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                errln!("warning: cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    errln!("vkdecode serve: shutting down");
}
