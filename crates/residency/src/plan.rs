//! The shard planner: a pure function from tensor ranges and device limits to
//! page-aligned import windows ("shards") and per-tensor bindings.
//!
//! Rules: every shard starts and ends on the import alignment and is no
//! larger than the cap; every tensor, or for a tensor too large for one shard or one
//! binding, every row range of it, lies wholly inside one shard (shards may overlap);
//! every bound offset is a multiple of `minStorageBufferOffsetAlignment` with the rest
//! given to the kernel as `byte_offset` (a multiple of 4); no binding exceeds
//! `maxStorageBufferRange`. Shards ending past the mapping's last page are flagged
//! `past_mapping`: they must not be imported from the file (lavapipe accepts such an
//! import and the first read kills the process).
#![forbid(unsafe_code)]

use serde::Serialize;

/// Why a layout cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Alignment is not a power of two (or is 0).
    #[error("alignment {0} is not a power of two")]
    BadAlignment(u64),
    /// `minStorageBufferOffsetAlignment` is not a power of two.
    #[error("minStorageBufferOffsetAlignment {0} is not a power of two")]
    BadOffsetAlignment(u64),
    /// The cap is smaller than one aligned page.
    #[error("allocation cap {cap} is smaller than the import alignment {align}")]
    CapTooSmall {
        /// Cap.
        cap: u64,
        /// Alignment.
        align: u64,
    },
    /// A tensor lies outside the file.
    #[error("tensor {index} ({offset}+{bytes}) lies outside the file of {file_len} bytes")]
    OutOfFile {
        /// Tensor index.
        index: usize,
        /// Absolute offset.
        offset: u64,
        /// Bytes.
        bytes: u64,
        /// File length.
        file_len: u64,
    },
    /// A tensor does not start on a 4-byte boundary (kernels read u32 words).
    #[error("tensor {index} starts at {offset}, not a multiple of 4")]
    Unaligned {
        /// Tensor index.
        index: usize,
        /// Absolute offset.
        offset: u64,
    },
    /// A tensor's size is not whole rows.
    #[error("tensor {index}: {bytes} bytes is not a whole number of {row_bytes}-byte rows")]
    Rows {
        /// Tensor index.
        index: usize,
        /// Bytes.
        bytes: u64,
        /// Row bytes.
        row_bytes: u64,
    },
    /// Even the smallest legal row range does not fit the cap or binding range.
    #[error("tensor {index}: rows of {row_bytes} bytes cannot fit a shard of {cap} bytes / binding of {max_range} bytes")]
    RowTooLarge {
        /// Tensor index.
        index: usize,
        /// Row bytes.
        row_bytes: u64,
        /// Cap.
        cap: u64,
        /// Binding range.
        max_range: u64,
    },
}

/// One import window of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shard {
    /// Absolute file offset (multiple of the alignment).
    pub start: u64,
    /// Length (multiple of the alignment, at most the cap).
    pub len: u64,
    /// The shard ends past the mapping's last page: import it from anonymous memory.
    pub past_mapping: bool,
}

/// One bindable piece of a tensor inside a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Index into [`ShardPlan::shards`].
    pub shard: usize,
    /// Binding offset inside the shard (multiple of the offset alignment).
    pub bind_offset: u64,
    /// Binding range (≤ max range; covers the piece rounded up to 4 bytes).
    pub range: u64,
    /// Where the piece starts inside the binding (multiple of 4).
    pub byte_offset: u64,
    /// First row of the tensor in this piece.
    pub first_row: u64,
    /// Rows in this piece.
    pub n_rows: u64,
}

/// The result of [`plan_shards`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardPlan {
    /// Import alignment used.
    pub align: u64,
    /// Effective cap (rounded down to the alignment).
    pub cap: u64,
    /// Shards in file order.
    pub shards: Vec<Shard>,
    /// Per input tensor, its pieces in row order (empty for a 0-byte tensor).
    pub placements: Vec<Vec<Placement>>,
}

