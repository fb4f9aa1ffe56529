//! Child processes of the benchmark: each run is `vkdecode` re-executing itself with
//! `--stats-json`, so load time and memory are what a user would meet. A group is N
//! such children started at once (`--procs N`) that meet at a file barrier
//! (`--bench-barrier DIR:N+1`, the parent being the extra member) so that the parent
//! reads `MemAvailable` while all of them are loaded and alive.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::signals;

/// Set in a janitor's environment: the temp dir it removes once the bench is gone.
pub const JANITOR_ENV: &str = "VKDECODE_BENCH_JANITOR";

/// What every bench temp dir's name starts with; a janitor removes nothing else.
const BENCH_PREFIX: &str = "vkdecode-bench";

/// A directory removed, with everything in it, when dropped.
pub struct TempDir {
    path: PathBuf,
    /// A process that removes the directory if this one dies without dropping it: this
    /// process holds the write end of its stdin, which the kernel closes however we end.
    janitor: Option<Child>,
}

impl TempDir {
    pub fn new(prefix: &str) -> Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("creating the temp dir {}", path.display()))?;
        Ok(TempDir {
            path,
            janitor: None,
        })
    }

    /// A temp dir that outlives no crash of this process: `exe` (this binary) is started
    /// as its [`janitor`]. SIGKILL gives no chance to clean up, and the bench's children
    /// die with it (they asked the kernel to), so the janitor is what is left to do it.
    pub fn guarded(prefix: &str, exe: &Path) -> Result<TempDir> {
        debug_assert!(prefix.starts_with(BENCH_PREFIX));
        let mut dir = TempDir::new(prefix)?;
        let janitor = Command::new(exe)
            .env(JANITOR_ENV, &dir.path)
            .env_remove(signals::PARENT_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the bench's janitor process")?;
        dir.janitor = Some(janitor);
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(mut janitor) = self.janitor.take() {
            // its stdin closes: it finds the directory gone and exits at once
            drop(janitor.stdin.take());
            let _ = janitor.wait();
        }
    }
}

/// The whole life of a bench's janitor (a vkdecode process started with [`JANITOR_ENV`]
/// naming the directory): wait until the bench closes our stdin, by exiting or dying,
/// then remove the directory. SIGINT, SIGTERM and SIGHUP are caught and ignored: a
/// terminal sends them to the bench too, which cleans up itself, and the janitor must
/// outlive it. Only a directory of the bench's own naming in the temp dir is removed.
pub fn janitor(dir: &OsStr) -> ! {
    let _ = signals::catch();
    let mut stdin = std::io::stdin().lock();
    let mut sink = [0u8; 64];
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let path = Path::new(dir);
    let ours = path.parent() == Some(std::env::temp_dir().as_path())
        && path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(BENCH_PREFIX));
    if ours {
        // the children die with the bench, but one may still be writing as we start: try
        // again until the directory is gone (bounded)
        for _ in 0..40 {
            if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    std::process::exit(0)
}

/// `MemAvailable` from /proc/meminfo, in KiB.
pub fn mem_available_kb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemAvailable")
}

fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, rest) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Why a child did not produce its stats.
#[derive(Debug, Clone)]
pub struct Failure {
    /// One line: what happened (exit code, signal, timeout, missing stats).
    pub reason: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The bench killed it (time limit or interruption).
    pub killed_by_bench: bool,
    /// The last lines of its stderr.
    pub stderr_tail: String,
}

/// What one child produced.
#[derive(Debug, Clone)]
pub struct ChildResult {
    pub pid: u32,
    /// Wall time from spawn to exit, as the parent saw it.
    pub wall_ms: f64,
    /// The `--stats-json` object, or why there is none.
    pub stats: Result<Value, Failure>,
    /// The last lines of its stderr (kept on success too, for `--profile`).
    pub stderr_tail: String,
}

