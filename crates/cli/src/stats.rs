//! Figures the binary reports: sizes given on the command line, the process's memory
//! split, and the per-kernel profile table.

use anyhow::{bail, Result};
use serde_json::{json, Value};

/// Parses `1048576`, `64KiB`, `1MiB`, `2GiB` (also `K`, `M`, `G`, `KB`, `MB`, `GB` as
/// binary units, as llama.cpp users write them).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 1048576, 64KiB, 256MiB, 2GiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size {s:?} is zero or too large"))
}

/// The process's memory split and the model file's page-cache residency.
pub struct MemoryReport {
    mem: engine::memstats::MemStats,
    file_resident_bytes: u64,
    file_bytes: u64,
}

impl MemoryReport {
    pub fn read(file_bytes: &[u8]) -> Result<MemoryReport> {
        let mem = match engine::memstats::MemStats::read() {
            Ok(m) => m,
            Err(e) => bail!("reading /proc/self memory figures: {e}"),
        };
        Ok(MemoryReport {
            mem,
            file_resident_bytes: engine::memstats::file_resident_bytes(file_bytes),
            file_bytes: file_bytes.len() as u64,
        })
    }

    pub fn add_to(&self, stats: &mut Value) {
        let m = &self.mem;
        for (k, v) in [
            ("rss_anon_kb", m.rss_anon_kb),
            ("rss_file_kb", m.rss_file_kb),
            ("rss_shmem_kb", m.rss_shmem_kb),
            ("pss_kb", m.pss_kb),
            ("private_clean_kb", m.private_clean_kb),
            ("private_dirty_kb", m.private_dirty_kb),
            ("shared_clean_kb", m.shared_clean_kb),
            ("vm_hwm_kb", m.vm_hwm_kb),
            ("file_resident_bytes", self.file_resident_bytes),
        ] {
            stats[k] = json!(v);
        }
    }

    pub fn summary(&self) -> String {
        let m = &self.mem;
        format!(
            "memory: RssAnon {:.1} MiB, RssFile {:.1} MiB, Pss {:.1} MiB, peak RSS {:.1} MiB; model file {:.0}% in page cache",
            m.rss_anon_kb as f64 / 1024.0,
            m.rss_file_kb as f64 / 1024.0,
            m.pss_kb as f64 / 1024.0,
            m.vm_hwm_kb as f64 / 1024.0,
            100.0 * self.file_resident_bytes as f64 / self.file_bytes.max(1) as f64
        )
    }
}

/// Prints the per-kernel GPU time of one decode token.
pub fn print_profile(rows: &[engine::KernelTime]) {
    let total: f64 = rows.iter().map(|r| r.ns as f64 / 1e6).sum();
    eprintln!("{:<28} {:>10} {:>8}", "kernel", "ms", "share");
    for r in rows {
        let ms = r.ns as f64 / 1e6;
        eprintln!(
            "{:<28} {:>10.3} {:>7.1}%",
            r.name,
            ms,
            100.0 * ms / total.max(1e-12)
        );
    }
    eprintln!("{:<28} {:>10.3}", "total", total);
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("3G"), Ok(3 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
