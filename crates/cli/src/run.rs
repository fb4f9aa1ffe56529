//! The main command: `vkdecode -m model.gguf -p "prompt"`.
//!
//! Loads the model (weights imported from the page cache, or copied, see `--weights`),
//! prefills the prompt in one batch, then decodes token by token, streaming text to
//! stdout. Stats go to stderr and, with `--stats-json`, to a file.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use engine::generate::CtxRequest;
use serde_json::json;

use crate::sampling_args::SamplingArgs;
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

    /// Context size in tokens (prompt plus generated); default 2048 (or the model's
    /// context if smaller). 0: the model's trained context, capped to what fits in memory
    /// (said on stderr). Above the trained context is refused; a context whose KV cache
    /// does not fit is refused up front, naming the bytes it needs.
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,

    /// Most prompt tokens one prefill submission takes (llama.cpp's `-ub`); default: the
    /// device's (64 on lavapipe). The activation buffers are sized for this many tokens.
    #[arg(long = "ubatch-size", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ubatch_size: Option<u32>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

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

    /// Parse special-token text in the prompt and system message (`<|im_start|>` becomes
    /// the control token). Off by default: user text is tokenized as plain text, and with
    /// --chat only the template's own markup becomes control tokens. Same as `tokenize
    /// --special`.
    #[arg(long)]
    pub special: bool,

    /// Stop when the generated text contains STR (the text before it is kept); repeatable.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,

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

    #[command(flatten)]
    pub kernels: crate::kernels_arg::KernelsArg,

    /// Never end generation: the end-of-generation tokens are banned (as llama.cpp does),
    /// so the best other token is taken where the model would end (for benchmarks with a
    /// fixed -n). Greedy decoding keeps the GPU's argmax and reads the logits only at the
    /// steps where it picks a banned token.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,

    /// The prompt as token ids, comma-separated, or @FILE holding them, in place of -p
    /// (for benchmarks).
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

/// Exit status after an interrupt (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: i32 = 130;

/// The model path of a run whose weights may be the file's own pages (the Vulkan backend
/// with `--weights auto` or `import`), which `main` runs in a supervised worker.
pub fn file_backed_model(args: &Args) -> Option<PathBuf> {
    let file_pages = args.backend == Backend::Vulkan && args.weights != WeightsArg::Copy;
    args.model.clone().filter(|_| file_pages)
}

pub fn run(args: Args) -> Result<()> {
    let Some(model_path) = args.model.clone() else {
        bail!("no model given: use -m FILE.gguf (see `vkdecode --help`; `models/fetch` gets the default model)");
    };
    let prompt = checked_prompt(&args)?;
    crate::sampling_args::validate(&args.sampling)?;
    // A grammar or schema that does not compile is reported before the model loads.
    let grammar = crate::sampling_args::grammar(&args.sampling)?;
    // Open the stats file first: a bad path is reported before the generation, not after.
    let stats_file = match &args.stats_json {
        Some(path) => Some(
            crate::out_path::create(path)
                .with_context(|| format!("--stats-json: cannot write {}", path.display()))?,
        ),
        None => None,
    };
    let cancel = cancel_on_ctrl_c()?;

    let file = Arc::new(
        gguf::GgufFile::open(&model_path)
            .with_context(|| format!("opening model {}", model_path.display()))?,
    );
    // A SIGBUS in the mapping (the file shrank under us) prints one line and exits 74.
    residency::sigbus::install(&file).context("installing the SIGBUS handler")?;
    let stamp = residency::FileStamp::take(&model_path)
        .with_context(|| format!("reading {}", model_path.display()))?;
    let tok =
        Arc::new(tokenizer::Tokenizer::from_gguf(file.gguf()).context("building the tokenizer")?);
    let prompt_ids = prompt_ids(&args, &file, &tok, &prompt)?;

    let (forward, info) = load_backend(&args, &file)?;
    if let Some(note) = &info.ctx_note {
        errln!("{note}");
    }
    if prompt_ids.len() >= info.ctx_len {
        bail!(
            "the prompt is {} tokens but the context holds {}: raise -c (the model was trained on {}) or shorten the prompt",
            prompt_ids.len(),
            info.ctx_len,
            file_context_length(&file)
        );
    }
    let mut generator = engine::Generator::new(forward, tok.clone());
    // Between chunks and tokens: stop with an error if the model file was rewritten in
    // place (a rename leaves the mapped pages intact and is not flagged).
    generator.set_guard(Box::new(move || stamp.check().map_err(Into::into)));
    let opts = generate_options(&args, grammar, &tok, &cancel);
    let gen = stream(&args, &mut generator, &prompt_ids, &opts)?;
    match gen.stop {
        engine::StopReason::ContextFull => errln!(
            "\n[stopped: the context of {} tokens is full; raise -c]",
            info.ctx_len
        ),
        engine::StopReason::Cancelled => errln!("\n[interrupted]"),
        _ => {}
    }

    let run = Finished {
        args: &args,
        model_path: &model_path,
        file: &file,
        info: &info,
        generator: &generator,
        gen: &gen,
        opts: &opts,
    };
    run.report(stats_file)?;
    if gen.stop == engine::StopReason::Cancelled {
        std::process::exit(EXIT_INTERRUPTED);
    }
    Ok(())
}

