//! The K formats, Q5_x and BF16 against llama.cpp's own references: dequantisation bit
//! for bit against vectors made by `gguf.quants.dequantize` (see
//! `data/dequant/make_vectors.py`), quantisation byte for byte against vectors made by
//! ggml's `ggml_quantize_chunk` (`data/quant/`), round-trip error bounds, and the
//! per-tensor type plan of `llama-quantize`.

use std::path::PathBuf;

use gguf::quant::mix::{self, Scheme, TensorDesc};
use gguf::quant::{self, quantize};
use gguf::{dequantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn data_dir(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(sub)
}

/// Records of 256 elements: `ty`'s bytes for them, then 256 little-endian f32.
fn records(path: &std::path::Path, ty: GgmlType, bytes_first: bool) -> Vec<(Vec<u8>, Vec<f32>)> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let nb = ty.row_bytes(256).unwrap() as usize;
    let rec = nb + 1024;
    assert!(
        !raw.is_empty() && raw.len().is_multiple_of(rec),
        "{}: {} bytes is not whole {rec}-byte records",
        path.display(),
        raw.len()
    );
    raw.chunks(rec)
        .map(|r| {
            let (b, f) = if bytes_first {
                r.split_at(nb)
            } else {
                let (f, b) = r.split_at(1024);
                (b, f)
            };
            let f = f
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (b.to_vec(), f)
        })
        .collect()
}

const DEQUANT_TYPES: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::BF16,
];

#[test]
fn dequantisation_matches_the_gguf_python_reference_bit_for_bit() {
    for ty in DEQUANT_TYPES {
        let path = data_dir("dequant").join(format!("{}.bin", ty.name()));
        let recs = records(&path, ty, true);
        assert_eq!(recs.len(), 4, "{ty}");
        for (r, (bytes, want)) in recs.iter().enumerate() {
            let got = dequantize_row(ty, bytes, 256).unwrap();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} record {r} element {i}: {g} vs the reference's {w}"
                );
            }
        }
    }
}

const QUANT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn quantisation_matches_ggml_byte_for_byte() {
    for ty in QUANT_TYPES {
        let path = data_dir("quant").join(format!("{}.bin", ty.name()));
        let recs = records(&path, ty, false);
        assert_eq!(recs.len(), 4, "{ty}");
        for (r, (want, x)) in recs.iter().enumerate() {
            let got = quantize(ty, x).unwrap();
            assert_eq!(got.len(), want.len(), "{ty} record {r}");
            let first = got.iter().zip(want).position(|(a, b)| a != b);
            assert_eq!(first, None, "{ty} record {r}: first differing byte");
        }
    }
}

/// Weights shaped like a model's: Gaussian, with a few outliers and one quiet group.
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            // Box-Muller from two uniforms.
            let (u, v): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen_range(0.0..1.0));
            let g = (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos();
            let scale = if (i / 256) % 4 == 3 { 0.001 } else { 0.05 };
            let outlier = if i % 509 == 0 { 8.0 } else { 1.0 };
            g * scale * outlier
        })
        .collect()
}

fn rmse(a: &[f32], b: &[f32]) -> f32 {
    let s: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    (s / a.len() as f64).sqrt() as f32
}

