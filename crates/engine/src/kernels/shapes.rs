//! The kernel profiles (`--kernels auto|cpu|gpu`) and the matmul shapes each runs: one
//! table entry per device class, chosen once from the capabilities record
//! ([`Shapes::for_profile`]), so nothing else in the engine assumes a subgroup or
//! workgroup size.
//!
//! - `cpu` ([`CPU`]): tuned on lavapipe (Mesa's CPU Vulkan) with 8-lane subgroups: 8-lane
//!   workgroups (a workgroup is a CPU work unit there), the column-split decode matvec
//!   (`matmul_split.comp`, which reduces a row with one `subgroupAdd` and so needs each
//!   8-lane workgroup to be exactly one subgroup: [`vk::Capabilities::one_subgroup_of`])
//!   and the prefill GEMM. Where the device does not guarantee that subgroup, the same
//!   workgroups with lanes owning rows and no subgroup operation ([`CPU_ROWS`]).
//! - `gpu` ([`GPU`]): wide workgroups, lanes own rows, no subgroup operation: correct at
//!   any subgroup size the device reports, workgroups within every device's limits.
//! - `auto`: `cpu` on a CPU device, `gpu` on any other (`vkdecode info` says which and
//!   why, in its `kernels:` line).

use std::fmt::Write as _;

use vk::{Capabilities, DeviceType, SubgroupGuarantee};

/// Workgroup shape of one kind of batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    /// Invocations per workgroup.
    pub wg: u32,
    /// Row pairs per invocation.
    pub pairs: u32,
    /// Tokens per invocation (1 or 4: `MATMUL_TB`).
    pub tb: u32,
}

/// The row pairs per invocation [`MatmulShape::balanced_pairs`] chooses from.
pub(crate) const BALANCED_PAIRS: std::ops::RangeInclusive<u32> = 2..=16;

impl MatmulShape {
    /// The row pairs per invocation (in [`BALANCED_PAIRS`]) that finish a one-token
    /// dispatch over views of `rows` rows soonest on a CPU device running its workgroups
    /// on `threads` worker threads, each taking the next workgroup when it is free
    /// (lavapipe). Every workgroup of a dispatch costs the same, rows past a view's end
    /// included (the column split computes them on row 0 and drops them), so the dispatch
    /// takes `ceil(workgroups / threads)` rounds of a workgroup's time, which grows with
    /// its pairs. With 8 pairs, a 576-row matrix on 2 threads is 5 workgroups of 128 rows:
    /// 3 rounds, one of them with a thread idle; with 9 it is 4 of 144 rows, 2 rounds,
    /// a quarter less. Ties keep the shape's own pairs (no extra pipeline), else take the
    /// most pairs (the fewest workgroups: each loads its input chunks once). A row's sum
    /// does not depend on the workgroup that computes it, so neither do the bits of the
    /// output.
    pub(crate) fn balanced_pairs(&self, gated: bool, rows: &[u32], threads: u32) -> u32 {
        if threads < 2 || rows.is_empty() {
            return self.pairs;
        }
        let cost = |pairs: u32| {
            let tile = super::matmul::rows_per_workgroup(self.wg, pairs, gated);
            let groups: u32 = rows.iter().map(|r| r.div_ceil(tile)).sum();
            u64::from(groups.div_ceil(threads)) * u64::from(pairs)
        };
        let best = BALANCED_PAIRS.map(cost).min().unwrap_or(0);
        if cost(self.pairs) == best {
            return self.pairs;
        }
        BALANCED_PAIRS
            .rev()
            .find(|&p| cost(p) == best)
            .unwrap_or(self.pairs)
    }
}

/// One token at a time (decode) vs a batch of prompt tokens (prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    Decode,
    /// Prompt tokens through the entry's GEMM (`matmul_mm.comp`), or its 4-token matvec
    /// shape where it has none.
    Prefill,
    /// Prompt tokens through matmul.comp 4 at a time, where the GEMM cannot run
    /// (`Kernels::prefill_batch`).
    PrefillMatvec,
}

/// The shapes of one device class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shapes {
    /// The entry's name (`lavapipe`, `generic`), printed by `vkdecode info`.
    pub name: &'static str,
    /// One token (decode, and the logits of a prefill).
    pub decode: MatmulShape,
    /// A batch of prompt tokens, through matmul.comp.
    pub prefill: MatmulShape,
    /// A batch of prompt tokens through the GEMM (`matmul_mm.comp`), when the entry has
    /// one (it needs subgroup ballot: [`Kernels::gemm_supported`](super::Kernels::gemm_supported)).
    pub gemm: Option<MatmulShape>,
    /// Lanes of a column-split workgroup (one subgroup), when the entry uses the column
    /// split; `None`: lanes own rows.
    pub split_lanes: Option<u32>,
}

