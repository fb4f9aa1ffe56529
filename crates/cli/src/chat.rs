//! `vkdecode chat -m model.gguf`: an interactive multi-turn chat in the terminal, on the
//! engine's conversation API ([`engine::Slots`], one slot).
//!
//! Every turn renders the whole conversation with the model's chat template and submits
//! it; the slot keeps the K/V of the turns before, so only the new turn is prefilled
//! (`/stats` shows it). Ctrl-C stops the current answer; at the prompt, a second Ctrl-C
//! (or `/quit`, or end of input) exits. When stdin is not a terminal it reads one message
//! per line and prints no prompt.
//!
//! A line that is not UTF-8, or too long for the context ([`max_line_bytes`]), is
//! reported and skipped; the conversation goes on. A long line is dropped as it is read,
//! never held whole.

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use engine::generate::CtxRequest;
use tokenizer::Message;

use crate::input::{read_line, LineRead};
use crate::run::{WeightsArg, EXIT_INTERRUPTED};
use crate::stats::parse_size;

/// Arguments of `vkdecode chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Path to the GGUF model file (it must carry a chat template).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,

    /// Context size in tokens for the whole conversation; 0: the model's trained context,
    /// capped to what fits.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 2048)]
    pub ctx_size: usize,

    /// Most tokens per answer; -1: until end of generation or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,

    /// System message at the start of the conversation (`/system TEXT` changes it).
    #[arg(long)]
    pub system: Option<String>,

    /// Sampling temperature; 0 (or below) is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,

    /// Keep only the K most likely tokens (0 disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,

    /// Keep the smallest set of tokens whose probability sums to P (1 disables).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,

    /// Drop tokens less likely than P times the most likely one (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,

    /// Random seed for sampling (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,

    /// How the weights reach the GPU: auto, import (file pages, no copy) or copy.
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,

    #[command(flatten)]
    pub kernels: crate::kernels_arg::KernelsArg,

    /// Largest single import allocation, e.g. 256MiB (default: the driver's limits).
    #[arg(long = "import-cap", value_name = "SIZE", value_parser = parse_size)]
    pub import_cap: Option<u64>,

    /// Vulkan device index (see `vkdecode info`).
    #[arg(long)]
    pub device: Option<usize>,
}

const HELP: &str = "\
commands:
  /help          this list
  /system TEXT   set the system message and start a new conversation
  /clear         start a new conversation (the system message stays)
  /stats         prompt tokens prefilled vs reused, speeds, KV cache use
  /quit          leave (also: end of input, or Ctrl-C twice at the prompt)
Ctrl-C during an answer stops the answer.";

/// Where the user is, for the Ctrl-C handler.
struct Interrupts {
    /// An answer is being generated: Ctrl-C stops it.
    answering: AtomicBool,
    /// Set by Ctrl-C while answering; the loop cancels the slot.
    cancel: AtomicBool,
    /// Ctrl-Cs at the prompt since the last line read: the second exits.
    at_prompt: AtomicU32,
}

impl Interrupts {
    /// Installs the Ctrl-C handler: while answering it stops the answer; at the prompt
    /// the first one says how to leave and the second exits.
    fn install() -> Result<Arc<Interrupts>> {
        let interrupts = Arc::new(Interrupts {
            answering: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            at_prompt: AtomicU32::new(0),
        });
        let i = interrupts.clone();
        ctrlc::set_handler(move || {
            if i.answering.load(Ordering::SeqCst) {
                i.cancel.store(true, Ordering::SeqCst);
            } else if i.at_prompt.fetch_add(1, Ordering::SeqCst) >= 1 {
                std::process::exit(EXIT_INTERRUPTED);
            } else {
                errprint!("\n(Ctrl-C again, /quit or end of input to leave)\n> ");
            }
        })
        .context("installing the Ctrl-C handler")?;
        Ok(interrupts)
    }
}