/// `-c`: absent, 2048 positions (or the model's context if smaller); 0, the model's
/// trained context (capped to what fits); else exactly that many.
pub fn ctx_request(ctx_size: Option<usize>) -> CtxRequest {
    match ctx_size {
        None => CtxRequest::Default(2048),
        Some(0) => CtxRequest::Model,
        Some(n) => CtxRequest::Exact(n),
    }
}

/// The prompt text of `-p` (empty with `--prompt-ids`), after the checks that need no
/// model: a prompt given and not empty, `-n` in range.
fn checked_prompt(args: &Args) -> Result<String> {
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
    Ok(prompt)
}

/// A flag Ctrl-C sets; the generator stops at the next prefill chunk or token. A second
/// Ctrl-C exits at once.
fn cancel_on_ctrl_c() -> Result<Arc<AtomicBool>> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(EXIT_INTERRUPTED);
        }
    })
    .context("installing the Ctrl-C handler")?;
    Ok(cancel)
}

/// The prompt's token ids: `--prompt-ids` as given, `--chat` through the model's chat
/// template, else the text tokenized.
fn prompt_ids(
    args: &Args,
    file: &gguf::GgufFile,
    tok: &tokenizer::Tokenizer,
    prompt: &str,
) -> Result<Vec<u32>> {
    let ids = match &args.prompt_ids {
        Some(list) => parse_ids(list, tok.vocab_size())?,
        None if args.chat => {
            let template = tokenizer::ChatTemplate::from_gguf(file.gguf())?
                .context("--chat: the model has no tokenizer.chat_template")?;
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(tokenizer::Message::new("system", system.clone()));
            }
            messages.push(tokenizer::Message::new("user", prompt.to_string()));
            engine::generate::chat_prompt_ids(tok, &template, &messages, args.special)?
        }
        None => tok.encode(prompt, true, args.special)?,
    };
    if ids.is_empty() {
        bail!("the prompt tokenized to nothing");
    }
    Ok(ids)
}

/// The forward pass `--backend` and `--check` ask for, loaded with the options of the
/// command line.
fn load_backend(
    args: &Args,
    file: &Arc<gguf::GgufFile>,
) -> Result<(
    Box<dyn engine::generate::Forward>,
    engine::generate::BackendInfo,
)> {
    let load_opts = engine::generate::LoadOptions {
        device: args.device,
        session: engine::SessionOptions {
            weights: engine::ResidencyOptions {
                mode: args.weights.into(),
                // the cap is about imports: a copy does not use it
                import_cap: args.import_cap.filter(|_| args.weights != WeightsArg::Copy),
                mlock: args.mlock,
            },
            ctx_len: 0,
            slots: 1,
            sync_each_layer: args.sync_each_layer,
            profile: args.profile,
            column_split: !args.no_column_split,
            kernels: args.kernels.profile,
            prefill_chunk: args.ubatch_size.map(|n| n as usize),
        },
        ctx: ctx_request(args.ctx_size),
        budget_cap: None,
    };
    Ok(match (args.backend, args.check) {
        (Backend::Reference, _) => cpu_backend::load_reference(file, load_opts.ctx)?,
        (Backend::Vulkan, true) => cpu_backend::load_checked(file, &load_opts)?,
        (Backend::Vulkan, false) => {
            let loaded = engine::generate::load(file, &load_opts)?;
            (
                Box::new(loaded.session) as Box<dyn engine::generate::Forward>,
                loaded.info,
            )
        }
    })
}