/// A group of `n` children started together.
pub struct GroupSpec<'a> {
    pub exe: &'a Path,
    /// Arguments of every child, without `--stats-json` and `--bench-barrier`.
    pub args: Vec<OsString>,
    pub n: usize,
    /// Meet at a barrier before measuring and read MemAvailable while all are loaded.
    pub barrier: bool,
    pub timeout: Duration,
    /// A directory (empty, private to this group) for stats, stderr and barrier files.
    pub dir: &'a Path,
    /// How much of each child's stderr to keep (its end).
    pub stderr_tail_bytes: u64,
}

/// What a group produced.
pub struct GroupResult {
    pub children: Vec<ChildResult>,
    /// MemAvailable (KiB) just before spawning.
    pub mem_available_before_kb: Option<u64>,
    /// MemAvailable (KiB) while every child was loaded and waiting at the barrier.
    pub mem_available_loaded_kb: Option<u64>,
    /// Every live child reached the barrier (false when one failed first).
    pub all_reached_barrier: bool,
}

struct Running {
    child: Child,
    pid: u32,
    stats_path: PathBuf,
    stderr_path: PathBuf,
    started: Instant,
    exit: Option<(ExitStatus, f64)>,
    killed_by_bench: bool,
}

/// Runs one group to completion. Never panics on a misbehaving child: a child that
/// cannot be spawned, exits non-zero, is killed or writes no stats is reported as a
/// [`Failure`] with its stderr tail. `interrupted` stops the wait at the barrier; a
/// SIGTERM or SIGHUP caught by this process is passed on to every child still running.
pub fn run_group(spec: &GroupSpec, interrupted: &dyn Fn() -> bool) -> Result<GroupResult> {
    let barrier_dir = spec.dir.join("barrier");
    if spec.barrier {
        std::fs::create_dir_all(&barrier_dir)
            .with_context(|| format!("creating {}", barrier_dir.display()))?;
    }
    let mem_available_before_kb = mem_available_kb();
    let (mut running, spawn_failures) = spawn_all(spec, &barrier_dir)?;
    let mut barrier = Barrier::new(&barrier_dir, spec.barrier, spawn_failures.len());
    let deadline = Instant::now() + spec.timeout;
    // when a SIGTERM or SIGHUP was passed on to the children
    let mut passed_on: Option<Instant> = None;
    loop {
        pass_on_termination(&mut running, &mut passed_on);
        for r in running.iter_mut().filter(|r| r.exit.is_none()) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.exit = Some((status, r.started.elapsed().as_secs_f64() * 1e3));
            }
        }
        barrier.poll(&running, interrupted() || Instant::now() > deadline)?;
        if running.iter().all(|r| r.exit.is_some()) {
            break;
        }
        if Instant::now() > deadline {
            kill_late(&mut running);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let mut children: Vec<ChildResult> = running
        .into_iter()
        .map(|r| finish(r, spec.timeout, spec.stderr_tail_bytes))
        .collect();
    children.extend(spawn_failures);
    Ok(GroupResult {
        children,
        mem_available_before_kb,
        mem_available_loaded_kb: barrier.mem_available_loaded_kb,
        all_reached_barrier: barrier.all_reached && spec.barrier,
    })
}

