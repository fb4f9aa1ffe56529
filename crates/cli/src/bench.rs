//! `vkdecode bench`: the A/B of weights imported from the page cache against the
//! staging copy, each run a fresh child process, arms alternating (A B A B ...) so drift
//! in the machine's speed hits both. See benches/README.md.
//!
//! The children are this binary re-executed in benchmark mode (`--prompt-ids`,
//! `--ignore-eos`, `--stats-json`); the parent only schedules, evicts the page cache
//! (`--cold`), reads `MemAvailable` (`--procs`), and summarises.

mod child;
mod json;
mod memory;
mod plot;
mod profile;
mod report;
mod stats;
mod table;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::signals;
use child::{ChildResult, GroupSpec, TempDir};

pub use child::{janitor, JANITOR_ENV};

/// How the weights reach the GPU in one arm.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The mapped file pages, imported (no copy).
    Import,
    /// Device-local memory filled through a staging buffer (the baseline).
    Copy,
    /// Whatever the engine picks for this device.
    Auto,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Import => "import",
            Mode::Copy => "copy",
            Mode::Auto => "auto",
        }
    }
}

/// Arguments of `vkdecode bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Path to the GGUF model file.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub model: PathBuf,

    /// Residency modes to compare, comma-separated: import, copy, auto.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "import,copy")]
    pub modes: Vec<Mode>,

    #[command(flatten)]
    pub kernels: crate::kernels_arg::KernelsArg,

    /// Runs per arm (each a fresh process; arms alternate).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,

    /// Prompt length in tokens (a fixed English text through the model's tokenizer).
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 64)]
    pub prompt_tokens: usize,

    /// Tokens to decode per run (greedy, end-of-generation ignored).
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub decode_tokens: usize,

    /// Run N decoders of the model at once per arm and report the sum of their Pss and
    /// the drop in MemAvailable; a list (1,2,4) sweeps N.
    #[arg(long, value_delimiter = ',', value_name = "N")]
    pub procs: Vec<usize>,

    /// Evict the model file from the page cache (posix_fadvise DONTNEED) before each run.
    #[arg(long)]
    pub cold: bool,

    /// Write every run and the summary as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Draw the A/B as an SVG: decode tok/s, memory split per arm, Pss versus N.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Add an ablation arm (`<first mode>+sync`) that waits on the host after every layer.
    #[arg(long = "sync-each-layer")]
    pub sync_each_layer: bool,

    /// After the A/B, print the per-kernel GPU time of one decode token for each mode.
    #[arg(long)]
    pub profile: bool,

    /// Vulkan device index passed to the children (see `vkdecode info`).
    #[arg(long)]
    pub device: Option<usize>,

    /// An extra argument for every child run, repeatable (e.g. --child-arg=--import-cap=256MiB).
    #[arg(long = "child-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub child_args: Vec<String>,

    /// Kill a run (or a group of --procs runs) that takes longer than this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,

    /// Backend of the children (for testing the harness with `reference`).
    #[arg(long, hide = true)]
    pub backend: Option<String>,
}

/// One arm of the benchmark.
#[derive(Debug, Clone)]
pub struct Arm {
    pub name: String,
    pub mode: Mode,
    pub sync_each_layer: bool,
}

/// One child run, with where it sat in the schedule.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub arm: usize,
    /// N of its group (1 without --procs).
    pub procs: usize,
    pub repetition: usize,
    /// Index of the process inside its group.
    pub process: usize,
    /// Index of its group in the order groups ran.
    pub seq: usize,
    pub evicted: bool,
    pub residency_at_start: Option<residency::pagecache::Residency>,
    pub child: ChildResult,
}

/// The figures of one group of `--procs N` runs.
#[derive(Debug, Clone)]
pub struct GroupRecord {
    pub arm: usize,
    pub procs: usize,
    pub repetition: usize,
    pub seq: usize,
    pub mem_available_before_kb: Option<u64>,
    pub mem_available_loaded_kb: Option<u64>,
    pub all_reached_barrier: bool,
}

