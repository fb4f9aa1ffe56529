//! Quantised block layouts and CPU (de)quantisation, following ggml's reference code
//! (`ggml-common.h` for the layouts, `ggml-quants.c` for the `*_ref` routines).
//!
//! Blocks are `#[repr(C)]` + `bytemuck::Pod` with compile-time size assertions; their
//! GLSL twins live in `shaders/include/`. Data in a file need not be aligned for these
//! structs, so everything here reads bytes with `from_le_bytes` or
//! `bytemuck::pod_read_unaligned`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::error::GgufError;
use crate::types::GgmlType;

mod k_dequant;
mod k_quant;
mod k_search;
pub mod mix;

pub use k_dequant::q3_k_scales;
pub use k_quant::{quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k};

/// Elements per block of the 32-element formats.
pub const QK: usize = 32;
/// Elements per super-block of the K formats.
pub const QK_K: usize = 256;

/// Q8_0: 32 weights as `d * qs[i]`. GLSL twin: `block_q8_0` in `shaders/include/`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// Q4_0: 32 weights as `d * (nibble - 8)`; low nibbles are elements 0..15, high 16..31.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 weights as `d * nibble + m`; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// Q5_0: 32 weights as `d * (q5 - 16)`; bit 4 of element `j` is bit `j` of `qh` (LE u32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 weights as `d * q5 + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q4_K: 256 weights in 8 groups of 32, each with a 6-bit scale and min.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q2_K: 256 weights in 16 groups of 16, 2 bits each; per group a 4-bit scale (low
/// nibble of `scales`) and a 4-bit min (high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2_K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// Q3_K: 256 weights in 16 groups of 16, 2 bits in `qs` plus a high bit in `hmask`;
/// sixteen 6-bit signed scales packed in 12 bytes (see [`q3_k_scales`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3_K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// Q5_K: as Q4_K, with the fifth bit of every weight in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 weights in 16 groups of 16, 6 bits each (4 in `ql`, 2 in `qh`), i8 scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn check_len(ty: GgmlType, data: &[u8], n: usize) -> Result<(), GgufError> {
    let expected = ty.row_bytes(n as u64);
    if expected != Some(data.len() as u64) {
        return Err(GgufError::DataLength {
            ty,
            n_elements: n as u64,
            expected: match expected {
                Some(e) => e.to_string(),
                None => format!("a whole number of {}-element blocks", ty.block_size()),
            },
            found: data.len(),
        });
    }
    Ok(())
}

/// Whether [`dequantize`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// Dequantises `out.len()` elements of type `ty` from `data`, which must be exactly
/// `ty.row_bytes(out.len())` bytes. Supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, bit for bit as ggml (and the `gguf` Python
/// package) dequantise them.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    if !can_dequantize(ty) {
        return Err(GgufError::Unsupported {
            op: "dequantisation",
            ty,
        });
    }
    check_len(ty, data, out.len())?;
    let blocks = data.chunks_exact(ty.type_size());
    let outs = out.chunks_exact_mut(ty.block_size());
    match ty {
        GgmlType::F32 => blocks
            .zip(outs)
            .for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => blocks
            .zip(outs)
            .for_each(|(b, o)| o[0] = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::BF16 => blocks
            .zip(outs)
            // The top 16 bits of an f32, NaN payloads included (as ggml's plain shift).
            .for_each(|(b, o)| {
                o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
            }),
        GgmlType::Q8_0 => blocks.zip(outs).for_each(|(b, o)| dequant_q8_0(b, o)),
        GgmlType::Q4_0 => blocks.zip(outs).for_each(|(b, o)| dequant_q4_0(b, o)),
        GgmlType::Q4_1 => blocks.zip(outs).for_each(|(b, o)| dequant_q4_1(b, o)),
        GgmlType::Q5_0 => blocks.zip(outs).for_each(|(b, o)| dequant_q5_0(b, o)),
        GgmlType::Q5_1 => blocks.zip(outs).for_each(|(b, o)| dequant_q5_1(b, o)),
        GgmlType::Q2_K => blocks
            .zip(outs)
            .for_each(|(b, o)| k_dequant::dequant_q2_k(b, o)),
        GgmlType::Q3_K => blocks
            .zip(outs)
            .for_each(|(b, o)| k_dequant::dequant_q3_k(b, o)),
        GgmlType::Q4_K => blocks
            .zip(outs)
            .for_each(|(b, o)| k_dequant::dequant_q4_k(b, o)),
        GgmlType::Q5_K => blocks
            .zip(outs)
            .for_each(|(b, o)| k_dequant::dequant_q5_k(b, o)),
        GgmlType::Q6_K => blocks
            .zip(outs)
            .for_each(|(b, o)| k_dequant::dequant_q6_k(b, o)),
        _ => unreachable!("checked by can_dequantize"),
    }
    Ok(())
}

