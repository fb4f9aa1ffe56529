//! The summary as a plain-text table on stdout: per arm median [min..max] of every
//! figure, then the pairwise ratios and the headline pair's pairwise difference.

use super::json::first_stat;
use super::report::{ProcsSummary, Summary, FIGURES, GROUP_FIGURES};
use super::Bench;

/// The summary as a plain-text table.
pub fn table(b: &Bench, s: &Summary) -> String {
    let mut out = preamble(b);
    for p in &s.by_procs {
        out.push('\n');
        if b.grouped {
            out.push_str(&format!(
                "--procs {}: {} decoders at once per arm\n",
                p.n, p.n
            ));
        }
        out.push_str(&aligned(&rows(b, p)));
    }
    out.push_str(
        "a/b and a-b columns: medians of pairwise ratios and differences (repetition i of one arm against repetition i of the other)\n",
    );
    out
}

/// What was measured: the model, the device, each arm's weights path, the schedule.
fn preamble(b: &Bench) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "model {} ({:.1} MB, tensor alignment {}), device {}, driver {}, backend {}\n",
        b.model.display(),
        b.file_size as f64 / 1e6,
        b.alignment,
        first_stat(b, None, &["device"]).as_str().unwrap_or("?"),
        first_stat(b, None, &["driver", "driver_info", "driver_name"])
            .as_str()
            .unwrap_or("?"),
        first_stat(b, None, &["backend"]).as_str().unwrap_or("?"),
    ));
    for (i, a) in b.arms.iter().enumerate() {
        out.push_str(&format!(
            "  {}: weights path {}\n",
            a.name,
            first_stat(b, Some(i), &["weights_path"])
                .as_str()
                .unwrap_or("?")
        ));
    }
    out.push_str(&format!(
        "{} repetition(s) per arm, arms alternating, prompt {} tokens, decode {} tokens, {}\n",
        b.args.repetitions,
        b.args.prompt_tokens,
        b.args.decode_tokens,
        if b.args.cold {
            "cold: file evicted from the page cache before each run"
        } else {
            "warm page cache"
        }
    ));
    out
}

/// One group's cells: a header, a row per figure that any arm has, the failures.
fn rows(b: &Bench, p: &ProcsSummary) -> Vec<Vec<String>> {
    let mut header = vec!["figure (median [min..max])".to_string()];
    header.extend(b.arms.iter().map(|a| a.name.clone()));
    header.extend(
        p.ratios
            .iter()
            .map(|(a, d, _)| format!("{}/{}", b.arms[*a].name, b.arms[*d].name)),
    );
    // The headline pair also gets its difference (memory claims are differences).
    let diff = p.differences.first();
    if let Some((a, d, _)) = diff {
        header.push(format!("{}-{}", b.arms[*a].name, b.arms[*d].name));
    }
    let mut rows = vec![header];
    let figures = FIGURES
        .iter()
        .chain(GROUP_FIGURES.iter().filter(|_| b.grouped));
    for f in figures {
        let label = if b.grouped && f.key == "decode_tok_s" {
            "decode tok/s per process"
        } else {
            f.label
        };
        let mut row = vec![label.to_string()];
        for arm in &p.arms {
            row.push(match arm.get(f.key) {
                Some(sp) if sp.n > 1 => format!(
                    "{} [{}..{}]",
                    f.unit.show(sp.median),
                    f.unit.show(sp.min),
                    f.unit.show(sp.max)
                ),
                Some(sp) => f.unit.show(sp.median),
                None => "-".into(),
            });
        }
        for (_, _, figs) in &p.ratios {
            row.push(
                figs.get(f.key)
                    .map_or("-".into(), |r| format!("{:.3}", r.median)),
            );
        }
        if let Some((_, _, figs)) = diff {
            row.push(
                figs.get(f.key)
                    .map_or("-".into(), |r| f.unit.show(r.median)),
            );
        }
        if row[1..].iter().any(|c| c != "-") {
            rows.push(row);
        }
    }
    let mut row = vec!["failed runs (killed)".to_string()];
    for (failed, killed) in &p.failures {
        row.push(format!("{failed} ({killed})"));
    }
    row.extend(p.ratios.iter().map(|_| String::new()));
    row.extend(diff.map(|_| String::new()));
    rows.push(row);
    rows
}

/// The cells as columns: the first left-aligned, the rest right-aligned, a rule under
/// the header.
fn aligned(rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c == 0 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    out
}