/// Starts the group's `spec.n` children: those running, and a result for each that
/// could not be started.
fn spawn_all(spec: &GroupSpec, barrier_dir: &Path) -> Result<(Vec<Running>, Vec<ChildResult>)> {
    let mut running = Vec::new();
    let mut spawn_failures = Vec::new();
    for i in 0..spec.n {
        let stats_path = spec.dir.join(format!("stats.{i}.json"));
        let stderr_path = spec.dir.join(format!("stderr.{i}.txt"));
        let stderr = std::fs::File::create(&stderr_path)
            .with_context(|| format!("creating {}", stderr_path.display()))?;
        let mut cmd = Command::new(spec.exe);
        // the bench measures the process that decodes: no supervisor in between; the
        // child dies with the bench
        cmd.env(crate::supervise::WORKER_ENV, "1")
            .env(signals::PARENT_ENV, std::process::id().to_string())
            .args(&spec.args)
            .arg("--stats-json")
            .arg(&stats_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if spec.barrier {
            let mut b = barrier_dir.to_path_buf().into_os_string();
            b.push(format!(":{}", spec.n + 1));
            cmd.arg("--bench-barrier").arg(b);
        }
        match cmd.spawn() {
            Ok(child) => running.push(Running {
                pid: child.id(),
                child,
                stats_path,
                stderr_path,
                started: Instant::now(),
                exit: None,
                killed_by_bench: false,
            }),
            Err(e) => spawn_failures.push(ChildResult {
                pid: 0,
                wall_ms: 0.0,
                stats: Err(Failure {
                    reason: format!("could not start {}: {e}", spec.exe.display()),
                    exit_code: None,
                    signal: None,
                    killed_by_bench: false,
                    stderr_tail: String::new(),
                }),
                stderr_tail: String::new(),
            }),
        }
    }
    Ok((running, spawn_failures))
}

/// A SIGTERM or SIGHUP caught by this process goes on to every child still running;
/// those still running a grace period later are killed.
fn pass_on_termination(running: &mut [Running], passed_on: &mut Option<Instant>) {
    match (*passed_on, signals::termination()) {
        (None, Some(sig)) => {
            for r in running.iter().filter(|r| r.exit.is_none()) {
                let _ = signals::send(r.pid, sig);
            }
            *passed_on = Some(Instant::now());
        }
        (Some(at), _) if at.elapsed() > crate::supervise::GRACE => {
            for r in running.iter_mut().filter(|r| r.exit.is_none()) {
                let _ = r.child.kill();
            }
        }
        _ => {}
    }
}

/// Kills every child still running past the deadline and waits for it.
fn kill_late(running: &mut [Running]) {
    for r in running.iter_mut().filter(|r| r.exit.is_none()) {
        let _ = r.child.kill();
        r.killed_by_bench = true;
        if let Ok(status) = r.child.wait() {
            r.exit = Some((status, r.started.elapsed().as_secs_f64() * 1e3));
        }
    }
}

/// The parent's side of the file barrier: n + 1 members meet at `loaded`, then at
/// `measured`. It releases the children once every one has loaded or died (or the wait
/// is stopped), reading MemAvailable while all of them are loaded, and stands in for
/// every child that will never arrive (never started, or died before a stage).
struct Barrier<'a> {
    dir: &'a Path,
    /// The children were started with `--bench-barrier` (else nothing to wait for).
    enabled: bool,
    /// The parent has arrived at both stages.
    released: bool,
    /// Every child reached `loaded` (so far).
    all_reached: bool,
    /// Children that never started.
    never_started: usize,
    /// Stand-in files written so far (their names are numbered).
    stand_ins: usize,
    /// Children already stood in for at `measured`.
    measured_stand_ins: BTreeSet<u32>,
    mem_available_loaded_kb: Option<u64>,
}

