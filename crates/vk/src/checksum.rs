//! CPU twin of `crates/vk/shaders/checksum.comp`, its pipeline, and a helper to size a
//! dispatch.
//!
//! For each little-endian u32 word `w` with global index `i` (a partial last word is
//! zero-padded): `h1 = fmix32(w ^ i*0x9E3779B9)`, `h2 = fmix32((w + i*0x85EBCA6B) ^ 0xC2B2AE35)`,
//! both summed mod 2^32. Sums of parts add up, so a tensor bound as row ranges gives the
//! same checksum as the whole, provided each part starts at a word boundary.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::{Context, Pipeline, PipelineDesc, VkError, CHECKSUM};

/// Push constants of `checksum.comp` (GLSL twin: `Push` in that file).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ChecksumPush {
    /// Where the range starts inside binding 0; multiple of 4.
    pub byte_offset: u32,
    /// Length of the range in bytes.
    pub n_bytes: u32,
    /// Global index of the range's first word.
    pub word_base: u32,
    /// Which pair of sums (binding 1) to add into.
    pub out_index: u32,
}
const _: () = assert!(std::mem::size_of::<ChecksumPush>() == 16);

/// Workgroup size of the kernel.
pub const LOCAL_SIZE: u32 = 64;

/// The kernel's pipeline: binding 0 the bytes (a storage buffer of words), binding 1 the
/// pairs of sums; push constants [`ChecksumPush`].
pub fn pipeline(ctx: &Arc<Context>) -> Result<Pipeline, VkError> {
    Pipeline::new(
        ctx,
        &PipelineDesc {
            kernel: CHECKSUM,
            n_bindings: 2,
            push_size: std::mem::size_of::<ChecksumPush>() as u32,
            spec: vec![],
        },
    )
}

/// Workgroups to dispatch for `n_bytes` (enough to cover, capped for striding).
pub fn groups_for(n_bytes: u64) -> u32 {
    let words = n_bytes.div_ceil(4);
    words.div_ceil(u64::from(LOCAL_SIZE) * 4).clamp(1, 4096) as u32
}

fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    h
}

/// Checksum of `bytes` whose first word has global index `word_base`.
pub fn cpu(bytes: &[u8], word_base: u32) -> [u32; 2] {
    let mut a = 0u32;
    let mut b = 0u32;
    for (k, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        let w = u32::from_le_bytes(w);
        let i = word_base.wrapping_add(k as u32);
        a = a.wrapping_add(fmix32(w ^ i.wrapping_mul(0x9E37_79B9)));
        b = b.wrapping_add(fmix32(
            w.wrapping_add(i.wrapping_mul(0x85EB_CA6B)) ^ 0xC2B2_AE35,
        ));
    }
    [a, b]
}

/// Adds two checksums (of disjoint parts).
pub fn combine(x: [u32; 2], y: [u32; 2]) -> [u32; 2] {
    [x[0].wrapping_add(y[0]), x[1].wrapping_add(y[1])]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_and_bytes_matter() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = cpu(&data, 0);
        let split = combine(cpu(&data[..400], 0), cpu(&data[400..], 100));
        assert_eq!(whole, split);
        let mut changed = data.clone();
        changed[999] ^= 1;
        assert_ne!(cpu(&changed, 0), whole);
        // Swapping two words changes it (position-dependent).
        let mut swapped = data.clone();
        swapped.swap(0, 4);
        swapped.swap(1, 5);
        swapped.swap(2, 6);
        swapped.swap(3, 7);
        assert_ne!(cpu(&swapped, 0), whole);
        // A partial word is zero-padded.
        assert_eq!(cpu(&[1, 2, 3], 5), cpu(&[1, 2, 3, 0], 5));
    }
}