#[test]
fn k_quant_round_trips_within_bounds() {
    let x = weights(256 * 24, 21);
    let rms = rmse(&x, &vec![0.0; x.len()]);
    // RMSE relative to the data's RMS, as measured for these weights with ggml's own
    // quantisers (bit-identical here), with a margin: more bits, smaller error. A broken
    // packing or a lost scale gives errors of order 1.
    let cases = [
        (GgmlType::Q2_K, 0.40),
        (GgmlType::Q3_K, 0.20),
        (GgmlType::Q4_K, 0.10),
        (GgmlType::Q5_K, 0.05),
        (GgmlType::Q6_K, 0.025),
    ];
    let mut last = f32::INFINITY;
    for (ty, bound) in cases {
        let bytes = quantize(ty, &x).unwrap();
        assert_eq!(
            bytes.len() as u64,
            ty.row_bytes(x.len() as u64).unwrap(),
            "{ty}"
        );
        let y = dequantize_row(ty, &bytes, x.len()).unwrap();
        let rel = rmse(&x, &y) / rms;
        assert!(rel < bound, "{ty}: relative RMSE {rel} >= {bound}");
        assert!(
            rel < last,
            "{ty}: relative RMSE {rel} not below the type with fewer bits"
        );
        assert!(
            rel > bound / 20.0,
            "{ty}: relative RMSE {rel} suspiciously small"
        );
        last = rel;
        // Every element within a few quant steps of its group's range.
        for (bx, by) in x.chunks(16).zip(y.chunks(16)) {
            let amax = bx.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in bx.iter().zip(by) {
                assert!(
                    (a - b).abs() <= amax * 1.01 + 1e-6,
                    "{ty}: {a} -> {b} (amax {amax})"
                );
            }
        }
    }
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        assert!(
            quantize(ty, &x[..255]).is_err(),
            "{ty}: 255 elements accepted"
        );
        // Zeros stay zeros.
        let z = quantize(ty, &[0.0; 256]).unwrap();
        assert_eq!(dequantize_row(ty, &z, 256).unwrap(), vec![0.0; 256], "{ty}");
    }
}

#[test]
fn q3_k_scales_unpack_what_the_quantiser_packs() {
    // Scales are 6-bit signed (-32..31): a ramp of groups with growing spread.
    let x: Vec<f32> = (0..256)
        .map(|i| ((i % 16) as f32 - 7.5) * (1.0 + (i / 16) as f32))
        .collect();
    let b = quant::quantize_q3_k(&x).unwrap();
    let packed: [u8; 12] = b[96..108].try_into().unwrap();
    let sc = quant::q3_k_scales(&packed);
    // Groups are scaled 1..16: their 6-bit scales grow in magnitude with them.
    for j in 1..16 {
        assert!(sc[j].unsigned_abs() >= sc[j - 1].unsigned_abs(), "{sc:?}");
    }
    assert_eq!(sc[15].unsigned_abs(), 32, "{sc:?}");
}

fn smollm2_like() -> Vec<(String, Vec<u64>, GgmlType)> {
    let mut t = vec![
        (
            "token_embd.weight".to_string(),
            vec![576, 49152],
            GgmlType::Q8_0,
        ),
        ("output_norm.weight".to_string(), vec![576], GgmlType::F32),
    ];
    for l in 0..30 {
        for (n, s) in [
            ("attn_q", vec![576, 576]),
            ("attn_k", vec![576, 192]),
            ("attn_v", vec![576, 192]),
            ("attn_output", vec![576, 576]),
            ("ffn_gate", vec![576, 1536]),
            ("ffn_up", vec![576, 1536]),
            ("ffn_down", vec![1536, 576]),
            ("attn_norm", vec![576]),
            ("ffn_norm", vec![576]),
        ] {
            let ty = if s.len() == 1 {
                GgmlType::F32
            } else {
                GgmlType::Q8_0
            };
            t.push((format!("blk.{l}.{n}.weight"), s, ty));
        }
    }
    t
}