/// The `cpu` profile where 8 lanes are one subgroup (lavapipe at its default vector
/// width). Decode: 8 lanes × 8 row pairs = 128 rows per workgroup (a matrix may take
/// other pairs: `MatmulShape::balanced_pairs`), one token (measured against 4 pairs,
/// alternating runs: 19.2 vs 17.9 tok/s median of 7, Q8_0), two pairs in lockstep
/// (against one: 20.8 vs 18.9 tok/s, median of 5 alternating runs). Prefill: each weight
/// chunk loaded is used for 4 tokens (about 60 against 50 tok/s over a 200-token prompt).
pub const CPU: Shapes = Shapes {
    name: "cpu",
    decode: MatmulShape {
        wg: 8,
        pairs: 8,
        tb: 1,
    },
    prefill: MatmulShape {
        wg: 8,
        pairs: 4,
        tb: 4,
    },
    gemm: Some(super::GEMM_SHAPE),
    split_lanes: Some(8),
};

/// The `cpu` profile where 8 lanes are not guaranteed to be one subgroup (lavapipe at
/// `LP_NATIVE_VECTOR_WIDTH` 128 or 512: subgroups of 4 or 16): [`CPU`]'s workgroups with
/// lanes owning rows, and prefill through matmul.comp 4 tokens at a time, since the
/// column split and the GEMM both share data across one 8-lane subgroup.
pub(crate) const CPU_ROWS: Shapes = Shapes {
    name: "cpu-rows",
    gemm: None,
    split_lanes: None,
    ..CPU
};

/// The `gpu` profile: 64-lane workgroups (a multiple of every common subgroup size and
/// within the 128 invocations every Vulkan device allows), two row pairs per lane (the
/// pairs `matmul.comp` runs in lockstep; one would leave half its work unstored), 256
/// rows per workgroup, no subgroup operations.
pub const GPU: Shapes = Shapes {
    name: "gpu",
    decode: MatmulShape {
        wg: 64,
        pairs: 2,
        tb: 1,
    },
    prefill: MatmulShape {
        wg: 64,
        pairs: 2,
        tb: 4,
    },
    gemm: None,
    split_lanes: None,
};

/// Which kernel set to run (`--kernels`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelProfile {
    /// By device type: [`KernelProfile::Cpu`] on a CPU device, else [`KernelProfile::Gpu`].
    #[default]
    Auto,
    /// Shaped for a CPU device (lavapipe): [`CPU`], or `CPU_ROWS`.
    Cpu,
    /// Shaped for a GPU: [`GPU`].
    Gpu,
}

impl KernelProfile {
    /// `auto`, `cpu` or `gpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelProfile::Auto => "auto",
            KernelProfile::Cpu => "cpu",
            KernelProfile::Gpu => "gpu",
        }
    }

    /// From its name (`auto`, `cpu`, `gpu`).
    pub fn parse(s: &str) -> Result<KernelProfile, String> {
        match s.trim() {
            "auto" => Ok(KernelProfile::Auto),
            "cpu" => Ok(KernelProfile::Cpu),
            "gpu" => Ok(KernelProfile::Gpu),
            other => Err(format!("kernels `{other}`: expected auto, cpu or gpu")),
        }
    }
}

/// The profile a device runs and why ([`Shapes::for_profile`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileChoice {
    /// [`KernelProfile::Cpu`] or [`KernelProfile::Gpu`], never `Auto`.
    pub profile: KernelProfile,
    /// Its shapes on this device.
    pub shapes: Shapes,
    /// Why: what `auto` looked at, and why the entry (`vkdecode info`'s `kernels:` line).
    pub why: String,
}

impl Shapes {
    /// Whether this entry fits the device: its workgroups within the limits, and where it
    /// splits columns, a device that guarantees one subgroup per workgroup of that many
    /// lanes.
    pub fn fits(&self, caps: &Capabilities) -> bool {
        let wg_ok = |s: &MatmulShape| {
            s.wg <= caps.max_compute_work_group_size[0]
                && s.wg <= caps.max_compute_work_group_invocations
        };
        if !wg_ok(&self.decode) || !wg_ok(&self.prefill) || !self.gemm.as_ref().is_none_or(wg_ok) {
            return false;
        }
        self.split_lanes
            .is_none_or(|lanes| caps.one_subgroup_of(lanes).is_some())
    }

