//! `vkdecode`: decode GGUF language models with Vulkan compute.
//!
//! The binary is glue: every subcommand lives in its own module and calls into the
//! library crates. Errors are `anyhow` here only; `main` prints the whole cause chain
//! and maps failures to exit codes.
//!
//! `unsafe` is denied, and allowed in three modules (`signals`: sigaction, kill, prctl;
//! `unnamed_file`: linkat; `heap`: mallopt).
#![deny(unsafe_code)]

/// `print!` to stdout, ending the process quietly when the reader has gone (see out.rs).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write_stdout(format_args!($($arg)*)) };
}

/// `println!` to stdout, ending the process quietly when the reader has gone (see out.rs).
macro_rules! outln {
    () => { $crate::out::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` that never panics: a message that stderr cannot take (closed, full) is lost
/// (see out.rs).
macro_rules! errprint {
    ($($arg:tt)*) => { $crate::out::write_stderr(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics: a message that stderr cannot take (closed, full) is lost
/// (see out.rs).
macro_rules! errln {
    () => { $crate::out::write_stderr(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::out::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod bench;
mod chat;
mod convert;
mod heap;
mod info;
mod input;
mod inspect;
mod kernels_arg;
mod out;
mod out_path;
mod run;
mod sampling_args;
mod serve;
mod signals;
mod stats;
mod supervise;
mod tokenize;
mod unnamed_file;

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

/// Decode GGUF language models on Vulkan compute, with the weights imported straight
/// from the page cache on unified-memory GPUs.
///
/// Without a subcommand, generates text: `vkdecode -m model.gguf -p "Once upon a time"`.
#[derive(Parser, Debug)]
#[command(name = "vkdecode", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    run: run::Args,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show a GGUF file's hyper-parameters, tokenizer, tensors and shard plan.
    Inspect(inspect::Args),
    /// Rewrite a GGUF file with its 2-D weights requantised (Q8_0).
    Convert(convert::Args),
    /// Turn text into token ids with the model's own tokenizer.
    Tokenize(tokenize::Args),
    /// List Vulkan devices, their capabilities, and what `--weights auto` picks on each.
    Info(info::Args),
    /// A/B benchmark of imported versus copied weights, each run a fresh process.
    Bench(bench::Args),
    /// Chat in the terminal: multi-turn, the model's template, the KV cache reused
    /// between turns (/help lists the commands).
    Chat(chat::Args),
    /// An OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, slots.
    Serve(serve::Args),
}

fn main() {
    heap::return_freed_memory();
    // A bench's janitor does nothing else (see bench::janitor).
    if let Some(dir) = std::env::var_os(bench::JANITOR_ENV) {
        bench::janitor(&dir);
    }
    signals::ignore_file_size_limit();
    // A worker or bench child whose parent is already gone has nobody to report to.
    if !signals::tie_to_parent() {
        std::process::exit(128 + libc::SIGKILL);
    }
    // Library crates emit tracing spans and events (load, prefill, decode, residency
    // decisions); warnings show by default, `VKDECODE_LOG=info` (or debug, trace) shows more.
    // On a terminal the residency layer's progress of a large staging copy shows too.
    let default_filter = if std::io::stderr().is_terminal() {
        "warn,residency=info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("VKDECODE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        // its own report of a failed write is an `eprintln!`, which panics on the same
        // unwritable stderr
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Inspect(args)) => inspect::run(args),
        Some(Command::Convert(args)) => convert::run(args),
        Some(Command::Tokenize(args)) => tokenize::run(args),
        Some(Command::Info(args)) => info::run(args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Chat(args)) => chat::run(args),
        Some(Command::Serve(args)) => serve::run(args),
        // weights that may be file pages: a worker process, so that a file shrinking
        // under the run is reported by name (see `supervise`)
        None => match run::file_backed_model(&cli.run).filter(|_| !supervise::is_worker()) {
            Some(model) => supervise::run(&model, std::env::args_os().skip(1))
                .map(|code| std::process::exit(code)),
            None => run::run(cli.run),
        },
    };
    if let Err(err) = result {
        // stdout closed by its reader (`| head -1`): nothing more to show, not an error
        if out::is_broken_pipe(&err) {
            std::process::exit(0);
        }
        errln!("error: {err}");
        for cause in err.chain().skip(1) {
            errln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}
