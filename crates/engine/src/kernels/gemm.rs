//! `matmul_mm.comp`: the prefill GEMM, `Y = W·X` over a tile of [`GEMM_TT`] prompt tokens
//! per workgroup, each weight chunk decoded once per tile instead of once per 4 tokens.
//! The contract is matmul.comp's ([`MatmulPush`](super::MatmulPush),
//! [`MatmulBindings`](super::MatmulBindings), [`matmul_layout`](super::matmul_layout)
//! with the key's `tb` the tokens per workgroup), so a prefill dispatch differs from a
//! decode one only in its pipeline: a [`MatmulKey`] whose `tb` is a GEMM tile names a
//! `matmul_mm` variant. The epilogues are matmul.glsl's (`store_pair`), every one built
//! (the `logits` one at batch width is the plain q/k/v of the families with heads.comp).
//!
//! Also here: how many prompt tokens one prefill submission takes on a device
//! ([`prefill_chunk`]).

use super::Kernels;

/// Tokens per workgroup the GEMM is built for (`TT` in kernels/variants.rs): the
/// tile, and [`GEMM_SMALL_TILE`].
pub const GEMM_TT: [u32; 2] = [GEMM_SMALL_TILE, GEMM_TILE];

/// The GEMM tile of a step of at most this many tokens (a lone serving slot's decode, a
/// one-token prompt chunk), so that one token does not pay for `GEMM_TILE`. Not 1 or
/// 4: a key's `tb` of 1 or 4 names matmul.comp ([`MATMUL_TB`](super::MATMUL_TB)).
pub const GEMM_SMALL_TILE: u32 = 2;

/// The prefill GEMM's shape measured best on lavapipe: lanes per workgroup, row pairs
/// per lane (two at a time in lockstep), tokens per workgroup (one of [`GEMM_TT`]).
/// Pairs 2 / 4 / 8: 2.04k / 2.15k / 2.67k tokens/s on a Q8_0 576x1536 matrix, 64 tokens
/// (benches/gemm.rs, load average ~16; matmul.comp's 4-token shape: 1.12k in the same
/// run). At load ~6 the GEMM (8 pairs) and the 4-token shape were at parity (0.86-1.14x
/// over the three SmolLM2 shapes), a whole 512-token prefill 1.09-1.10x.
pub(crate) const GEMM_WG: u32 = 8;
pub const GEMM_PAIRS: u32 = 8;
pub(crate) const GEMM_TILE: u32 = 8;
/// `GEMM_WG`, [`GEMM_PAIRS`], `GEMM_TILE` as a shape (the `gemm` of
/// [`CPU`](super::CPU)).
pub const GEMM_SHAPE: super::MatmulShape = super::MatmulShape {
    wg: GEMM_WG,
    pairs: GEMM_PAIRS,
    tb: GEMM_TILE,
};

/// Whether a matmul key's `tb` selects the GEMM (a tile larger than matmul.comp's 4).
pub(crate) fn is_gemm_tile(tb: u32) -> bool {
    GEMM_TT.contains(&tb)
}

impl Kernels {
    /// Whether the GEMM runs on this device: it spreads a tile's input over the lanes of
    /// a subgroup and broadcasts it back, so it needs subgroup ballot in compute and
    /// subgroups of at least 4 lanes (otherwise prefill keeps matmul.comp's 4-token shape).
    pub fn gemm_supported(&self) -> bool {
        let caps = self.ctx.caps();
        caps.subgroup_in_compute
            && caps.subgroup_operations.contains(&"ballot")
            && caps.subgroup_size >= 4
    }

    /// How this device prefills: through the GEMM where its shapes have one and it runs
    /// here ([`Kernels::gemm_supported`]), else matmul.comp 4 tokens at a time.
    pub(crate) fn prefill_batch(&self) -> super::Batch {
        if self.shapes().gemm.is_some() && self.gemm_supported() {
            super::Batch::Prefill
        } else {
            super::Batch::PrefillMatvec
        }
    }
}

/// Prompt tokens per prefill submission on lavapipe (see [`prefill_chunk`]): the value
/// used before the GEMM, not re-measured with it yet (a 64- and a 512-token prompt
/// prefilled at the same rate, 40-44 tok/s on a busy machine, so per-chunk costs such as
/// the submit and the attention over the cache do not dominate at this size).
pub(crate) const LAVAPIPE_PREFILL_CHUNK: usize = 64;

/// Prompt tokens one prefill submission takes on a device whose storage-buffer bindings
/// are at most `max_range` bytes and whose dispatches have at most `max_groups_y`
/// workgroups in y, for a model whose widest activation row (per token) has `widest`
/// floats: lavapipe's value (`LAVAPIPE_PREFILL_CHUNK`), fewer when a chunk's widest
/// activation would not fit one binding or its token tiles one dispatch, and a whole
/// number of GEMM tiles where it can be.
pub fn prefill_chunk(max_range: u64, max_groups_y: u32, widest: usize, tile: u32) -> usize {
    let tile = tile.max(1) as usize;
    let by_range = (max_range / (4 * widest.max(1) as u64)).max(1) as usize;
    let by_groups = (max_groups_y as usize).saturating_mul(tile).max(1);
    let n = LAVAPIPE_PREFILL_CHUNK.min(by_range).min(by_groups);
    if n >= tile {
        n - n % tile
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lavapipe's value where the device allows it; fewer, whole tiles where possible,
    /// when one binding or the workgroup count would overflow.
    #[test]
    fn prefill_chunk_fits_the_device() {
        let mib128 = 128 << 20;
        assert_eq!(
            prefill_chunk(mib128, 65535, 49152, 16),
            LAVAPIPE_PREFILL_CHUNK
        );
        // 64 KiB bindings, 1536-float rows: 10 tokens fit, fewer than a tile
        assert_eq!(prefill_chunk(64 << 10, 65535, 1536, 16), 10);
        // 40 tokens fit: two whole tiles of 16
        assert_eq!(prefill_chunk(40 * 4 * 1000, 65535, 1000, 16), 32);
        // two workgroups in y: two tiles
        assert_eq!(prefill_chunk(mib128, 2, 576, 16), 32);
    }
}