/// Everything the benchmark measured, and what it was run on.
pub struct Bench {
    pub args: Args,
    pub arms: Vec<Arm>,
    pub model: PathBuf,
    pub file_size: u64,
    pub alignment: u64,
    pub prompt_source: String,
    pub runs: Vec<RunRecord>,
    pub groups: Vec<GroupRecord>,
    /// The N values run (`[1]` without --procs).
    pub procs: Vec<usize>,
    pub grouped: bool,
    pub interrupted: bool,
}

/// A fixed English text for the prompt: the same ids every run and every machine.
const PROMPT_TEXT: &str = "The old lighthouse keeper climbed the spiral stairs every evening \
at dusk, carrying a lamp, a notebook and a flask of tea. From the gallery he could see the \
fishing boats returning to the harbour, the gulls circling above the cliffs, and the long \
grey line of the coast fading into the mist. He wrote down the wind, the state of the sea \
and the names of the ships that passed, as his father had done before him, and his \
grandfather before that. Nobody read the notebooks any more, but he kept them on a shelf \
in the kitchen, one for every year, and on winter nights he sometimes opened an old one \
and read about storms that nobody else remembered.";

pub fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    let arms = plan_arms(&args.modes, args.sync_each_layer);
    let file = gguf::GgufFile::open(&args.model)
        .with_context(|| format!("opening model {}", args.model.display()))?;
    let alignment = file.gguf().alignment;
    let file_size = file.bytes().len() as u64;
    if let Some(&most) = args.procs.iter().max() {
        memory::check_procs(&file, &args, &arms, most)?;
    }
    let (prompt_ids, prompt_source) = prompt_ids(&file, args.prompt_tokens)?;
    drop(file);

    let exe = std::env::current_exe().context("finding this executable to re-run it")?;
    // SIGINT: children in the same process group get a terminal's Ctrl-C too and stop
    // early; the bench then reports what it has. SIGTERM and SIGHUP reach the bench
    // alone: it passes them on to its children (child::run_group), removes its temp dir
    // and leaves with 128 + the signal, reporting nothing.
    signals::catch().context("installing the signal handlers")?;
    let interrupted = || signals::count(libc::SIGINT) > 0 || signals::termination().is_some();
    // The janitor removes the directory even if the bench is killed outright (SIGKILL).
    let tmp = TempDir::guarded("vkdecode-bench", &exe)?;
    let (procs, grouped) = if args.procs.is_empty() {
        (vec![1], false)
    } else {
        (args.procs.clone(), true)
    };
    let ids_arg = write_ids(tmp.path(), &prompt_ids)?;
    announce(
        &args,
        file_size,
        &arms,
        prompt_ids.len(),
        &prompt_source,
        &procs,
    );

    let mut schedule = Schedule {
        args: &args,
        arms: &arms,
        exe: &exe,
        ids_arg: &ids_arg,
        tmp: tmp.path(),
        grouped,
        total: procs.len() * args.repetitions * arms.len(),
        runs: Vec::new(),
        groups: Vec::new(),
        warned_eviction: false,
    };
    'schedule: for &n in &procs {
        for repetition in 0..args.repetitions {
            for arm in 0..arms.len() {
                if interrupted() {
                    break 'schedule;
                }
                schedule.group(arm, n, repetition, &interrupted)?;
            }
        }
    }
    let (runs, groups) = (schedule.runs, schedule.groups);
    if let Some(sig) = signals::termination() {
        leave_on_signal(sig, tmp, runs.len());
    }
    let bench = Bench {
        args: args.clone(),
        arms,
        model: args.model.clone(),
        file_size,
        alignment,
        prompt_source,
        runs,
        groups,
        procs,
        grouped,
        interrupted: interrupted(),
    };
    publish(&bench, &exe, &ids_arg, tmp)
}

/// The checks of the flags that need no model; an output path that cannot be written is
/// refused before a benchmark is spent on it.
fn check_args(args: &Args) -> Result<()> {
    if args.modes.is_empty() {
        bail!("--modes needs at least one of import, copy, auto");
    }
    if args.repetitions == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    if args.prompt_tokens == 0 || args.decode_tokens == 0 {
        bail!("-p and -n must be at least 1 token");
    }
    if args.procs.contains(&0) {
        bail!("--procs takes counts of at least 1");
    }
    if let Some(path) = &args.json {
        check_output("--json", path)?;
    }
    if let Some(path) = &args.plot {
        check_output("--plot", path)?;
    }
    Ok(())
}

