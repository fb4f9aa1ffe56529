//! The main command: `vkdecode -m model.gguf -p "prompt"`.
//!
//! Loads the model (weights imported from the page cache, or copied, see `--weights`),
//! prefills the prompt in one batch, then decodes token by token, streaming text to
//! stdout. Stats go to stderr and, with `--stats-json`, to a file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use serde_json::json;

use crate::stats::{parse_size, MemoryReport};

/// Which implementation computes the forward pass.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Vulkan compute (the engine).
    Vulkan,
    /// The plain f32 CPU reference (slow; for checking).
    Reference,
}

/// How the weights reach the GPU.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsArg {
    /// Import where the device reads host memory at full speed, copy on discrete GPUs.
    Auto,
    /// Import the mapped file pages (fails, saying why, when the driver refuses).
    Import,
    /// Copy into device-local memory through a staging buffer (the baseline).
    Copy,
}

impl From<WeightsArg> for engine::WeightsMode {
    fn from(w: WeightsArg) -> Self {
        match w {
            WeightsArg::Auto => engine::WeightsMode::Auto,
            WeightsArg::Import => engine::WeightsMode::Import,
            WeightsArg::Copy => engine::WeightsMode::Copy,
        }
    }
}

/// Arguments of the main command (generation).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Path to the GGUF model file.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: Option<PathBuf>,

    /// The prompt to complete (or, with --chat, the user's message).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,

    /// Number of tokens to generate; -1 runs until end-of-generation or the context is full.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,

    /// Context size in tokens (prompt plus generated); 0 uses the model's trained context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 2048)]
    pub ctx_size: usize,

    /// Sampling temperature; 0 is greedy (argmax computed on the GPU, 4 bytes read back per
    /// token). Default: 0.8 as llama.cpp on the Vulkan backend, 0 on the reference backend.
    #[arg(long)]
    pub temp: Option<f32>,

    /// Keep only the K most likely tokens (0 disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,

    /// Keep the smallest set of tokens whose probability sums to P (1.0 disables).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,

    /// Drop tokens less likely than P times the most likely one (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,

    /// Penalise tokens seen in the last --repeat-last-n tokens (1.0 disables).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,

    /// How many recent tokens the repetition penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,

    /// Random seed for sampling (default: taken from the clock, and reported in the stats).
    #[arg(long)]
    pub seed: Option<u64>,

    /// How the weights reach the GPU: auto, import (file pages, no copy) or copy (baseline).
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,

    /// Largest single import allocation, e.g. 256MiB (default: the driver's limits).
    #[arg(long = "import-cap", value_name = "SIZE", value_parser = parse_size)]
    pub import_cap: Option<u64>,

    /// Pin the mapped model pages in RAM (mlock). Off by default: it takes away the
    /// kernel's freedom to reclaim clean file pages under memory pressure.
    #[arg(long)]
    pub mlock: bool,

    /// Vulkan device index (see `vkdecode info`); default: integrated, then discrete, then CPU.
    #[arg(long)]
    pub device: Option<usize>,

    /// Which implementation runs the model.
    #[arg(long, value_enum, default_value_t = Backend::Vulkan)]
    pub backend: Backend,

    /// Apply the model's chat template (tokenizer.chat_template) to the prompt.
    #[arg(long)]
    pub chat: bool,

    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,

    /// Print the detailed memory split and counters on stderr after generation.
    #[arg(long)]
    pub stats: bool,

    /// Write every figure of the run as one JSON object to FILE.
    #[arg(long = "stats-json", value_name = "FILE")]
    pub stats_json: Option<PathBuf>,

    /// Run the CPU reference beside the GPU and report the largest logit difference per step.
    #[arg(long)]
    pub check: bool,

    /// Per-kernel GPU time of one decode token, from timestamp queries.
    #[arg(long)]
    pub profile: bool,

    /// Ablation: wait on the host after every layer (shows what in-stream ordering is worth).
    #[arg(long = "sync-each-layer")]
    pub sync_each_layer: bool,

    /// Ablation: decode matvecs with one row per lane instead of lanes sharing each row
    /// (the fallback where the device lacks subgroup arithmetic).
    #[arg(long = "no-column-split")]
    pub no_column_split: bool,

    /// Keep generating past end-of-generation tokens (for benchmarks with a fixed -n).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,

    /// The prompt as token ids, comma-separated, in place of -p (for benchmarks).
    #[arg(long = "prompt-ids", hide = true, conflicts_with_all = ["prompt", "chat"])]
    pub prompt_ids: Option<String>,

    /// Print no generated text (for benchmarks).
    #[arg(long, hide = true)]
    pub no_display: bool,

    /// For `vkdecode bench --procs N`: before reading its memory figures, the process waits
    /// in DIR until N processes have arrived, and exits only once all N have read theirs.
    #[arg(long = "bench-barrier", hide = true, value_name = "DIR:N")]
    pub bench_barrier: Option<String>,
}

