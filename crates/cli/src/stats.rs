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
    mem: residency::memstats::MemStats,
    file_resident_bytes: u64,
    file_bytes: u64,
}

impl MemoryReport {
    pub fn read(file_bytes: &[u8]) -> Result<MemoryReport> {
        let mem = match residency::memstats::MemStats::read() {
            Ok(m) => m,
            Err(e) => bail!("reading /proc/self memory figures: {e}"),
        };
        Ok(MemoryReport {
            mem,
            file_resident_bytes: residency::memstats::file_resident_bytes(file_bytes),
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
            "memory: RssAnon {:.1} MiB, RssShmem {:.1} MiB, RssFile {:.1} MiB, Pss {:.1} MiB, peak RSS {:.1} MiB; model file {:.0}% in page cache",
            m.rss_anon_kb as f64 / 1024.0,
            m.rss_shmem_kb as f64 / 1024.0,
            m.rss_file_kb as f64 / 1024.0,
            m.pss_kb as f64 / 1024.0,
            m.vm_hwm_kb as f64 / 1024.0,
            100.0 * self.file_resident_bytes as f64 / self.file_bytes.max(1) as f64
        )
    }
}

/// Prints the per-kernel GPU time of one decode token: kernel, dispatches, ms, share of
/// the token, and for the matvecs the weight bytes read per second, set against the
/// host's read bandwidth measured here (on an iGPU or lavapipe, the same DRAM).
pub fn print_profile(rows: &[engine::KernelTime]) {
    let total_ns: u64 = rows.iter().map(|r| r.ns).sum();
    let share = |ns: u64| 100.0 * ns as f64 / (total_ns.max(1)) as f64;
    let gbs = |g: Option<f64>| g.map_or(String::new(), |g| format!("{g:.1}"));
    errln!(
        "{:<14} {:>10} {:>10} {:>7} {:>8} {:>10}",
        "kernel",
        "dispatches",
        "ms",
        "share",
        "GB/s",
        "weight MB"
    );
    for r in rows {
        let line = format!(
            "{:<14} {:>10} {:>10.3} {:>6.1}% {:>8} {:>10}",
            r.name,
            r.dispatches,
            r.ns as f64 / 1e6,
            share(r.ns),
            gbs(r.gb_per_s()),
            r.bytes
                .map_or(String::new(), |b| format!("{:.1}", b as f64 / 1e6)),
        );
        errln!("{}", line.trim_end());
    }
    let mv: Vec<&engine::KernelTime> = rows.iter().filter(|r| r.bytes.is_some()).collect();
    let mv_ns: u64 = mv.iter().map(|r| r.ns).sum();
    let mv_bytes: u64 = mv.iter().filter_map(|r| r.bytes).sum();
    errln!(
        "{:<14} {:>10} {:>10.3} {:>6.1}%",
        "total",
        rows.iter().map(|r| u64::from(r.dispatches)).sum::<u64>(),
        total_ns as f64 / 1e6,
        share(total_ns),
    );
    if mv_ns > 0 {
        errln!(
            "matvecs: {:.1} MB of weights in {:.3} ms = {:.1} GB/s, {:.0}% of the token",
            mv_bytes as f64 / 1e6,
            mv_ns as f64 / 1e6,
            mv_bytes as f64 / mv_ns as f64,
            share(mv_ns)
        );
    }
    match read_bandwidth_gbs() {
        Some(g) => errln!(
            "machine reads {g:.1} GB/s (measured now: 2 threads summing 128 MiB; docs/facts.md: ~31 GB/s on the CI machine)"
        ),
        None => errln!("machine reads ~31 GB/s (docs/facts.md; measuring here failed)"),
    }
}

/// Host read bandwidth in GB/s: the best of a few passes of two threads summing 64 MiB
/// each. About 0.2 s; `None` if the buffer cannot be allocated or a thread fails.
fn read_bandwidth_gbs() -> Option<f64> {
    const WORDS: usize = 16 << 20; // 128 MiB of u64
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(WORDS).ok()?;
    buf.extend((0..WORDS as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let (a, b) = buf.split_at(WORDS / 2);
    let sum = |half: &[u64]| half.iter().fold(0u64, |s, &v| s.wrapping_add(v));
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let t = std::time::Instant::now();
        let total = std::thread::scope(|s| {
            let h = s.spawn(|| sum(a));
            let mine = sum(b);
            h.join().ok().map(|other| other.wrapping_add(mine))
        })?;
        std::hint::black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some((WORDS * 8) as f64 / best / 1e9)
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