/// Writes the prompt's ids for the children into `dir`, returning the `@FILE` argument:
/// a long prompt (`-p 100000`) on the command line fails with "Argument list too long".
fn write_ids(dir: &Path, ids: &[u32]) -> Result<String> {
    let ids_file = dir.join("prompt_ids.txt");
    let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    std::fs::write(&ids_file, list.join(","))
        .with_context(|| format!("writing {}", ids_file.display()))?;
    Ok(format!("@{}", ids_file.display()))
}

/// Says on stderr what is about to run.
fn announce(
    args: &Args,
    file_size: u64,
    arms: &[Arm],
    n_prompt: usize,
    prompt_source: &str,
    procs: &[usize],
) {
    let names = arms.iter().map(|a| a.name.as_str()).collect::<Vec<_>>();
    let procs = if args.procs.is_empty() {
        String::new()
    } else {
        let list = procs.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        format!(", --procs {}", list.join(","))
    };
    let cache = if args.cold {
        ", cold: the model file is evicted from the page cache before each run"
    } else {
        ", warm page cache"
    };
    errln!(
        "bench: {} ({:.1} MB), arms {}, {} repetition(s), prompt {n_prompt} tokens ({prompt_source}), decode {} tokens{procs}{cache}",
        args.model.display(),
        file_size as f64 / 1e6,
        names.join(" / "),
        args.repetitions,
        args.decode_tokens,
    );
}

/// The runs so far, and what each next group of runs needs.
struct Schedule<'a> {
    args: &'a Args,
    arms: &'a [Arm],
    exe: &'a Path,
    ids_arg: &'a str,
    tmp: &'a Path,
    grouped: bool,
    /// Groups in the whole schedule, for the progress lines.
    total: usize,
    runs: Vec<RunRecord>,
    groups: Vec<GroupRecord>,
    warned_eviction: bool,
}