pub fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    let interrupts = Interrupts::install()?;
    let file = Arc::new(
        gguf::GgufFile::open(&args.model)
            .with_context(|| format!("opening model {}", args.model.display()))?,
    );
    residency::sigbus::install(&file).context("installing the SIGBUS handler")?;
    let mut slots = load(&args, &file)?;
    let ctx_tokens = slots.info().ctx_per_slot;
    let max_line = max_line_bytes(file.gguf(), ctx_tokens);
    let seed = crate::sampling_args::seed_or_clock(args.seed);
    let mut chat = Chat {
        system: args.system.clone(),
        messages: Vec::new(),
        last: None,
        turns: 0,
    };
    let interactive = std::io::stdin().is_terminal();
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    let mut line_no = 0u64;
    loop {
        if interactive {
            errprint!("> ");
        }
        interrupts.at_prompt.store(0, Ordering::SeqCst);
        let read = read_line(&mut stdin, max_line, &mut bytes).context("reading stdin")?;
        line_no += 1;
        let line = match read {
            LineRead::Eof => break,
            read => match usable_line(read, &bytes, line_no, max_line, ctx_tokens) {
                Some(line) => line,
                None => continue,
            },
        };
        match command(line) {
            Some(Cmd::Quit) => break,
            Some(Cmd::Help) => outln!("{HELP}"),
            Some(Cmd::Clear) => {
                chat.messages.clear();
                outln!("[conversation cleared]");
            }
            Some(Cmd::System(text)) => {
                chat.system = (!text.is_empty()).then(|| text.to_string());
                chat.messages.clear();
                outln!("[system message set; new conversation]");
            }
            Some(Cmd::Stats) => outln!("{}", chat.stats(&slots)),
            Some(Cmd::Unknown(c)) => outln!("[unknown command {c}: /help lists them]"),
            None => {
                let request = request(&args, seed.wrapping_add(chat.turns));
                chat.turn(&mut slots, line, request, &interrupts)?;
            }
        }
    }
    Ok(())
}

/// The checks of the flags that need no model.
fn check_args(args: &Args) -> Result<()> {
    if args.n_predict == 0 || args.n_predict < -1 {
        bail!("-n must be positive, or -1 for \"until end of generation\"");
    }
    for (name, v, ok) in [
        ("--temp", args.temp, args.temp.is_finite()),
        ("--top-p", args.top_p, (0.0..=1.0).contains(&args.top_p)),
        ("--min-p", args.min_p, (0.0..=1.0).contains(&args.min_p)),
    ] {
        if !ok {
            bail!("{name} {v} is out of range");
        }
    }
    Ok(())
}

/// One slot over the model, decoding one token per submit through the one-token
/// pipelines (the answers are those of `vkdecode -p` on the same rendered prompt); a
/// model without a chat template is refused. Says what was loaded.
fn load(args: &Args, file: &Arc<gguf::GgufFile>) -> Result<engine::Slots> {
    let opts = engine::SlotsOptions {
        slots: 1,
        ctx: match args.ctx_size {
            0 => CtxRequest::Model,
            n => CtxRequest::Exact(n),
        },
        device: args.device,
        session: engine::SessionOptions {
            weights: engine::ResidencyOptions {
                mode: args.weights.into(),
                import_cap: args.import_cap.filter(|_| args.weights != WeightsArg::Copy),
                mlock: false,
            },
            kernels: args.kernels.profile,
            ..Default::default()
        },
        batched: false,
        ..Default::default()
    };
    let slots = engine::Slots::load(file, &opts)?;
    if slots.template().is_none() {
        bail!("the model file has no chat template (tokenizer.chat_template): `vkdecode chat` needs one; use `vkdecode -p` for plain completion");
    }
    let info = slots.info();
    if let Some(note) = &info.ctx_note {
        errln!("{note}");
    }
    errln!(
        "vkdecode chat: {} on {} (weights: {}), context {} tokens (KV cache {}), load {:.0} ms. /help for commands.",
        args.model.display(),
        info.device,
        info.weights_path,
        info.ctx_per_slot,
        engine::generate::fit::human(info.kv_bytes),
        info.load_ms
    );
    Ok(slots)
}

/// The text of line `line_no` as read into `bytes`, or `None` (said on stderr) for a
/// line too long for the context, one that is not UTF-8, or a blank one.
fn usable_line(
    read: LineRead,
    bytes: &[u8],
    line_no: u64,
    max_line: usize,
    ctx_tokens: usize,
) -> Option<&str> {
    let line = match read {
        LineRead::Line => match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                errln!(
                    "[line {line_no} is not valid UTF-8 (bad byte at offset {}); ignored]",
                    e.valid_up_to()
                );
                return None;
            }
        },
        LineRead::TooLong(n) => {
            errln!(
                "[line {line_no} is too long: {n} bytes, and the context of {ctx_tokens} tokens \
                 holds at most {max_line} bytes of text; ignored]"
            );
            return None;
        }
        LineRead::Eof => return None,
    };
    let line = line.trim_end_matches('\r');
    (!line.trim().is_empty()).then_some(line)
}

/// A turn's request as the flags ask (the prompt is the conversation, rendered by the
/// turn).
fn request(args: &Args, seed: u64) -> engine::Request {
    engine::Request {
        prompt: Vec::new(),
        max_tokens: usize::try_from(args.n_predict).ok(),
        sampler: engine::SamplerOptions {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed,
            ..engine::SamplerOptions::default()
        },
        stop: Vec::new(),
        ignore_eos: false,
        prompt_logprobs: None,
    }
}

