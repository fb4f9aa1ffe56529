//! Every common GGUF weight type on a real model: the default model
//! (SmolLM2-135M-Instruct Q8_0) rewritten in each type decodes on the GPU as the f32 CPU
//! reference decodes the same file, and what `inspect` and a load say about a type the
//! GPU does not read.
//!
//! Per type (one `#[test]` each, from the table in `type_tests!`), on three prompts: the
//! GPU's logits after the prompt (the batched prefill) are within TOL of the
//! reference's, and 16 greedy steps give the reference's ids. Both run through the
//! load paths the CLI uses (`engine::generate::load`, `cpu_backend::load_reference`: the
//! `Forward` trait), the GPU fed
//! the reference's token at each step. A divergence is tolerated only at a step whose
//! reference top-2 gap is below TOL (printed; the comparison stops there), as in
//! crates/engine/tests/model_smollm.rs. TOL = 0.03: the sums' order (1.2e-4 over 30
//! layers with f32 caches) and the keys cached as f16 one step apart where the two sides'
//! f32 values straddle a rounding edge (up to 0.0124 measured, at Q2_K, whose logits move
//! the most), while a wrong decoder moves logits by O(1).
//!
//! The files are made by the project's converter, as a user makes them (`vkdecode
//! convert --type T`, llama-quantize `--pure`'s fallbacks where a row is not whole K
//! blocks: most of SmolLM2's rows are 576 long); BF16, which `convert` does not write,
//! by the `gguf` crate here (every 2-D weight rounded to bf16, nearest-even). They are
//! cached in the integration tests' temporary directory (`CARGO_TARGET_TMPDIR`) and made
//! again when the converter, this test or the source is newer.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use common::{q8, vkdecode, TempDir};
use engine::generate::{self, CtxRequest, Forward, LoadOptions};
use gguf::{GgmlType, Gguf, GgufFile, GgufWriter, Value};

/// Largest |gpu - reference| logit (see the top of this file).
const TOL: f32 = 0.03;
/// Greedy steps per prompt: enough for a wrong kernel to change an id, short enough to
/// run every type.
const STEPS: usize = 16;
const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
];