/// Set by the Ctrl-C handler; the generation loop stops at the next token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Figures of one generation, in the order they happen.
#[derive(Default)]
struct Timings {
    /// Everything before the first prompt token: Vulkan start, weights, pipelines
    /// (compiled and warmed), activation buffers.
    load_ms: f64,
    /// The part of `load_ms` that puts the weights on the device (import or copy): what
    /// `--weights` changes.
    weights_load_ms: f64,
    prefill_ms: f64,
    ttft_ms: f64,
    decode_ms: f64,
}

pub fn run(args: Args) -> Result<()> {
    let Some(model_path) = args.model.clone() else {
        bail!("no model given: use -m FILE.gguf (see `vkdecode --help`; `models/fetch` gets the default model)");
    };
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => String::new(),
        (None, None) => bail!("no prompt given: use -p \"text\""),
    };
    if prompt.is_empty() && args.prompt_ids.is_none() {
        bail!("the prompt is empty: give some text with -p");
    }
    if args.n_predict == 0 || args.n_predict < -1 {
        bail!("-n must be positive, or -1 for \"until end of generation\"");
    }
    ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;

    let file = Arc::new(
        gguf::GgufFile::open(&model_path)
            .with_context(|| format!("opening model {}", model_path.display()))?,
    );
    engine::residency::sigbus::install(&file).context("installing the SIGBUS handler")?;
    let tok = tokenizer::Tokenizer::from_gguf(file.gguf()).context("building the tokenizer")?;
    let text = if args.chat {
        let template = tokenizer::ChatTemplate::from_gguf(file.gguf())?
            .context("--chat: the model has no tokenizer.chat_template")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(tokenizer::Message {
                role: "system".into(),
                content: system.clone(),
            });
        }
        messages.push(tokenizer::Message {
            role: "user".into(),
            content: prompt.clone(),
        });
        let bos = tok
            .bos()
            .and_then(|b| tok.piece(b))
            .unwrap_or("")
            .to_string();
        let eos = tok
            .eos()
            .and_then(|e| tok.piece(e))
            .unwrap_or("")
            .to_string();
        template.render(&messages, true, &bos, &eos)?
    } else {
        prompt.clone()
    };
    let prompt_ids = match &args.prompt_ids {
        Some(list) => parse_ids(list, tok.vocab_size())?,
        None => tok.encode(&text, true, args.chat)?,
    };
    if prompt_ids.is_empty() {
        bail!("the prompt tokenized to nothing");
    }

    let cfg = reference::Config::from_gguf(file.gguf())
        .context("reading the model's hyper-parameters")?;
    let ctx_len = if args.ctx_size == 0 {
        cfg.context_length
    } else {
        args.ctx_size.min(cfg.context_length.max(1))
    };
    if prompt_ids.len() >= ctx_len {
        bail!(
            "the prompt is {} tokens but the context holds {ctx_len}: raise -c (the model was trained on {}) or shorten the prompt",
            prompt_ids.len(),
            cfg.context_length
        );
    }

    let temp = args.temp.unwrap_or(if args.backend == Backend::Reference {
        0.0
    } else {
        0.8
    });
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let mut sampler = engine::Sampler::new(engine::SamplerOptions {
        temperature: temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
    });

    let mut forward = Forward::load(&args, &file, ctx_len)?;
    let max_new = if args.n_predict < 0 {
        usize::MAX
    } else {
        args.n_predict as usize
    };

    // Generate.
    let mut t = Timings {
        load_ms: forward.load_ms,
        weights_load_ms: forward.weights_load_ms,
        ..Default::default()
    };
    let mut out = std::io::stdout().lock();
    let mut stream = tokenizer::StreamDecoder::new();
    let mut generated: Vec<u32> = Vec::new();
    let mut stop_reason = "n_predict";
    let mut max_check_diff = 0f32;

    let start = Instant::now();
    for &id in &prompt_ids {
        sampler.accept(id);
    }
    let mut next = forward.prefill(&prompt_ids, &mut sampler)?;
    t.prefill_ms = ms(start);
    t.ttft_ms = t.prefill_ms;
    let decode_start = Instant::now();
    loop {
        if let Some(d) = forward.last_check_diff.take() {
            max_check_diff = max_check_diff.max(d);
            eprintln!(
                "check: step {} max |gpu - reference| logit = {d:.5}",
                generated.len()
            );
        }
        if tok.is_eog(next) && !args.ignore_eos {
            stop_reason = "eog";
            break;
        }
        generated.push(next);
        sampler.accept(next);
        if !args.no_display {
            write!(out, "{}", stream.push(&tok, next))?;
            out.flush()?;
        }
        if generated.len() >= max_new {
            break;
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            stop_reason = "interrupted";
            break;
        }
        let pos = prompt_ids.len() + generated.len();
        if pos >= ctx_len {
            stop_reason = "context_full";
            break;
        }
        next = forward.step(next, pos - 1, &mut sampler)?;
    }
    t.decode_ms = ms(decode_start);
    if !args.no_display {
        writeln!(out, "{}", stream.finish())?;
    }
    drop(out);
    match stop_reason {
        "context_full" => {
            eprintln!("\n[stopped: the context of {ctx_len} tokens is full; raise -c]")
        }
        "interrupted" => eprintln!("\n[interrupted]"),
        _ => {}
    }

    // Stats.
    let n_decoded = generated.len().saturating_sub(1);
    let prefill_tok_s = prompt_ids.len() as f64 / (t.prefill_ms / 1e3).max(1e-9);
    let decode_tok_s = if n_decoded > 0 {
        n_decoded as f64 / (t.decode_ms / 1e3).max(1e-9)
    } else {
        0.0
    };
    let barrier = args
        .bench_barrier
        .as_deref()
        .map(Barrier::parse)
        .transpose()?;
    if let Some(b) = &barrier {
        b.wait("loaded")?;
    }
    let mem = MemoryReport::read(file.bytes())?;
    if let Some(b) = &barrier {
        b.wait("measured")?;
    }
    let mut stats = json!({
        "backend": match args.backend { Backend::Vulkan => "vulkan", Backend::Reference => "reference" },
        "model": model_path.display().to_string(),
        "model_bytes": file.bytes().len(),
        "device": forward.device.clone(),
        "driver": forward.driver.clone(),
        "weights_mode": forward.weights_mode.clone(),
        "weights_path": forward.weights_path.clone(),
        "device_bytes": forward.device_bytes,
        "load_ms": t.load_ms,
        "weights_load_ms": t.weights_load_ms,
        "ttft_ms": t.ttft_ms,
        "prefill_ms": t.prefill_ms,
        "decode_ms": t.decode_ms,
        "prefill_tok_s": prefill_tok_s,
        "decode_tok_s": decode_tok_s,
        "n_prompt": prompt_ids.len(),
        "n_generated": generated.len(),
        "stop_reason": stop_reason,
        "ctx_len": ctx_len,
        "temp": temp,
        "seed": seed,
        "prompt_ids": prompt_ids,
        "generated_ids": generated,
        "text": tok.decode(&generated),
    });
    mem.add_to(&mut stats);
    if let Some(c) = &forward.counters() {
        stats["host_waits"] = json!(c.host_waits);
        stats["bytes_read_back"] = json!(c.bytes_read_back);
    }
    if args.check {
        stats["check_max_logit_diff"] = json!(max_check_diff);
    }
    eprintln!();
    eprintln!(
        "device: {} | weights: {} -> {} | load {:.0} ms (weights {:.1} ms) | ttft {:.0} ms",
        forward.device,
        forward.weights_mode,
        forward.weights_path,
        t.load_ms,
        t.weights_load_ms,
        t.ttft_ms
    );
    eprintln!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s",
        prompt_ids.len(),
        prefill_tok_s,
        n_decoded,
        decode_tok_s
    );
    eprintln!("{}", mem.summary());
    if args.stats {
        eprintln!("{}", serde_json::to_string_pretty(&stats)?);
    }
    if args.profile {
        forward.print_profile();
    }
    if let Some(path) = &args.stats_json {
        std::fs::write(path, serde_json::to_string_pretty(&stats)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The forward pass of either backend, with the sampler applied on top.
struct Forward {
    backend: ForwardImpl,
    /// With `--check`: the reference decoder run beside the GPU.
    check: Option<(reference::Model, reference::State)>,
    last_check_diff: Option<f32>,
    /// The whole backend start.
    load_ms: f64,
    /// Weights onto the device (the reference: reading and widening them to f32).
    weights_load_ms: f64,
    device: String,
    /// The driver's name and version, as it reports them.
    driver: String,
    weights_mode: String,
    weights_path: String,
    device_bytes: u64,
}

enum ForwardImpl {
    Vulkan(Box<engine::Session>),
    Reference(Box<(reference::Model, reference::State)>),
}

impl Forward {
    fn load(args: &Args, file: &Arc<gguf::GgufFile>, ctx_len: usize) -> Result<Forward> {
        let start = Instant::now();
        let load_reference = || -> Result<(reference::Model, reference::State)> {
            let model = reference::Model::load(file).context("loading the reference model")?;
            let state = reference::State::try_new(model.config(), ctx_len)?;
            Ok((model, state))
        };
        let mut f = match args.backend {
            Backend::Reference => Forward {
                backend: ForwardImpl::Reference(Box::new(load_reference()?)),
                check: None,
                last_check_diff: None,
                load_ms: 0.0,
                device: "cpu (reference)".into(),
                driver: "reference".into(),
                weights_mode: "none".into(),
                weights_path: "f32 in RAM".into(),
                device_bytes: 0,
                weights_load_ms: 0.0,
            },
            Backend::Vulkan => {
                let ctx = vk::Context::new(&vk::ContextOptions {
                    device_index: args.device,
                    ..Default::default()
                })
                .context("starting Vulkan (see `vkdecode info`)")?;
                let opts = engine::SessionOptions {
                    weights: engine::ResidencyOptions {
                        mode: args.weights.into(),
                        import_cap: args.import_cap,
                        mlock: args.mlock,
                    },
                    ctx_len,
                    sync_each_layer: args.sync_each_layer,
                    profile: args.profile,
                    column_split: !args.no_column_split,
                };
                let session = engine::Session::new(ctx.clone(), file.clone(), &opts)?;
                let report = session.weights().report().clone();
                Forward {
                    device: ctx.caps().name.clone(),
                    driver: format!("{} {}", ctx.caps().driver_name, ctx.caps().driver_info),
                    weights_mode: format!("{:?}", args.weights).to_lowercase(),
                    weights_path: report.path,
                    device_bytes: report.device_bytes,
                    backend: ForwardImpl::Vulkan(Box::new(session)),
                    check: None,
                    last_check_diff: None,
                    load_ms: 0.0,
                    weights_load_ms: report.load_ms,
                }
            }
        };
        f.load_ms = ms(start);
        if args.backend == Backend::Reference {
            f.weights_load_ms = f.load_ms;
        }
        if args.check {
            f.check = Some(load_reference()?);
        }
        Ok(f)
    }

    fn counters(&self) -> Option<engine::Counters> {
        match &self.backend {
            ForwardImpl::Vulkan(s) => Some(s.counters()),
            ForwardImpl::Reference(_) => None,
        }
    }

    /// Runs the prompt and returns the first generated token.
    fn prefill(&mut self, ids: &[u32], sampler: &mut engine::Sampler) -> Result<u32> {
        let greedy = sampler.is_greedy() && self.check.is_none();
        if let Some((model, state)) = &mut self.check {
            for (pos, &id) in ids[..ids.len() - 1].iter().enumerate() {
                reference::forward(model, state, id, pos, &mut |_, _| {})?;
            }
        }
        let next = match &mut self.backend {
            ForwardImpl::Vulkan(s) => {
                s.prefill(ids)?;
                if greedy {
                    s.last_argmax()?
                } else {
                    let logits = s.last_logits()?;
                    let last = ids.len() - 1;
                    self.last_check_diff = compare(&mut self.check, logits, ids[last], last)?;
                    sampler.sample(logits)?
                }
            }
            ForwardImpl::Reference(ms) => {
                let (model, state) = &mut **ms;
                let mut logits = &[][..];
                for (pos, &id) in ids.iter().enumerate() {
                    logits = reference::forward(model, state, id, pos, &mut |_, _| {})?;
                }
                sampler.sample(logits)?
            }
        };
        Ok(next)
    }

    /// Feeds `token` at position `pos` and returns the next token.
    fn step(&mut self, token: u32, pos: usize, sampler: &mut engine::Sampler) -> Result<u32> {
        let greedy = sampler.is_greedy() && self.check.is_none();
        match &mut self.backend {
            ForwardImpl::Vulkan(s) => {
                if greedy {
                    Ok(s.decode_argmax(token)?)
                } else {
                    let logits = s.decode_logits(token)?;
                    self.last_check_diff = compare(&mut self.check, logits, token, pos)?;
                    Ok(sampler.sample(logits)?)
                }
            }
            ForwardImpl::Reference(ms) => {
                let (model, state) = &mut **ms;
                let logits = reference::forward(model, state, token, pos, &mut |_, _| {})?;
                Ok(sampler.sample(logits)?)
            }
        }
    }

    fn print_profile(&self) {
        let ForwardImpl::Vulkan(s) = &self.backend else {
            eprintln!("--profile needs the Vulkan backend");
            return;
        };
        match s.profile_last_token() {
            Some(rows) => crate::stats::print_profile(&rows),
            None => eprintln!("no profile recorded (the device has no timestamp support?)"),
        }
    }
}

/// With `--check`, runs the reference on the same token and returns the largest logit
/// difference from the GPU's logits.
fn compare(
    check: &mut Option<(reference::Model, reference::State)>,
    gpu: &[f32],
    token: u32,
    pos: usize,
) -> Result<Option<f32>> {
    let Some((model, state)) = check else {
        return Ok(None);
    };
    let cpu = reference::forward(model, state, token, pos, &mut |_, _| {})?;
    Ok(Some(
        gpu.iter()
            .zip(cpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max),
    ))
}

/// A rendezvous of `n` processes through files in a directory (see `--bench-barrier`).
struct Barrier {
    dir: PathBuf,
    n: usize,
}

impl Barrier {
    fn parse(s: &str) -> Result<Barrier> {
        let (dir, n) = s.rsplit_once(':').context("--bench-barrier takes DIR:N")?;
        Ok(Barrier {
            dir: PathBuf::from(dir),
            n: n.parse().context("--bench-barrier: N is not a number")?,
        })
    }

    /// Marks this process as arrived at `stage` and waits (at most 10 minutes) for the rest.
    fn wait(&self, stage: &str) -> Result<()> {
        let mark = self.dir.join(format!("{stage}.{}", std::process::id()));
        std::fs::write(&mark, b"").with_context(|| format!("writing {}", mark.display()))?;
        let deadline = Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let arrived = std::fs::read_dir(&self.dir)?
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{stage}."))
                })
                .count();
            if arrived >= self.n {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "bench barrier {stage}: only {arrived} of {} processes arrived",
                    self.n
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn parse_ids(list: &str, vocab: usize) -> Result<Vec<u32>> {
    list.split(',')
        .map(|t| {
            let id: u32 = t
                .trim()
                .parse()
                .with_context(|| format!("--prompt-ids: {t:?} is not a token id"))?;
            if id as usize >= vocab {
                bail!("--prompt-ids: {id} is outside the vocabulary of {vocab}");
            }
            Ok(id)
        })
        .collect()
}