fn plan_counts(
    scheme: Scheme,
    t: &[(String, Vec<u64>, GgmlType)],
    n_layer: u64,
) -> Vec<(GgmlType, usize)> {
    let descs: Vec<TensorDesc<'_>> = t
        .iter()
        .map(|(n, s, ty)| TensorDesc {
            name: n,
            shape: s,
            ty: *ty,
        })
        .collect();
    let types = mix::plan(scheme, &descs, n_layer);
    let mut counts = std::collections::BTreeMap::new();
    for ty in types {
        *counts.entry(ty).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

#[test]
fn type_plan_matches_llama_quantize_on_smollm2() {
    use GgmlType::*;
    let t = smollm2_like();
    // llama-quantize d775b8967 on SmolLM2-135M (docs/facts.md, "K-quants and row
    // width"): --pure falls back for the 181 tensors 576 wide; only the 30 ffn_down (1536
    // wide) get the K type.
    for (k, fb) in [
        (Q4_K, Q5_0),
        (Q5_K, Q5_1),
        (Q6_K, Q8_0),
        (Q3_K, Q4_0),
        (Q2_K, Q4_0),
    ] {
        let c = plan_counts(Scheme::Pure(k), &t, 30);
        let want = if fb == Q8_0 {
            vec![(F32, 61), (Q8_0, 181), (k, 30)]
        } else {
            let mut w = vec![(F32, 61), (fb, 181), (k, 30)];
            w.sort();
            w
        };
        assert_eq!(c, want, "--pure {k}");
    }
    // Q4_K_M: 166 Q5_0, 16 Q4_K, 15 Q8_0 (the tied embedding and 14 attn_v), 14 Q6_K.
    assert_eq!(
        plan_counts(Scheme::Q4KM, &t, 30),
        vec![(F32, 61), (Q5_0, 166), (Q8_0, 15), (Q4_K, 16), (Q6_K, 14)]
    );
    assert_eq!(
        plan_counts(Scheme::Q5KM, &t, 30),
        vec![(F32, 61), (Q5_1, 166), (Q8_0, 15), (Q5_K, 16), (Q6_K, 14)]
    );
}

#[test]
fn type_plan_gives_gemma3_its_q4_k_m_types() {
    use GgmlType::*;
    // Gemma 3 270M as shipped in Q4_K_M: 18 layers, dim 640, q 1024 wide output.
    let mut t = vec![("token_embd.weight".to_string(), vec![640u64, 262144], F32)];
    for l in 0..18 {
        for (n, s) in [
            ("attn_q", vec![640, 1024]),
            ("attn_k", vec![640, 256]),
            ("attn_v", vec![640, 256]),
            ("attn_output", vec![1024, 640]),
            ("ffn_gate", vec![640, 2048]),
            ("ffn_up", vec![640, 2048]),
            ("ffn_down", vec![2048, 640]),
            ("attn_q_norm", vec![256]),
        ] {
            t.push((format!("blk.{l}.{n}.weight"), s, F32));
        }
    }
    let descs: Vec<TensorDesc<'_>> = t
        .iter()
        .map(|(n, s, ty)| TensorDesc {
            name: n,
            shape: s,
            ty: *ty,
        })
        .collect();
    let types = mix::plan(Scheme::Q4KM, &descs, 18);
    let of = |name: &str| types[t.iter().position(|x| x.0 == name).unwrap()];
    assert_eq!(of("token_embd.weight"), Q8_0);
    // use_more_bits over 18 layers: 0, 1, 4, 7, 10, 13, 15, 16, 17.
    for l in 0..18 {
        let more = [0, 1, 4, 7, 10, 13, 15, 16, 17].contains(&l);
        let v = of(&format!("blk.{l}.attn_v.weight"));
        let d = of(&format!("blk.{l}.ffn_down.weight"));
        assert_eq!(v, if more { Q8_0 } else { Q5_0 }, "layer {l} attn_v");
        assert_eq!(d, if more { Q6_K } else { Q4_K }, "layer {l} ffn_down");
        assert_eq!(of(&format!("blk.{l}.attn_output.weight")), Q4_K);
        assert_eq!(of(&format!("blk.{l}.attn_q.weight")), Q5_0);
        assert_eq!(of(&format!("blk.{l}.attn_q_norm.weight")), F32);
    }
}

/// The Gemma 3 270M Q4_K_M file, where a developer has fetched it (`models/fetch gemma3`
/// or `VKDECODE_GEMMA3=path`); the test that needs it skips without it.
fn gemma3() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("VKDECODE_GEMMA3").map(PathBuf::from),
        Some(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf"),
        ),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

#[test]
fn gemma3_tensors_dequantise_as_the_python_reference() {
    use sha2::{Digest, Sha256};
    let Some(path) = gemma3() else {
        eprintln!("skipped: gemma-3-270m-q4_k_m.gguf not present (models/fetch gemma3)");
        return;
    };
    let list = std::fs::read_to_string(data_dir("").join("gemma3_dequant_sha256.txt")).unwrap();
    let file = gguf::GgufFile::open(&path).unwrap();
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.starts_with('#')) {
        let mut f = line.split_whitespace();
        let (name, ty, sha) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let t = file
            .gguf()
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.ty.name(), ty, "{name}");
        let y = dequantize_row(t.ty, file.tensor_data(t), t.n_elements() as usize).unwrap();
        let mut h = Sha256::new();
        for v in &y {
            h.update(v.to_le_bytes());
        }
        assert_eq!(format!("{:x}", h.finalize()), sha, "{name} ({ty})");
        checked += 1;
    }
    assert_eq!(checked, 127);
}