    /// The profile and shapes `profile` means on a device, and why. `auto` takes `cpu` on
    /// a CPU device and `gpu` on any other; `cpu` is [`CPU`] where 8 lanes are one
    /// subgroup, else `CPU_ROWS`, and [`GPU`] where neither fits (a device below
    /// Vulkan's minimum limits).
    pub fn for_profile(caps: &Capabilities, profile: KernelProfile) -> ProfileChoice {
        let (profile, mut why) = match profile {
            KernelProfile::Auto if caps.device_type == DeviceType::Cpu => {
                (KernelProfile::Cpu, "auto: a CPU device".to_string())
            }
            KernelProfile::Auto => (
                KernelProfile::Gpu,
                format!("auto: a {} GPU", caps.device_type.as_str()),
            ),
            p => (p, "asked for".to_string()),
        };
        let shapes = match profile {
            KernelProfile::Cpu if CPU.fits(caps) => {
                why.push_str("; 8 lanes are one subgroup: column-split decode, prefill GEMM");
                CPU
            }
            KernelProfile::Cpu if CPU_ROWS.fits(caps) => {
                let _ = write!(
                    why,
                    "; subgroups of {} lanes, 8 not guaranteed: lanes own rows, no GEMM",
                    caps.subgroup_size
                );
                CPU_ROWS
            }
            _ => {
                let _ = write!(
                    why,
                    "; {}-lane workgroups, lanes own rows, any subgroup size",
                    GPU.decode.wg
                );
                GPU
            }
        };
        ProfileChoice {
            profile,
            shapes,
            why,
        }
    }

    /// The shape of a batch kind (`last_token_only` matmuls of a prefill, the logits,
    /// run the decode shape).
    pub fn of(&self, batch: Batch, last_token_only: bool) -> MatmulShape {
        match batch {
            Batch::Prefill if !last_token_only => self.gemm.unwrap_or(self.prefill),
            Batch::PrefillMatvec if !last_token_only => self.prefill,
            _ => self.decode,
        }
    }

    /// How the column split's workgroups are made one subgroup on this device (`None`:
    /// the entry does not split).
    pub fn split_guarantee(&self, caps: &Capabilities) -> Option<SubgroupGuarantee> {
        self.split_lanes.and_then(|l| caps.one_subgroup_of(l))
    }
}

#[cfg(test)]
mod tests {
    use super::super::matmul::rows_per_workgroup;
    use super::*;
    use vk::SubgroupSizeControl;

    fn cpu(subgroup: u32, control: Option<SubgroupSizeControl>) -> Capabilities {
        Capabilities {
            device_type: DeviceType::Cpu,
            subgroup_size: subgroup,
            subgroup_in_compute: true,
            subgroup_operations: vec!["basic", "arithmetic"],
            subgroup_size_control: control,
            max_compute_work_group_size: [1024, 1024, 64],
            max_compute_work_group_invocations: 1024,
            ..Capabilities::default()
        }
    }

    fn control(min: u32, max: u32, required: bool) -> Option<SubgroupSizeControl> {
        Some(SubgroupSizeControl {
            min,
            max,
            max_compute_workgroup_subgroups: 32,
            required_in_compute: required,
            feature: true,
            full_subgroups: true,
        })
    }

    fn shapes(caps: &Capabilities, p: KernelProfile) -> Shapes {
        Shapes::for_profile(caps, p).shapes
    }

    /// lavapipe at its three vector widths (subgroups of 4, 8, 16, fixed): the `cpu`
    /// profile splits columns only at 8; a device that can be asked for 8 lanes splits
    /// too. `auto` is `cpu` on a CPU device.
    #[test]
    fn the_column_split_needs_a_guaranteed_8_lane_subgroup() {
        let auto = KernelProfile::Auto;
        let choice = Shapes::for_profile(&cpu(8, None), auto);
        assert_eq!(choice.profile, KernelProfile::Cpu);
        assert_eq!(choice.shapes, CPU);
        assert!(
            choice.why.starts_with("auto: a CPU device"),
            "{}",
            choice.why
        );
        assert_eq!(shapes(&cpu(8, control(8, 8, true)), auto), CPU);
        assert_eq!(shapes(&cpu(4, control(4, 4, true)), auto), CPU_ROWS);
        assert_eq!(shapes(&cpu(16, control(16, 16, true)), auto), CPU_ROWS);
        assert_eq!(shapes(&cpu(16, None), auto), CPU_ROWS);
        let why = Shapes::for_profile(&cpu(16, None), auto).why;
        assert!(why.contains("subgroups of 16 lanes"), "{why}");
        // a range including 8, requirable in compute
        let c = cpu(16, control(4, 16, true));
        assert_eq!(shapes(&c, auto), CPU);
        assert_eq!(c.one_subgroup_of(8), Some(SubgroupGuarantee::Required));
        // the same range, but compute may not require a size: not guaranteed
        assert_eq!(shapes(&cpu(16, control(4, 16, false)), auto), CPU_ROWS);
        // a varying size that happens to default to 8 is not a guarantee
        assert_eq!(shapes(&cpu(8, control(4, 16, false)), auto), CPU_ROWS);
        // no subgroup arithmetic
        let mut c = cpu(8, None);
        c.subgroup_operations = vec!["basic"];
        assert_eq!(shapes(&c, auto), CPU_ROWS);
        // forced
        let forced = Shapes::for_profile(&cpu(8, None), KernelProfile::Gpu);
        assert_eq!((forced.profile, forced.shapes), (KernelProfile::Gpu, GPU));
        assert!(forced.why.starts_with("asked for"), "{}", forced.why);
    }

