//! The process's memory split (Linux): what proves that imported weights are not copied.
//!
//! `RssAnon`, `RssFile`, `RssShmem`, `VmHWM` come from `/proc/self/status`; `Pss`,
//! `Private_Clean`, `Private_Dirty`, `Shared_Clean` from `/proc/self/smaps_rollup`
//! (proc(5)). Page-cache residency of a mapping comes from `mincore(2)`.
#![forbid(unsafe_code)]

use serde::Serialize;

/// One sample of the process's memory, all in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemStats {
    /// Anonymous resident memory (heap, device buffers on CPU drivers, copies).
    pub rss_anon_kb: u64,
    /// File-backed resident memory (mapped pages of files, e.g. the model).
    pub rss_file_kb: u64,
    /// Shared-memory resident pages.
    pub rss_shmem_kb: u64,
    /// Proportional set size.
    pub pss_kb: u64,
    /// Private clean pages.
    pub private_clean_kb: u64,
    /// Private dirty pages.
    pub private_dirty_kb: u64,
    /// Shared clean pages.
    pub shared_clean_kb: u64,
    /// Peak resident set size.
    pub vm_hwm_kb: u64,
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

impl MemStats {
    /// Reads `/proc/self/status` and `/proc/self/smaps_rollup` (fields a kernel lacks are 0).
    pub fn read() -> std::io::Result<MemStats> {
        let status = std::fs::read_to_string("/proc/self/status")?;
        // smaps_rollup exists since Linux 4.14; without it the rollup fields stay 0.
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        Ok(MemStats::parse(&status, &rollup))
    }

    /// Private memory the process holds beyond file pages: `RssAnon + RssShmem`. Where a
    /// driver keeps device memory differs by version (Mesa 22's lavapipe allocates it
    /// anonymously, Mesa 25's from a memfd, which the kernel counts as shared memory), so
    /// a copy of the weights is measured as the sum of the two.
    pub fn private_kb(&self) -> u64 {
        self.rss_anon_kb + self.rss_shmem_kb
    }

    /// Parses the two files' contents (separate for tests).
    pub fn parse(status: &str, smaps_rollup: &str) -> MemStats {
        let s = |k| field(status, k).unwrap_or(0);
        let r = |k| field(smaps_rollup, k).unwrap_or(0);
        MemStats {
            rss_anon_kb: s("RssAnon"),
            rss_file_kb: s("RssFile"),
            rss_shmem_kb: s("RssShmem"),
            vm_hwm_kb: s("VmHWM"),
            pss_kb: r("Pss"),
            private_clean_kb: r("Private_Clean"),
            private_dirty_kb: r("Private_Dirty"),
            shared_clean_kb: r("Shared_Clean"),
        }
    }
}

/// Bytes of `map` (a live mapping, e.g. the model file) resident in memory, by `mincore`.
/// Returns 0 if the kernel refuses the query.
pub fn file_resident_bytes(map: &[u8]) -> u64 {
    crate::sys::resident_bytes(map).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_fields() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nRssAnon:\t  1000 kB\nRssFile:\t  300 kB\nRssShmem:\t 7 kB\n";
        let rollup = "00400000-7fff [rollup]\nRss: 1 kB\nPss:  900 kB\nPss_Anon: 1 kB\nShared_Clean: 20 kB\nPrivate_Clean: 30 kB\nPrivate_Dirty: 40 kB\n";
        let m = MemStats::parse(status, rollup);
        assert_eq!(
            m,
            MemStats {
                rss_anon_kb: 1000,
                rss_file_kb: 300,
                rss_shmem_kb: 7,
                pss_kb: 900,
                private_clean_kb: 30,
                private_dirty_kb: 40,
                shared_clean_kb: 20,
                vm_hwm_kb: 2048,
            }
        );
    }

    #[test]
    fn reads_this_process() {
        let m = MemStats::read().unwrap();
        assert!(m.rss_anon_kb > 0 && m.vm_hwm_kb > 0, "{m:?}");
    }

    #[test]
    fn touched_pages_are_resident() {
        let v = vec![1u8; 1 << 20];
        assert!(file_resident_bytes(&v) >= (1 << 20) - 8192);
        assert_eq!(file_resident_bytes(&[]), 0);
    }
}