#[test]
fn type_plan_untied_output_and_kept_tensors() {
    use GgmlType::*;
    let t = [
        ("token_embd.weight", vec![1024u64, 100], F16),
        ("output.weight", vec![1024, 100], F16),
        ("blk.0.attn_v.weight", vec![1024, 256], F16),
        ("blk.0.ffn_down.weight", vec![1000, 64], F16), // 1000: not even Q5_0's blocks
        ("blk.0.attn_norm.weight", vec![1024], F32),
        ("blk.0.ffn_gate_inp.weight", vec![1024, 8], F32),
        ("rope_freqs.weight", vec![64], F32),
        ("blk.0.attn_k.weight", vec![1024, 1], F16), // ggml counts it as 1-D
    ];
    let descs: Vec<TensorDesc<'_>> = t
        .iter()
        .map(|(n, s, ty)| TensorDesc {
            name: n,
            shape: s,
            ty: *ty,
        })
        .collect();
    // Q4_K_M: an untied output gets Q6_K; token_embd keeps the base type; the one
    // attn_v of one layer is in use_more_bits' first eighth.
    assert_eq!(
        mix::plan(Scheme::Q4KM, &descs, 1),
        vec![Q4_K, Q6_K, Q6_K, F16, F32, F32, F32, F16]
    );
    assert_eq!(
        mix::plan(Scheme::Pure(Q8_0), &descs, 1),
        vec![Q8_0, Q8_0, Q8_0, F16, F32, F32, F32, F16]
    );
    assert_eq!(mix::fallback(Q4_K, 1000), Some(F16));
    assert_eq!(mix::fallback(Q8_0, 1000), None);
    assert_eq!(mix::fallback(Q6_K, 576), Some(Q8_0));
}

/// `data/quant/make_sha256.py`'s inputs, bit for bit: 64 rows of 256 weights.
fn hashed_inputs() -> Vec<f32> {
    let u =
        |i: u64| ((i.wrapping_mul(2_654_435_761) % (1 << 32)) >> 8) as f32 / (1u32 << 24) as f32;
    let scale = [0.05f32, 0.001, 1.5, 0.02];
    (0..256 * 64u64)
        .map(|i| ((u(i) + u(i + 7)) + u(i + 13) - 1.5) * scale[(i as usize / 256) % 4])
        .collect()
}

#[test]
fn quantisation_of_64_rows_matches_ggml_by_sha256() {
    use sha2::{Digest, Sha256};
    let x = hashed_inputs();
    let list = std::fs::read_to_string(data_dir("quant").join("sha256.txt")).unwrap();
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.starts_with('#')) {
        let (name, sha) = line.split_once(' ').unwrap();
        let ty = GgmlType::from_name(name).unwrap();
        let got = format!("{:x}", Sha256::digest(quantize(ty, &x).unwrap()));
        assert_eq!(got, sha, "{ty}: 64 rows quantised unlike ggml");
        checked += 1;
    }
    assert_eq!(checked, QUANT_TYPES.len());
}