impl Schedule<'_> {
    /// Runs one group: `n` children of arm `arm` at once (one without `--procs`), after
    /// evicting the file with `--cold`, and records their figures.
    fn group(
        &mut self,
        arm: usize,
        n: usize,
        repetition: usize,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<()> {
        let args = self.args;
        let seq = self.groups.len();
        let dir = self.tmp.join(format!("run{seq}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let residency_at_start = self.page_cache_before()?;
        let spec = GroupSpec {
            exe: self.exe,
            args: child_args(args, &self.arms[arm], self.ids_arg),
            n,
            barrier: self.grouped,
            timeout: Duration::from_secs(args.timeout),
            dir: &dir,
            stderr_tail_bytes: 4096,
        };
        let result = child::run_group(&spec, interrupted)?;
        let group = GroupRecord {
            arm,
            procs: n,
            repetition,
            seq,
            mem_available_before_kb: result.mem_available_before_kb,
            mem_available_loaded_kb: result.mem_available_loaded_kb,
            all_reached_barrier: result.all_reached_barrier,
        };
        let new_runs: Vec<RunRecord> = (result.children.into_iter().enumerate())
            .map(|(process, child)| RunRecord {
                arm,
                procs: n,
                repetition,
                process,
                seq,
                evicted: args.cold,
                residency_at_start,
                child,
            })
            .collect();
        errln!(
            "[{}/{}] {}",
            seq + 1,
            self.total,
            report::progress_line(&self.arms[arm], &group, &new_runs, self.grouped)
        );
        self.runs.extend(new_runs);
        self.groups.push(group);
        // Let the directory go now: it holds the children's stats and stderr.
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    /// With `--cold`, evicts the model from the page cache; then how much of it is there
    /// (warned once if eviction left most of it).
    fn page_cache_before(&mut self) -> Result<Option<residency::pagecache::Residency>> {
        let model = &self.args.model;
        if self.args.cold {
            residency::pagecache::evict(model)
                .context("--cold: evicting the model from the page cache")?;
        }
        let at_start = match residency::pagecache::residency(model) {
            Ok(r) => Some(r),
            Err(e) => {
                errln!("warning: {e}");
                None
            }
        };
        if let Some(r) = at_start.filter(|r| self.args.cold && r.fraction() > 0.5) {
            if !self.warned_eviction {
                errln!(
                    "warning: --cold: {:.0}% of the model is still in the page cache after eviction \
                     (tmpfs, or another process maps it)",
                    100.0 * r.fraction()
                );
                self.warned_eviction = true;
            }
        }
        Ok(at_start)
    }
}

/// The table on stdout, `--json` and `--plot`, `--profile`'s extra runs; an error when
/// the bench was interrupted or a run failed.
fn publish(bench: &Bench, exe: &Path, ids_arg: &str, tmp: TempDir) -> Result<()> {
    let args = &bench.args;
    let summary = report::Summary::new(bench);
    outln!("{}", table::table(bench, &summary));
    if let Some(path) = &args.json {
        let json = json::to_json(bench, &summary);
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        errln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::draw(bench, &summary, path)?;
        errln!("wrote {}", path.display());
    }
    if args.profile && !bench.interrupted {
        profile::run(bench, exe, ids_arg, tmp.path())?;
        if let Some(sig) = signals::termination() {
            leave_on_signal(sig, tmp, bench.runs.len());
        }
    }
    drop(tmp);
    let failed = bench.runs.iter().filter(|r| r.child.stats.is_err()).count();
    if bench.interrupted {
        bail!(
            "interrupted: {} runs done, figures above are partial",
            bench.runs.len()
        );
    }
    if failed > 0 {
        bail!(
            "{failed} of {} runs failed (their stderr is above)",
            bench.runs.len()
        );
    }
    Ok(())
}

/// After SIGTERM or SIGHUP (passed on to the children, which are gone): removes the temp
/// dir and leaves with the conventional status, reporting nothing more.
fn leave_on_signal(sig: libc::c_int, tmp: TempDir, runs: usize) -> ! {
    drop(tmp);
    let name = if sig == libc::SIGHUP {
        "SIGHUP"
    } else {
        "SIGTERM"
    };
    errln!("bench: ended by {name} after {runs} runs; nothing written");
    std::process::exit(128 + sig)
}

/// Refuses an output path that cannot be written, before any run: a directory, a FIFO
/// that nothing reads, a place that does not exist or is read-only. An existing file is opened for writing without
/// truncating it (it keeps its contents until the bench writes it); a new one is created
/// and removed again.
fn check_output(flag: &str, path: &Path) -> Result<()> {
    let cannot = || format!("{flag} {}: cannot write there", path.display());
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{flag} {}: is a directory", path.display()),
        Ok(_) => {
            crate::out_path::refuse_unread_fifo(path)
                .with_context(|| format!("{flag} {}", path.display()))?;
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(cannot)?;
        }
        Err(_) => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(cannot)?;
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(())
}

/// The arms in the order they alternate: the modes given, then the ablation arm.
pub fn plan_arms(modes: &[Mode], sync_each_layer: bool) -> Vec<Arm> {
    let mut arms: Vec<Arm> = Vec::new();
    for &mode in modes {
        if !arms.iter().any(|a| a.mode == mode) {
            arms.push(Arm {
                name: mode.as_str().to_string(),
                mode,
                sync_each_layer: false,
            });
        }
    }
    if sync_each_layer {
        let mode = arms[0].mode;
        arms.push(Arm {
            name: format!("{}+sync", mode.as_str()),
            mode,
            sync_each_layer: true,
        });
    }
    arms
}

/// The arguments of one child run (the group adds `--stats-json` and `--bench-barrier`).
fn child_args(args: &Args, arm: &Arm, ids: &str) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["-m".into(), args.model.clone().into_os_string()];
    for s in [
        "--prompt-ids".to_string(),
        ids.to_string(),
        "-n".into(),
        args.decode_tokens.to_string(),
        // The KV cache holds what the run needs and no more, so memory is the weights'.
        "-c".into(),
        (args.prompt_tokens + args.decode_tokens).to_string(),
        "--temp".into(),
        "0".into(),
        "--seed".into(),
        "0".into(),
        "--ignore-eos".into(),
        "--no-display".into(),
        "--weights".into(),
        arm.mode.as_str().into(),
    ] {
        v.push(s.into());
    }
    if arm.sync_each_layer {
        v.push("--sync-each-layer".into());
    }
    v.push("--kernels".into());
    v.push(args.kernels.profile.as_str().into());
    if let Some(b) = &args.backend {
        v.push("--backend".into());
        v.push(b.into());
    }
    if let Some(d) = args.device {
        v.push("--device".into());
        v.push(d.to_string().into());
    }
    v.extend(args.child_args.iter().map(OsString::from));
    v
}

/// The prompt: the first `n` ids of [`PROMPT_TEXT`] through the model's tokenizer,
/// repeated when the text is shorter. A model whose tokenizer cannot encode it (a tiny
/// synthetic vocabulary) gets a fixed arithmetic sequence of ids instead, and says so.
fn prompt_ids(file: &gguf::GgufFile, n: usize) -> Result<(Vec<u32>, String)> {
    let encoded = tokenizer::Tokenizer::from_gguf(file.gguf())
        .map_err(anyhow::Error::from)
        .and_then(|tok| {
            let ids = tok.encode(PROMPT_TEXT, true, false)?;
            Ok((ids, tok.vocab_size()))
        });
    match encoded {
        Ok((ids, _)) if !ids.is_empty() => {
            let out: Vec<u32> = ids.iter().copied().cycle().take(n).collect();
            let source = if ids.len() >= n {
                "fixed English text".to_string()
            } else {
                format!("fixed English text of {} tokens, repeated", ids.len())
            };
            Ok((out, source))
        }
        other => {
            let reason = match &other {
                Err(e) => format!("{e:#}"),
                Ok(_) => "the text encodes to no tokens".into(),
            };
            let vocab = match other {
                Ok((_, v)) => v,
                Err(_) => file
                    .gguf()
                    .get_str_array("tokenizer.ggml.tokens")
                    .map(|t| t.len())
                    .context("the model has no tokenizer.ggml.tokens to pick prompt ids from")?,
            };
            if vocab == 0 {
                bail!("the model's vocabulary is empty");
            }
            let out = (0..n).map(|i| ((7 * i + 1) % vocab) as u32).collect();
            Ok((
                out,
                format!("synthetic ids: the tokenizer failed ({reason})"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_alternate_in_the_order_given_with_the_ablation_last() {
        let arms = plan_arms(&[Mode::Import, Mode::Copy, Mode::Import], true);
        let names: Vec<&str> = arms.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["import", "copy", "import+sync"]);
        assert!(arms[2].sync_each_layer && arms[2].mode == Mode::Import);
        let arms = plan_arms(&[Mode::Copy, Mode::Auto], false);
        let names: Vec<&str> = arms.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["copy", "auto"]);
    }

    #[test]
    fn child_arguments_carry_the_benchmark_protocol() {
        let args = Args {
            model: "m.gguf".into(),
            modes: vec![Mode::Copy],
            kernels: crate::kernels_arg::KernelsArg {
                profile: engine::kernels::KernelProfile::Gpu,
            },
            repetitions: 1,
            prompt_tokens: 3,
            decode_tokens: 5,
            procs: vec![],
            cold: false,
            json: None,
            plot: None,
            sync_each_layer: false,
            profile: false,
            device: Some(1),
            child_args: vec!["--import-cap=1MiB".into()],
            timeout: 10,
            backend: Some("reference".into()),
        };
        let arm = Arm {
            name: "copy+sync".into(),
            mode: Mode::Copy,
            sync_each_layer: true,
        };
        let v: Vec<String> = child_args(&args, &arm, "1,2,3")
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let joined = v.join(" ");
        assert!(
            joined.starts_with("-m m.gguf --prompt-ids 1,2,3 -n 5 -c 8 --temp 0"),
            "{joined}"
        );
        for part in [
            "--ignore-eos",
            "--no-display",
            "--weights copy",
            "--sync-each-layer",
            "--kernels gpu",
            "--backend reference",
            "--device 1",
        ] {
            assert!(joined.contains(part), "{part} missing from {joined}");
        }
        assert_eq!(v.last().map(String::as_str), Some("--import-cap=1MiB"));
    }
}