/// What to generate and how to sample: the defaults llama.cpp's Vulkan backend has
/// (temperature 0.8; 0 on the reference backend), a seed from the clock unless given.
fn generate_options(
    args: &Args,
    grammar: Option<Arc<grammar::CompiledGrammar>>,
    tok: &tokenizer::Tokenizer,
    cancel: &Arc<AtomicBool>,
) -> engine::GenerateOptions {
    let default_temp = if args.backend == Backend::Reference {
        0.0
    } else {
        0.8
    };
    let seed = crate::sampling_args::seed_or_clock(args.sampling.seed);
    let s = &args.sampling;
    engine::GenerateOptions {
        max_tokens: usize::try_from(args.n_predict).ok(),
        ignore_eos: args.ignore_eos,
        stop: args.stop.clone(),
        sampler: engine::SamplerOptions {
            temperature: s.temp.unwrap_or(default_temp),
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            repeat_last_n: s.repeat_last_n,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            logit_bias: s.logit_bias.iter().map(|b| (b.token, b.bias)).collect(),
            logprobs: None,
            seed,
            grammar: grammar
                .map(|g| engine::Constraint::new(g, Arc::new(engine::grammar_vocab(tok)))),
        },
        cancel: Some(cancel.clone()),
    }
}

/// Generates, streaming the text to stdout (unless `--no-display`) and `--check`'s
/// per-step differences to stderr.
fn stream(
    args: &Args,
    generator: &mut engine::Generator,
    prompt_ids: &[u32],
    opts: &engine::GenerateOptions,
) -> Result<engine::Generation> {
    let mut out = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    let gen = generator.generate(prompt_ids, opts, &mut |event| {
        match event {
            engine::Event::Text(t) if !args.no_display => {
                if let Err(e) = out.write_all(t.as_bytes()).and_then(|()| out.flush()) {
                    write_err = Some(e);
                    return ControlFlow::Break(());
                }
            }
            engine::Event::Check { step, diff } => {
                errln!("check: step {step} max |gpu - reference| logit = {diff:.5}")
            }
            _ => {}
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = write_err {
        return Err(anyhow::Error::new(e).context("writing the generated text"));
    }
    if !args.no_display {
        writeln!(out)?;
    }
    Ok(gen)
}

/// A finished run, for its report.
struct Finished<'a> {
    args: &'a Args,
    model_path: &'a std::path::Path,
    file: &'a gguf::GgufFile,
    info: &'a engine::generate::BackendInfo,
    generator: &'a engine::Generator,
    gen: &'a engine::Generation,
    opts: &'a engine::GenerateOptions,
}

impl Finished<'_> {
    /// The figures on stderr (`--stats`: all of them as JSON; `--profile`: per kernel)
    /// and in `--stats-json`'s file. Memory is read after `--bench-barrier`'s `loaded`.
    fn report(&self, stats_file: Option<std::fs::File>) -> Result<()> {
        let barrier = (self.args.bench_barrier.as_deref())
            .map(Barrier::parse)
            .transpose()?;
        if let Some(b) = &barrier {
            b.wait("loaded")?;
        }
        let mem = MemoryReport::read(self.file.bytes())?;
        if let Some(b) = &barrier {
            b.wait("measured")?;
        }
        let stats = self.stats_json(&mem);
        let (info, t) = (self.info, &self.gen.stats);
        errln!();
        errln!(
            "device: {} | kernels: {} | weights: {} -> {} | load {:.0} ms (weights {:.1} ms) | ttft {:.0} ms",
            info.device,
            info.kernels,
            stats["weights_mode"].as_str().unwrap_or(""),
            info.weights_path,
            info.load_ms,
            info.weights_load_ms,
            t.ttft_ms
        );
        errln!(
            "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s",
            t.n_prompt,
            t.prefill_tok_s(),
            t.n_generated.saturating_sub(1),
            t.decode_tok_s()
        );
        errln!("{}", mem.summary());
        if self.args.stats {
            errln!("{}", serde_json::to_string_pretty(&stats)?);
        }
        if self.args.profile {
            self.print_profile();
        }
        if let (Some(mut f), Some(path)) = (stats_file, &self.args.stats_json) {
            f.write_all((serde_json::to_string_pretty(&stats)? + "\n").as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// Every figure of the run, as `--stats` and `--stats-json` write them.
    fn stats_json(&self, mem: &MemoryReport) -> serde_json::Value {
        let (args, info, gen, t) = (self.args, self.info, self.gen, &self.gen.stats);
        let weights_mode = if args.backend == Backend::Reference {
            "none".to_string()
        } else {
            format!("{:?}", args.weights).to_lowercase()
        };
        let mut stats = json!({
            "backend": info.backend,
            "model": self.model_path.display().to_string(),
            "model_bytes": self.file.bytes().len(),
            "device": info.device,
            "driver": info.driver,
            "weights_mode": weights_mode,
            "weights_path": info.weights_path,
            "kernels": info.kernels,
            "kernels_why": info.kernels_why,
            "device_bytes": info.device_bytes,
            "kv_bytes": info.kv_bytes,
            "load_ms": info.load_ms,
            "weights_load_ms": info.weights_load_ms,
            "ttft_ms": t.ttft_ms,
            "prefill_ms": t.prefill_ms,
            "decode_ms": t.decode_ms,
            "prefill_tok_s": t.prefill_tok_s(),
            "decode_tok_s": t.decode_tok_s(),
            "n_prompt": gen.prompt_ids.len(),
            "n_generated": gen.ids.len(),
            "stop_reason": gen.stop.as_str(),
            "ctx_len": info.ctx_len,
            "temp": self.opts.sampler.temperature,
            "seed": self.opts.sampler.seed,
            "prompt_ids": gen.prompt_ids,
            "generated_ids": gen.ids,
            "text": self.generator.tokenizer().decode(&gen.ids),
        });
        mem.add_to(&mut stats);
        if let Some(c) = self.generator.forward().counters() {
            stats["host_waits"] = json!(c.host_waits);
            stats["bytes_read_back"] = json!(c.bytes_read_back);
        }
        if args.check {
            stats["check_max_logit_diff"] = json!(t.max_check_diff.unwrap_or(0.0));
        }
        stats
    }

    /// `--profile`: per-kernel GPU times of the last prefill chunk and of one decode
    /// token.
    fn print_profile(&self) {
        let Some(s) = self.generator.forward().session() else {
            errln!("--profile needs the Vulkan backend");
            return;
        };
        if let Some((n, rows)) = s.profile_last_prefill_chunk() {
            errln!("profile: the last prefill chunk ({n} tokens)");
            crate::stats::print_profile(&rows);
        }
        match s.profile_last_token() {
            Some(rows) => {
                errln!("profile: one decode token");
                crate::stats::print_profile(&rows)
            }
            None => errln!("no profile recorded (the device has no timestamp support?)"),
        }
    }
}

/// The model's trained context, for messages.
fn file_context_length(file: &gguf::GgufFile) -> String {
    arch::Config::from_gguf(file.gguf())
        .map(|c| c.context_length.to_string())
        .unwrap_or_else(|_| "?".into())
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

/// `--prompt-ids`: ids separated by commas, or `@FILE` holding them (long prompts do not
/// fit a command line).
fn parse_ids(list: &str, vocab: usize) -> Result<Vec<u32>> {
    let text;
    let list = match list.strip_prefix('@') {
        Some(path) => {
            text = crate::input::read_text_file(std::path::Path::new(path), "--prompt-ids")?;
            text.as_str()
        }
        None => list,
    };
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