/// How a type's file is made.
#[derive(Clone, Copy, Debug)]
enum Make {
    /// `vkdecode convert --type <name>`.
    Convert(&'static str),
    /// Written here: every 2-D weight of the source as BF16.
    Bf16,
}

/// One test per type: the table the lead reads the results from.
macro_rules! type_tests {
    ($($name:ident: $make:expr;)*) => {
        $(
            #[test]
            fn $name() {
                decodes_like_the_reference(stringify!($name), $make);
            }
        )*
    };
}

type_tests! {
    q5_0: Make::Convert("q5_0");
    q5_1: Make::Convert("q5_1");
    bf16: Make::Bf16;
    q4_k: Make::Convert("q4_k");
    q5_k: Make::Convert("q5_k");
    q6_k: Make::Convert("q6_k");
    q3_k: Make::Convert("q3_k");
    q2_k: Make::Convert("q2_k");
    q4_k_m: Make::Convert("q4_k_m");
    q5_k_m: Make::Convert("q5_k_m");
}

fn mtime(p: &Path) -> SystemTime {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Whether `out` exists and is newer than everything it is made from.
fn fresh(out: &Path, from: &[&Path]) -> bool {
    out.exists() && from.iter().all(|f| mtime(out) > mtime(f))
}

/// The default model in type `name`, made by `make` (or the cached copy).
fn model_in(name: &str, make: Make) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("types_gpu");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("SmolLM2-135M-Instruct.{name}.gguf"));
    let src = q8();
    let test_exe = std::env::current_exe().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_vkdecode"));
    match make {
        Make::Convert(ty) if !fresh(&out, &[&src, &bin]) => {
            let o = vkdecode(&[
                "convert",
                "--type",
                ty,
                src.to_str().unwrap(),
                out.to_str().unwrap(),
            ]);
            assert!(
                o.status.success(),
                "vkdecode convert --type {ty} failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Make::Bf16 if !fresh(&out, &[&src, &test_exe]) => write_bf16(&src, &out),
        _ => {}
    }
    out
}

/// f32 -> bf16, round to nearest even (ggml's `ggml_compute_fp32_to_bf16`; the
/// source's values are finite).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// `src` with every 2-D weight dequantised and rounded to BF16; everything else copied.
fn write_bf16(src: &Path, out: &Path) {
    let bytes = std::fs::read(src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let mut w = GgufWriter::new(g.alignment);
    for (k, v) in &g.metadata {
        let v = if k == "general.file_type" {
            Value::U32(32) // LLAMA_FTYPE_MOSTLY_BF16
        } else {
            v.clone()
        };
        w.add_metadata(k.clone(), v);
    }
    for t in &g.tensors {
        let data = g.tensor_data(&bytes, t);
        if t.shape.len() == 2 {
            let n = t.n_elements() as usize;
            let f = gguf::quant::dequantize_row(t.ty, data, n).unwrap();
            let b: Vec<u8> = f.iter().flat_map(|&v| bf16_bits(v).to_le_bytes()).collect();
            w.add_tensor(t.name.clone(), GgmlType::BF16, &t.shape, b)
                .unwrap();
        } else {
            w.add_tensor(t.name.clone(), t.ty, &t.shape, data.to_vec())
                .unwrap();
        }
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, w.to_bytes()).unwrap();
    std::fs::rename(&tmp, out).unwrap();
}

/// The Vulkan session (`gpu`), or the CPU reference, with a 64-token context.
fn load(file: &Arc<GgufFile>, gpu: bool) -> Box<dyn Forward> {
    let ctx = CtxRequest::Exact(64);
    let loaded = match gpu {
        true => generate::load(
            file,
            &LoadOptions {
                ctx,
                ..LoadOptions::default()
            },
        )
        .map(|l| Box::new(l.session) as Box<dyn Forward>),
        false => cpu_backend::load_reference(file, ctx).map(|(f, _)| f),
    };
    loaded.unwrap_or_else(|e| panic!("loading {} (gpu: {gpu}): {e}", file.path().display()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(v: &[f32]) -> u32 {
    reference::kernels::argmax(v) as u32
}

fn top2_gap(v: &[f32]) -> f32 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}

fn decodes_like_the_reference(name: &str, make: Make) {
    let path = model_in(name, make);
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let mut types: Vec<&str> = file.gguf().tensors.iter().map(|t| t.ty.name()).collect();
    types.sort_unstable();
    types.dedup();
    eprintln!("{name}: tensor types {types:?}");
    let tok = tokenizer::Tokenizer::from_gguf(file.gguf()).unwrap();
    // the GPU first: a type it does not read fails here with the load's own error
    let mut gpu = load(&file, true);
    let mut cpu = load(&file, false);
    for text in PROMPTS {
        let what = format!("{name} {text:?}");
        let prompt = tok.encode(text, false, false).unwrap();
        gpu.reset();
        cpu.reset();
        gpu.prefill(&prompt).unwrap();
        cpu.prefill(&prompt).unwrap();
        let first = max_diff(gpu.last_logits().unwrap(), cpu.last_logits().unwrap());
        assert!(
            first <= TOL,
            "{what}: first-position logits differ by {first} > {TOL}"
        );
        let mut worst = first;
        let mut ids = Vec::new();
        let mut gpu_next = gpu.last_argmax().unwrap();
        let mut ref_logits = cpu.last_logits().unwrap().to_vec();
        for step in 0..STEPS {
            let ref_next = argmax(&ref_logits);
            if gpu_next != ref_next {
                let gap = top2_gap(&ref_logits);
                assert!(
                    gap < TOL,
                    "{what}: step {step}: gpu {gpu_next} vs reference {ref_next} (greedy so far {ids:?}) with top-2 gap {gap} >= {TOL}"
                );
                eprintln!(
                    "{what}: diverged at step {step} on a top-2 gap of {gap} < {TOL}; stopping"
                );
                break;
            }
            ids.push(ref_next);
            ref_logits = cpu.decode_logits(ref_next).unwrap().to_vec();
            let g = gpu.decode_logits(ref_next).unwrap();
            worst = worst.max(max_diff(g, &ref_logits));
            gpu_next = argmax(g);
        }
        eprintln!(
            "{what}: first-position max |gpu - reference| {first:.2e}, {} greedy ids equal {ids:?}, max over the steps {worst:.2e}",
            ids.len()
        );
    }
}

/// A tiny llama model (dim 64) with one weight rewritten in a type the GPU does not read
/// (IQ4_NL: 18-byte blocks of 32; its bytes are not looked at).
fn with_unreadable_tensor(dir: &TempDir) -> PathBuf {
    let bytes = reference::synthetic::tiny_llama(7, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0);
    let g = Gguf::parse(&bytes).unwrap();
    let mut w = GgufWriter::new(g.alignment);
    for (k, v) in &g.metadata {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in &g.tensors {
        if t.name == "blk.1.ffn_down.weight" {
            let n = GgmlType::IQ4_NL.row_bytes(t.shape[0]).unwrap() * t.shape[1];
            w.add_tensor(
                t.name.clone(),
                GgmlType::IQ4_NL,
                &t.shape,
                vec![0x11; n as usize],
            )
            .unwrap();
        } else {
            w.add_tensor(
                t.name.clone(),
                t.ty,
                &t.shape,
                g.tensor_data(&bytes, t).to_vec(),
            )
            .unwrap();
        }
    }
    let path = dir.join("iq4_nl.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// `inspect` marks each tensor: the converted Q5_0 file's weights and norms are read,
/// the IQ4_NL weight is not (with the reason, in text and JSON), and says whether the
/// file as a whole runs on the GPU; running the IQ4_NL file is refused naming the tensor
/// and its type.
#[test]
fn inspect_marks_gpu_support_and_run_refuses_an_unreadable_type() {
    let dir = TempDir::new("types-gpu");
    let bad = with_unreadable_tensor(&dir);
    let o = vkdecode(&["inspect", "--json", bad.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let refusal = j["gpu_refusal"].as_str().unwrap();
    assert!(
        refusal.contains("blk.1.ffn_down.weight") && refusal.contains("IQ4_NL"),
        "{refusal}"
    );
    for t in j["tensors"].as_array().unwrap() {
        let bad_one = t["name"] == "blk.1.ffn_down.weight";
        assert_eq!(t["gpu"], !bad_one, "{t}");
        if bad_one {
            let why = t["gpu_why"].as_str().unwrap();
            assert!(
                why.contains("IQ4_NL is not read by the GPU kernels"),
                "{why}"
            );
        }
    }
    let text = vkdecode(&["inspect", bad.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("blk.1.ffn_down.weight"))
        .unwrap();
    assert!(
        line.contains("IQ4_NL") && line.contains("no: type IQ4_NL"),
        "{line}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("blk.1.ffn_up.weight"))
        .unwrap();
    assert!(line.trim_end().ends_with("yes"), "{line}");
    assert!(
        text.contains("gpu           refused: tensor `blk.1.ffn_down.weight`: type IQ4_NL"),
        "{text}"
    );

    let q5 = model_in("q5_0", Make::Convert("q5_0"));
    let o = vkdecode(&["inspect", "--json", q5.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tensors = j["tensors"].as_array().unwrap();
    assert!(tensors.iter().any(|t| t["type"] == "Q5_0"));
    assert!(
        tensors.iter().all(|t| t["gpu"] == true),
        "every tensor read"
    );
    assert!(j["gpu_refusal"].is_null(), "{}", j["gpu_refusal"]);

    let o = vkdecode(&["-m", bad.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("blk.1.ffn_down.weight") && err.contains("IQ4_NL"),
        "the refusal names the tensor and its type:\n{err}"
    );
}