/// The longest line worth tokenising: a token stands for at most as many bytes of text
/// as its vocabulary piece has (a byte-level piece spells each byte with one or two
/// characters, a `<0xAB>` piece with six), so a line longer than the context times the
/// longest piece cannot fit the context whatever it says. Capped by the file limit of
/// [`crate::input::MAX_TEXT_BYTES`].
fn max_line_bytes(g: &gguf::Gguf, ctx_tokens: usize) -> usize {
    let longest = g
        .get_str_array("tokenizer.ggml.tokens")
        .ok()
        .and_then(|t| t.iter().map(|p| p.len()).max())
        .unwrap_or(1)
        .max(1);
    let cap = crate::input::MAX_TEXT_BYTES as usize;
    ctx_tokens.saturating_mul(longest).min(cap)
}

/// The conversation so far.
struct Chat {
    system: Option<String>,
    /// User and assistant messages, in order.
    messages: Vec<Message>,
    /// The last answer's completion.
    last: Option<engine::Completion>,
    turns: u64,
}

impl Chat {
    /// The whole conversation with the system message first.
    fn rendered(&self) -> Vec<Message> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(Message::new("system", s.clone()));
        }
        all.extend(self.messages.iter().cloned());
        all
    }

    /// One user turn: render, submit (the slot reuses what it holds), stream the answer.
    fn turn(
        &mut self,
        slots: &mut engine::Slots,
        user: &str,
        mut request: engine::Request,
        interrupts: &Interrupts,
    ) -> Result<()> {
        self.messages.push(Message::new("user", user));
        request.prompt = slots.chat_prompt(&self.rendered())?;
        if let Err(e) = slots.submit(0, request) {
            self.messages.pop();
            outln!("[{e}: /clear starts a new conversation]");
            return Ok(());
        }
        self.turns += 1;
        interrupts.cancel.store(false, Ordering::SeqCst);
        interrupts.answering.store(true, Ordering::SeqCst);
        let mut out = std::io::stdout().lock();
        let mut write_err = None;
        let done = slots.finish(
            0,
            &mut || Ok(interrupts.cancel.swap(false, Ordering::SeqCst)),
            &mut |e| {
                if let engine::SlotEvent::Text { text, .. } = e {
                    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                        write_err.get_or_insert(e);
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            },
        );
        interrupts.answering.store(false, Ordering::SeqCst);
        writeln!(out)?;
        drop(out);
        if let Some(e) = write_err {
            return Err(anyhow::Error::new(e).context("writing the answer"));
        }
        let done = done?;
        if let Some(e) = &done.error {
            errln!("[the answer failed: {e}]");
        }
        match done.stop {
            engine::StopReason::Cancelled => errln!("[stopped]"),
            engine::StopReason::ContextFull => {
                errln!("[the context is full: /clear starts a new conversation]")
            }
            _ => {}
        }
        // the answer (even a stopped one) is part of the conversation from now on
        self.messages
            .push(Message::new("assistant", done.text.clone()));
        self.last = Some(done);
        Ok(())
    }

    /// The `/stats` line.
    fn stats(&self, slots: &engine::Slots) -> String {
        let c = slots.counters();
        let held = slots.cached(0).len();
        let ctx = slots.ctx_per_slot();
        let total = format!(
            "session: {} turn(s), prompt tokens {} (prefilled {}, reused {}), generated {}; KV cache {held}/{ctx} positions",
            c.requests, c.prompt_tokens, c.prefilled_tokens, c.reused_tokens, c.generated_tokens
        );
        match &self.last {
            None => format!("[stats] no turn yet; {total}"),
            Some(d) => {
                let u = &d.usage;
                let tok_s = match u.generated_tokens.saturating_sub(1) {
                    0 => 0.0,
                    n => n as f64 / (u.decode_ms / 1e3).max(1e-9),
                };
                format!(
                    "[stats] last turn: prompt {} tokens (prefilled {}, reused {}), generated {} ({}), first token {:.0} ms, decode {tok_s:.1} tok/s; {total}",
                    u.prompt_tokens,
                    u.prefilled_tokens,
                    u.reused_tokens,
                    u.generated_tokens,
                    d.finish_reason(),
                    u.ttft_ms
                )
            }
        }
    }
}

enum Cmd<'a> {
    Quit,
    Help,
    Clear,
    Stats,
    System(&'a str),
    Unknown(&'a str),
}

/// A line starting with `/` is a command.
fn command(line: &str) -> Option<Cmd<'_>> {
    let rest = line.strip_prefix('/')?;
    let (name, arg) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    Some(match name {
        "quit" | "exit" | "q" => Cmd::Quit,
        "help" | "?" => Cmd::Help,
        "clear" => Cmd::Clear,
        "stats" => Cmd::Stats,
        "system" => Cmd::System(arg.trim()),
        _ => Cmd::Unknown(line),
    })
}