impl ShardPlan {
    /// Sum of shard lengths (what import maps / copy allocates).
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.len).sum()
    }
}

fn round_down(x: u64, a: u64) -> u64 {
    x / a * a
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

struct Piece {
    tensor: usize,
    start: u64,
    bytes: u64,
    first_row: u64,
    n_rows: u64,
}

/// Cuts the file into import shards and places every tensor (or row range) in one.
///
/// `tensors`: `(absolute file offset, bytes, row bytes)`; `file_len`: the file's size;
/// `mapping_len`: bytes accessible through the mapping (the file rounded up to whole
/// system pages); `align`: `minImportedHostPointerAlignment`; `cap`: the per-allocation
/// cap; `max_range`: `maxStorageBufferRange`; `min_offset_align`:
/// `minStorageBufferOffsetAlignment`.
pub fn plan_shards(
    tensors: &[(u64, u64, u64)],
    file_len: u64,
    mapping_len: u64,
    align: u64,
    cap: u64,
    max_range: u64,
    min_offset_align: u64,
) -> Result<ShardPlan, PlanError> {
    if align == 0 || !align.is_power_of_two() {
        return Err(PlanError::BadAlignment(align));
    }
    if min_offset_align == 0 || !min_offset_align.is_power_of_two() {
        return Err(PlanError::BadOffsetAlignment(min_offset_align));
    }
    let cap_eff = round_down(cap, align);
    if cap_eff < align {
        return Err(PlanError::CapTooSmall { cap, align });
    }
    // Bindings start on a multiple of both the offset alignment and 4, so the
    // residual byte offset stays a multiple of 4.
    let bind_align = min_offset_align.max(4);
    let mut pieces = Vec::new();
    for (index, &(offset, bytes, row_bytes)) in tensors.iter().enumerate() {
        if offset.checked_add(bytes).is_none_or(|e| e > file_len) {
            return Err(PlanError::OutOfFile {
                index,
                offset,
                bytes,
                file_len,
            });
        }
        if !offset.is_multiple_of(4) {
            return Err(PlanError::Unaligned { index, offset });
        }
        if bytes == 0 {
            continue;
        }
        if row_bytes == 0 || !bytes.is_multiple_of(row_bytes) {
            return Err(PlanError::Rows {
                index,
                bytes,
                row_bytes,
            });
        }
        let n_rows = bytes / row_bytes;
        let span = round_up(offset + bytes, align) - round_down(offset, align);
        let range = round_up(bytes, 4) + bind_align;
        if span <= cap_eff && range <= max_range {
            pieces.push(Piece {
                tensor: index,
                start: offset,
                bytes,
                first_row: 0,
                n_rows,
            });
            continue;
        }
        // Row ranges: each piece starts on a 4-byte boundary (rows per piece a multiple
        // of `step`) and, where two rows fit, on an even row (the matmul kernels write
        // rows in pairs, and a pair of key or value rows is one word of the f16 KV
        // cache), and fits a shard (worst case: 2 pages of slack) and a binding.
        let step = 4 / gcd(row_bytes, 4);
        let budget_shard = cap_eff.saturating_sub(2 * align);
        let budget_bind = max_range.saturating_sub(bind_align + 4);
        let budget = budget_shard.min(budget_bind);
        let even = step.max(2);
        let rows = match budget / row_bytes / even * even {
            0 => budget / row_bytes / step * step,
            rows => rows,
        };
        if rows == 0 {
            return Err(PlanError::RowTooLarge {
                index,
                row_bytes,
                cap: cap_eff,
                max_range,
            });
        }
        let mut r = 0;
        while r < n_rows {
            let n = rows.min(n_rows - r);
            pieces.push(Piece {
                tensor: index,
                start: offset + r * row_bytes,
                bytes: n * row_bytes,
                first_row: r,
                n_rows: n,
            });
            r += n;
        }
    }
    pieces.sort_by_key(|p| (p.start, p.bytes));

    let mut shards: Vec<Shard> = Vec::new();
    let mut placements: Vec<Vec<Placement>> = vec![Vec::new(); tensors.len()];
    let mut placed: Vec<(usize, usize)> = Vec::with_capacity(pieces.len()); // (piece, shard)
    for (pi, p) in pieces.iter().enumerate() {
        let lo = round_down(p.start, align);
        let hi = round_up(round_up(p.start + p.bytes, 4), align);
        let fits_current = shards
            .last()
            .is_some_and(|s| lo >= s.start && hi.max(s.start + s.len) - s.start <= cap_eff);
        if fits_current {
            let s = shards.last_mut().expect("checked above");
            s.len = hi.max(s.start + s.len) - s.start;
        } else {
            shards.push(Shard {
                start: lo,
                len: hi - lo,
                past_mapping: false,
            });
        }
        placed.push((pi, shards.len() - 1));
    }
    for s in &mut shards {
        s.past_mapping = s.start + s.len > mapping_len;
    }
    for (pi, si) in placed {
        let p = &pieces[pi];
        let s = &shards[si];
        let rel = p.start - s.start;
        let bind_offset = round_down(rel, bind_align);
        let byte_offset = rel - bind_offset;
        let range = round_up(byte_offset + p.bytes, 4);
        placements[p.tensor].push(Placement {
            shard: si,
            bind_offset,
            range,
            byte_offset,
            first_row: p.first_row,
            n_rows: p.n_rows,
        });
    }
    for pl in &mut placements {
        pl.sort_by_key(|x| x.first_row);
    }
    Ok(ShardPlan {
        align,
        cap: cap_eff,
        shards,
        placements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;

    /// Checks every invariant of a plan against its inputs; panics with the broken one.
    fn check(
        plan: &ShardPlan,
        tensors: &[(u64, u64, u64)],
        mapping_len: u64,
        max_range: u64,
        moa: u64,
    ) {
        let a = plan.align;
        for (i, s) in plan.shards.iter().enumerate() {
            assert_eq!(s.start % a, 0, "shard {i} start");
            assert_eq!(s.len % a, 0, "shard {i} len");
            assert!(
                s.len > 0 && s.len <= plan.cap,
                "shard {i} len {} cap {}",
                s.len,
                plan.cap
            );
            assert_eq!(
                s.past_mapping,
                s.start + s.len > mapping_len,
                "shard {i} past_mapping"
            );
        }
        for (t, &(off, bytes, row_bytes)) in tensors.iter().enumerate() {
            let parts = &plan.placements[t];
            if bytes == 0 {
                assert!(parts.is_empty());
                continue;
            }
            let mut next_row = 0;
            for p in parts {
                let s = &plan.shards[p.shard];
                assert_eq!(p.first_row, next_row, "tensor {t}: rows contiguous");
                next_row += p.n_rows;
                assert_eq!(p.bind_offset % moa, 0, "tensor {t}: bind offset alignment");
                assert_eq!(p.byte_offset % 4, 0, "tensor {t}: byte offset");
                assert!(
                    p.range <= max_range,
                    "tensor {t}: range {} > {max_range}",
                    p.range
                );
                assert!(
                    p.bind_offset + p.range <= s.len,
                    "tensor {t}: binding past its shard"
                );
                assert_eq!(
                    s.start + p.bind_offset + p.byte_offset,
                    off + p.first_row * row_bytes,
                    "tensor {t}: address"
                );
                assert!(
                    p.byte_offset + p.n_rows * row_bytes <= p.range,
                    "tensor {t}: piece past binding"
                );
                assert_eq!(p.range % 4, 0);
            }
            assert_eq!(next_row * row_bytes, bytes, "tensor {t}: all rows placed");
        }
    }

    #[test]
    fn small_model_fits_one_shard() {
        let tensors = [(4096, 1000, 100), (5120, 4000, 40), (9120, 612, 612)];
        let plan = plan_shards(&tensors, 9732, 12288, 4096, 2 << 30, 128 * MIB, 16).unwrap();
        assert_eq!(
            plan.shards,
            vec![Shard {
                start: 4096,
                len: 8192,
                past_mapping: false
            }]
        );
        assert_eq!(plan.placements[1][0].bind_offset, 1024);
        assert_eq!(plan.placements[2][0].bind_offset, 5024);
        assert_eq!(plan.placements[2][0].byte_offset, 0);
        check(&plan, &tensors, 12288, 128 * MIB, 16);
    }

    #[test]
    fn residual_byte_offset_when_tensor_is_not_offset_aligned() {
        // 32-byte GGUF alignment, 256-byte offset alignment: 4128 -> bind 0 + 32 (shard at 4096).
        let tensors = [(4128, 64, 64)];
        let plan = plan_shards(&tensors, 8192, 8192, 4096, MIB, MIB, 256).unwrap();
        let p = &plan.placements[0][0];
        assert_eq!((p.bind_offset, p.byte_offset, p.range), (0, 32, 96));
    }

    #[test]
    fn cap_cuts_shards_and_large_tensors_into_row_ranges() {
        // 3 MiB tensor with 1 MiB cap -> row ranges; a small tensor after it.
        let big = (0u64, 3 * MIB, 612u64 * 2);
        let small = (3 * MIB, 4096, 4096);
        let tensors = [big, small];
        let plan = plan_shards(
            &tensors,
            3 * MIB + 4096,
            3 * MIB + 4096,
            4096,
            MIB,
            128 * MIB,
            16,
        );
        // 3 MiB is not a multiple of 1224: rows error.
        assert!(matches!(plan, Err(PlanError::Rows { index: 0, .. })));
        let big = (0u64, 2570 * 1224, 1224u64);
        let len = big.1 + 4096;
        let tensors = [big, (big.1, 4096, 4096)];
        let ml = round_up(len, 4096);
        let plan = plan_shards(&tensors, len, ml, 4096, MIB, 128 * MIB, 16).unwrap();
        assert!(plan.placements[0].len() >= 3, "{:?}", plan.placements[0]);
        assert!(plan.shards.len() >= 3);
        check(&plan, &tensors, ml, 128 * MIB, 16);
    }

    #[test]
    fn max_range_splits_a_tensor_that_fits_a_shard() {
        let tensors = [(0u64, 1000 * 1024, 1024u64)];
        let plan = plan_shards(
            &tensors,
            1000 * 1024,
            1000 * 1024,
            4096,
            2 << 30,
            256 * KIB,
            16,
        )
        .unwrap();
        assert!(plan.placements[0].len() >= 4);
        check(&plan, &tensors, 1000 * 1024, 256 * KIB, 16);
    }

    #[test]
    fn parts_start_on_word_boundaries_and_even_rows() {
        // A Q8_0 row of 17 blocks = 578 bytes (578 % 4 == 2: parts must hold even rows to
        // start on a word), and 20-byte rows (any row is word-aligned; 2867 of them would
        // fill a 64 KiB shard's budget): every part starts on a word and on an even row, so
        // the kernels' row pairs (one f16 word of the KV cache) never straddle two parts.
        for (row_bytes, rows) in [(578u64, 3001u64), (20, 20_001)] {
            let tensors = [(0u64, rows * row_bytes, row_bytes)];
            let len = rows * row_bytes;
            let mapping = round_up(len, 4096);
            let plan = plan_shards(&tensors, len, mapping, 4096, 64 * KIB, 128 * MIB, 16).unwrap();
            assert!(plan.placements[0].len() > 3);
            for p in &plan.placements[0] {
                assert_eq!((p.first_row * row_bytes) % 4, 0);
                assert_eq!(
                    p.first_row % 2,
                    0,
                    "{row_bytes}-byte rows: part at row {}",
                    p.first_row
                );
            }
            check(&plan, &tensors, mapping, 128 * MIB, 16);
        }
    }

    #[test]
    fn last_shard_past_the_mapping_is_flagged() {
        // 65536 alignment on a 4096-page mapping of a 70000-byte file.
        let tensors = [(4096u64, 65000, 1000)];
        let plan = plan_shards(&tensors, 70000, 73728, 65536, 2 << 30, 128 * MIB, 16).unwrap();
        assert_eq!(
            plan.shards,
            vec![Shard {
                start: 0,
                len: 131072,
                past_mapping: true
            }]
        );
    }

    #[test]
    fn bad_inputs_are_errors_with_context() {
        let e = plan_shards(&[(0, 10, 10)], 10, 4096, 3000, MIB, MIB, 16).unwrap_err();
        assert_eq!(e.to_string(), "alignment 3000 is not a power of two");
        let e = plan_shards(&[(0, 10, 10)], 10, 4096, 4096, 1000, MIB, 16).unwrap_err();
        assert!(e.to_string().contains("cap 1000"), "{e}");
        let e =
            plan_shards(&[(0, 10, 10), (8, 100, 10)], 50, 4096, 4096, MIB, MIB, 16).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor 1 (8+100) lies outside the file of 50"),
            "{e}"
        );
        let e = plan_shards(&[(2, 8, 8)], 50, 4096, 4096, MIB, MIB, 16).unwrap_err();
        assert!(matches!(
            e,
            PlanError::Unaligned {
                index: 0,
                offset: 2
            }
        ));
        let e = plan_shards(
            &[(0, 300 * KIB, 300 * KIB)],
            300 * KIB,
            300 * KIB,
            4096,
            64 * KIB,
            MIB,
            16,
        )
        .unwrap_err();
        assert!(matches!(e, PlanError::RowTooLarge { index: 0, .. }), "{e}");
        let e = plan_shards(&[], 0, 0, 4096, MIB, MIB, 24).unwrap_err();
        assert!(matches!(e, PlanError::BadOffsetAlignment(24)));
    }

    fn layout() -> impl Strategy<Value = (Vec<(u64, u64, u64)>, u64)> {
        // Tensors laid out like GGUF: data section at a 32-aligned offset, each tensor
        // 32-aligned, sizes whole rows.
        (
            prop::collection::vec((1u64..2000, 1u64..200, 0u64..4, 0u64..3), 1..40),
            0u64..5000,
        )
            .prop_map(|(specs, header)| {
                let mut off = round_up(header + 24, 32);
                let mut out = Vec::new();
                for (row_words, n_rows, pad, kind) in specs {
                    // Row bytes: sometimes odd multiples of 2 (Q8_0-like 34-byte blocks).
                    let row_bytes = match kind {
                        0 => row_words * 4,
                        1 => row_words * 34,
                        _ => row_words * 20,
                    };
                    let bytes = row_bytes * n_rows;
                    out.push((off, bytes, row_bytes));
                    off = round_up(off + bytes, 32) + pad * 32;
                }
                (out, off)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn plans_respect_every_limit(
            (tensors, file_len) in layout(),
            align_pow in prop::sample::select(vec![12u32, 14, 16]),
            cap_kib in 64u64..4096,
            range_kib in 64u64..1024,
            moa in prop::sample::select(vec![4u64, 16, 64, 256]),
        ) {
            let align = 1u64 << align_pow;
            let mapping_len = round_up(file_len, 4096);
            let cap = cap_kib * KIB;
            let max_range = range_kib * KIB;
            match plan_shards(&tensors, file_len, mapping_len, align, cap, max_range, moa) {
                Ok(plan) => check(&plan, &tensors, mapping_len, max_range, moa),
                Err(PlanError::CapTooSmall { .. }) => prop_assert!(cap < align),
                Err(PlanError::RowTooLarge { index, .. }) => {
                    let rb = tensors[index].2;
                    let budget = (round_down(cap, align).saturating_sub(2 * align)).min(max_range.saturating_sub(moa.max(4) + 4));
                    let step = 4 / gcd(rb, 4);
                    prop_assert!(rb * step > budget, "row {rb} x {step} vs budget {budget}");
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