impl<'a> Barrier<'a> {
    fn new(dir: &'a Path, enabled: bool, never_started: usize) -> Barrier<'a> {
        Barrier {
            dir,
            enabled,
            released: !enabled,
            all_reached: enabled,
            never_started,
            stand_ins: 0,
            measured_stand_ins: BTreeSet::new(),
            mem_available_loaded_kb: None,
        }
    }

    fn stand_in(&mut self, stage: &str) -> Result<()> {
        self.stand_ins += 1;
        let p = self.dir.join(format!("{stage}.standin{}", self.stand_ins));
        std::fs::write(&p, b"").with_context(|| format!("writing {}", p.display()))
    }

    /// One look at the barrier; `stop`: release it now, whoever is missing.
    fn poll(&mut self, running: &[Running], stop: bool) -> Result<()> {
        if !self.released {
            let loaded = pids_at(self.dir, "loaded");
            let gone_before: Vec<u32> = running
                .iter()
                .filter(|r| r.exit.is_some() && !loaded.contains(&r.pid))
                .map(|r| r.pid)
                .collect();
            let present = running.iter().filter(|r| loaded.contains(&r.pid)).count();
            if present + gone_before.len() >= running.len() || stop {
                if present == running.len() && !stop {
                    self.mem_available_loaded_kb = mem_available_kb();
                } else {
                    self.all_reached = false;
                }
                // Stand in for every child that will never arrive, then arrive ourselves.
                for _ in 0..(self.never_started + gone_before.len()) {
                    self.stand_in("loaded")?;
                    self.stand_in("measured")?;
                }
                self.measured_stand_ins.extend(gone_before);
                self.stand_in("loaded")?;
                self.stand_in("measured")?;
                self.released = true;
            }
        } else if self.enabled {
            // A child that dies between the two stages would hold the others: stand in.
            let measured = pids_at(self.dir, "measured");
            for r in running.iter().filter(|r| r.exit.is_some()) {
                if !measured.contains(&r.pid) && self.measured_stand_ins.insert(r.pid) {
                    self.stand_in("measured")?;
                }
            }
        }
        Ok(())
    }
}

/// Pids of the children that wrote `{stage}.{pid}` in the barrier dir.
fn pids_at(dir: &Path, stage: &str) -> BTreeSet<u32> {
    let prefix = format!("{stage}.");
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix(&prefix)?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn finish(r: Running, timeout: Duration, tail_bytes: u64) -> ChildResult {
    let stderr_tail = tail(&r.stderr_path, tail_bytes);
    let (status, wall_ms) = match r.exit {
        Some(e) => e,
        None => {
            return ChildResult {
                pid: r.pid,
                wall_ms: r.started.elapsed().as_secs_f64() * 1e3,
                stats: Err(Failure {
                    reason: "the child could not be waited for".into(),
                    exit_code: None,
                    signal: None,
                    killed_by_bench: r.killed_by_bench,
                    stderr_tail: stderr_tail.clone(),
                }),
                stderr_tail,
            }
        }
    };
    let failure = |reason: String| Failure {
        reason,
        exit_code: status.code(),
        signal: status.signal(),
        killed_by_bench: r.killed_by_bench,
        stderr_tail: stderr_tail.clone(),
    };
    let stats = if r.killed_by_bench {
        Err(failure(format!(
            "killed by the bench after {:.0} s (--timeout {})",
            wall_ms / 1e3,
            timeout.as_secs()
        )))
    } else if let Some(sig) = status.signal() {
        Err(failure(format!(
            "killed by signal {sig} ({})",
            signal_name(sig)
        )))
    } else if !status.success() {
        Err(failure(format!(
            "exited with status {}",
            status.code().unwrap_or(-1)
        )))
    } else {
        match std::fs::read_to_string(&r.stats_path) {
            Err(e) => Err(failure(format!("exited 0 but wrote no stats ({e})"))),
            Ok(text) => match serde_json::from_str::<Value>(&text) {
                Ok(v) if v.is_object() => Ok(v),
                Ok(_) => Err(failure("its stats are not a JSON object".into())),
                Err(e) => Err(failure(format!("its stats are not valid JSON: {e}"))),
            },
        }
    };
    ChildResult {
        pid: r.pid,
        wall_ms,
        stats,
        stderr_tail,
    }
}

/// The last `max` bytes of a file (from a line start where possible), lossily decoded.
pub fn tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    match (start > 0, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_string(),
        _ => text,
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL: the OOM killer, or killed from outside",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS: the mapped file changed or shrank?",
        libc::SIGABRT => "SIGABRT",
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        let text =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(20_000_000));
        assert_eq!(parse_meminfo(text, "MemTotal"), Some(24_576_000));
        assert_eq!(parse_meminfo(text, "Cached"), None);
        assert!(
            mem_available_kb().is_some(),
            "/proc/meminfo has MemAvailable on Linux"
        );
    }

    #[test]
    fn tail_keeps_the_end_from_a_line_start() {
        let dir = TempDir::new("vkdecode-bench-test").unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "first line\nsecond line\nthird\n").unwrap();
        assert_eq!(tail(&p, 1000), "first line\nsecond line\nthird\n");
        assert_eq!(tail(&p, 14), "third\n");
        assert_eq!(tail(&dir.path().join("missing"), 10), "");
        let kept = dir.path().to_path_buf();
        drop(dir);
        assert!(!kept.exists(), "TempDir removes itself");
    }
}
