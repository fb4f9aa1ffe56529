//! `vkdecode bench --profile`: after the A/B, one more child per mode with `--profile`,
//! and the per-kernel tables it prints (the last prefill chunk, then a decode token).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::child::{self, GroupSpec};
use super::{child_args, Bench};

/// `--profile`: one more child per distinct mode with `--profile`, its table printed.
pub fn run(bench: &Bench, exe: &Path, ids: &str, tmp: &Path) -> Result<()> {
    for arm in bench.arms.iter().filter(|a| !a.sync_each_layer) {
        let dir = tmp.join(format!("profile-{}", arm.name));
        std::fs::create_dir_all(&dir)?;
        let mut args = child_args(&bench.args, arm, ids);
        args.push("--profile".into());
        let spec = GroupSpec {
            exe,
            args,
            n: 1,
            barrier: false,
            timeout: Duration::from_secs(bench.args.timeout),
            dir: &dir,
            // The profile table has a row per kernel and layer.
            stderr_tail_bytes: 1 << 20,
        };
        // SIGTERM and SIGHUP still reach the child (run_group passes them on)
        let result = child::run_group(&spec, &|| false)?;
        outln!(
            "\nper-kernel GPU time of the last prefill chunk and of one decode token, {}:",
            arm.name
        );
        for c in &result.children {
            match &c.stats {
                Ok(_) => {
                    let table = profile_tables(&c.stderr_tail);
                    if table.is_empty() {
                        outln!("(the run printed no profile)\n{}", c.stderr_tail.trim_end());
                    } else {
                        outln!("{}", table.join("\n"));
                    }
                }
                Err(f) => outln!(
                    "the profile run failed: {}\n{}",
                    f.reason,
                    f.stderr_tail.trim_end()
                ),
            }
        }
    }
    Ok(())
}

/// The profile tables a `--profile` run prints at its end: from its first `profile:`
/// title (prefill chunk, then decode token), or from the first `kernel` header.
fn profile_tables(stderr: &str) -> Vec<&str> {
    let from = |p: &'static str| -> Vec<&str> {
        stderr
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(p))
            .collect()
    };
    let titled = from("profile:");
    if titled.is_empty() {
        from("kernel")
    } else {
        titled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_tables_start_at_the_first_title() {
        let err = "load\nprofile: the last prefill chunk (6 tokens)\nkernel a\nprofile: one decode token\nkernel b\n";
        assert_eq!(
            profile_tables(err),
            [
                "profile: the last prefill chunk (6 tokens)",
                "kernel a",
                "profile: one decode token",
                "kernel b"
            ]
        );
        assert_eq!(profile_tables("x\nkernel b\ntotal"), ["kernel b", "total"]);
    }
}