/// Dequantises `n` elements into a new vector (see [`dequantize`]).
pub fn dequantize_row(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let mut out = vec![0.0f32; n];
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

fn dequant_q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in o.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

fn dequant_q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        o[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        o[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn dequant_q4_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        o[j] = (qs[j] & 0x0F) as f32 * d + m;
        o[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The 5-bit values of a Q5 block: low nibbles from `qs`, bit 4 from `qh`.
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        v[j] = (qs[j] & 0x0F) | h0;
        v[j + 16] = (qs[j] >> 4) | h1;
    }
    v
}

fn dequant_q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let v = q5_values(qh, &b[6..22]);
    for (y, &q) in o.iter_mut().zip(&v) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

fn dequant_q5_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let v = q5_values(qh, &b[8..24]);
    for (y, &q) in o.iter_mut().zip(&v) {
        *y = q as f32 * d + m;
    }
}

/// Scale and min of group `j` (0..8) of a Q4_K/Q5_K block (ggml `get_scale_min_k4`).
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Whether [`quantize`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

fn blocks_of(x: &[f32], block: usize) -> Result<std::slice::ChunksExact<'_, f32>, GgufError> {
    if !x.len().is_multiple_of(block) {
        return Err(GgufError::NotBlockMultiple {
            n: x.len(),
            block_size: block,
        });
    }
    Ok(x.chunks_exact(block))
}

/// Quantises to Q8_0 exactly as ggml's `quantize_row_q8_0_ref`: `amax = max|x|`,
/// `d = amax / 127`, `q = round(x * (1/d))` with halves away from zero, `d` stored as
/// f16 (round to nearest even). `x.len()` must be a multiple of 32.
pub fn quantize_q8_0(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    for blk in blocks_of(x, QK)? {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
    Ok(out)
}

/// The element of largest magnitude (first one on ties), as ggml's Q4_0/Q5_0 use it.
fn signed_absmax(blk: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in blk {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(blk: &[f32]) -> (f32, f32) {
    blk.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Quantises to Q4_0 as ggml's `quantize_row_q4_0_ref` (`d = max / -8`).
pub fn quantize_q4_0(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK * 18);
    for blk in blocks_of(x, QK)? {
        let d = signed_absmax(blk) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i8).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
    }
    Ok(out)
}

/// Quantises to Q4_1 as ggml's `quantize_row_q4_1_ref` (`d = (max - min) / 15`, `m = min`).
pub fn quantize_q4_1(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK * 20);
    for blk in blocks_of(x, QK)? {
        let (lo, hi) = min_max(blk);
        let d = (hi - lo) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(lo).to_le_bytes());
        let q = |v: f32| (((v - lo) * id + 0.5) as i8).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
    }
    Ok(out)
}

fn pack_q5(v: &[u8; 32], out: &mut Vec<u8>) {
    let mut qh = 0u32;
    for (j, &q) in v.iter().enumerate() {
        qh |= u32::from((q >> 4) & 1) << j;
    }
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend((0..16).map(|j| (v[j] & 0x0F) | ((v[j + 16] & 0x0F) << 4)));
}

/// Quantises to Q5_0 as ggml's `quantize_row_q5_0_ref` (`d = max / -16`).
pub fn quantize_q5_0(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK * 22);
    for blk in blocks_of(x, QK)? {
        let d = signed_absmax(blk) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let mut v = [0u8; 32];
        for (q, &x) in v.iter_mut().zip(blk) {
            *q = ((x * id + 16.5) as i8).clamp(0, 31) as u8;
        }
        pack_q5(&v, &mut out);
    }
    Ok(out)
}

/// Quantises to Q5_1 as ggml's `quantize_row_q5_1_ref` (`d = (max - min) / 31`, `m = min`).
pub fn quantize_q5_1(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK * 24);
    for blk in blocks_of(x, QK)? {
        let (lo, hi) = min_max(blk);
        let d = (hi - lo) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(lo).to_le_bytes());
        let mut v = [0u8; 32];
        for (q, &x) in v.iter_mut().zip(blk) {
            // No clamp, as ggml: `(uint8_t)(x0 + 0.5f)`, at most 31 for finite input.
            *q = ((x - lo) * id + 0.5) as u8;
        }
        pack_q5(&v, &mut out);
    }
    Ok(out)
}

/// Encodes f32 values as F16 bytes (round to nearest even).
pub fn quantize_f16(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect()
}

/// Encodes f32 values as F32 little-endian bytes.
pub fn quantize_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Quantises `x` to `ty` where this crate has a quantiser (F32, F16, Q8_0, Q4_0, Q4_1,
/// Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), each as ggml's reference quantiser.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>, GgufError> {
    match ty {
        GgmlType::F32 => Ok(quantize_f32(x)),
        GgmlType::F16 => Ok(quantize_f16(x)),
        GgmlType::Q8_0 => quantize_q8_0(x),
        GgmlType::Q4_0 => quantize_q4_0(x),
        GgmlType::Q4_1 => quantize_q4_1(x),
        GgmlType::Q5_0 => quantize_q5_0(x),
        GgmlType::Q5_1 => quantize_q5_1(x),
        GgmlType::Q2_K => quantize_q2_k(x),
        GgmlType::Q3_K => quantize_q3_k(x),
        GgmlType::Q4_K => quantize_q4_k(x),
        GgmlType::Q5_K => quantize_q5_k(x),
        GgmlType::Q6_K => quantize_q6_k(x),
        _ => Err(GgufError::Unsupported {
            op: "quantisation",
            ty,
        }),
    }
}