    /// A GPU gets the `gpu` profile under `auto`, whatever its subgroups; `cpu` may be
    /// forced on it (split where it can ask for 8 lanes); limits below an entry's
    /// workgroups rule it out.
    #[test]
    fn gpus_get_the_gpu_profile() {
        let mut gpu = cpu(8, control(8, 32, true));
        gpu.device_type = DeviceType::Integrated;
        let choice = Shapes::for_profile(&gpu, KernelProfile::Auto);
        assert_eq!((choice.profile, choice.shapes), (KernelProfile::Gpu, GPU));
        assert!(
            choice.why.starts_with("auto: a integrated GPU"),
            "{}",
            choice.why
        );
        assert_eq!(shapes(&gpu, KernelProfile::Cpu), CPU);
        let mut small = cpu(8, None);
        small.max_compute_work_group_size = [4, 4, 4];
        assert!(!CPU.fits(&small) && !CPU_ROWS.fits(&small) && !GPU.fits(&small));
        assert_eq!(shapes(&small, KernelProfile::Cpu), GPU);
    }

    #[test]
    fn profiles_parse_from_their_names() {
        for p in [KernelProfile::Auto, KernelProfile::Cpu, KernelProfile::Gpu] {
            assert_eq!(KernelProfile::parse(p.as_str()), Ok(p));
        }
        let e = KernelProfile::parse("fast").unwrap_err();
        assert!(e.contains("auto, cpu or gpu"), "{e}");
    }

    /// SmolLM2's and Gemma 3's one-token matmuls on lavapipe's 2 threads (this machine),
    /// and on 16.
    #[test]
    fn pairs_balance_the_workgroups_over_the_threads() {
        let d = CPU.decode;
        // q, k, v in one dispatch: 5 + 2 + 2 workgroups of 128 rows (5 rounds) against
        // 6 + 2 + 2 of 96 (5 rounds of three quarters the time)
        assert_eq!(d.balanced_pairs(false, &[576, 192, 192], 2), 6);
        // attn_output and ffn_down (576 rows): 4 workgroups of 144 rows
        assert_eq!(d.balanced_pairs(false, &[576], 2), 9);
        // Gemma's (640 rows): 4 of 160
        assert_eq!(d.balanced_pairs(false, &[640], 2), 10);
        // gate/up, 1536 rows of 64 per workgroup: 24 workgroups already even
        assert_eq!(d.balanced_pairs(true, &[1536], 2), 8);
        // the logits: 384 workgroups
        assert_eq!(d.balanced_pairs(false, &[49152], 2), 8);
        // one thread, or nothing to balance: the shape's own
        assert_eq!(d.balanced_pairs(false, &[576], 1), 8);
        assert_eq!(d.balanced_pairs(false, &[], 2), 8);
        // 16 threads: 12 workgroups of 48 rows run in one round
        assert_eq!(d.balanced_pairs(false, &[576], 16), 3);
        for rows in [1u32, 7, 64, 100, 576, 640, 1000, 4096, 49152] {
            for threads in [2u32, 3, 4, 8, 16] {
                for gated in [false, true] {
                    let p = d.balanced_pairs(gated, &[rows], threads);
                    assert!(BALANCED_PAIRS.contains(&p) || p == d.pairs);
                    let rounds = |p: u32| {
                        u64::from(
                            rows.div_ceil(rows_per_workgroup(d.wg, p, gated))
                                .div_ceil(threads),
                        ) * u64::from(p)
                    };
                    // never slower than the shape's own in this cost
                    assert!(
                        rounds(p) <= rounds(d.pairs),
                        "{rows} rows, {threads} threads"
                    );
                }
            }
        }
    }

    #[test]
    fn batch_kinds_map_to_their_shapes() {
        assert_eq!(CPU.of(Batch::Prefill, false), super::super::GEMM_SHAPE);
        assert_eq!(CPU.of(Batch::PrefillMatvec, false), CPU.prefill);
        assert_eq!(CPU.of(Batch::Prefill, true), CPU.decode);
        assert_eq!(CPU_ROWS.of(Batch::Prefill, false), CPU.prefill);
        assert_eq!(GPU.of(Batch::Decode, false), GPU.decode);
    }
}
