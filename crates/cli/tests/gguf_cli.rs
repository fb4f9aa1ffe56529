//! `vkdecode inspect` and `vkdecode convert`, run as a user runs them: the built binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{dequantize_row, quantize_q8_0, GgmlType, Gguf, GgufWriter, Value, ValueType};
use sha2::{Digest, Sha256};

mod common;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn model(name: &str) -> PathBuf {
    let p = models_dir().join(name);
    assert!(
        p.is_file(),
        "model {} not found: run `models/fetch` first",
        p.display()
    );
    p
}

fn vkdecode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(args)
        .output()
        .expect("running vkdecode")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = vkdecode(args);
    assert!(
        out.status.success(),
        "vkdecode {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn inspect_json(path: &Path) -> serde_json::Value {
    let text = ok_stdout(&["inspect", "--json", path.to_str().unwrap()]);
    serde_json::from_str(&text).expect("inspect --json prints one JSON object")
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gguf_cli-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn inspect_json_lists_tensors_and_hyperparameters() {
    let j = inspect_json(&model("SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(j["tensor_count"], 272);
    assert_eq!(j["tensors"].as_array().unwrap().len(), 272);
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["version"], 3);
    assert_eq!(j["alignment"], 32);
    assert_eq!(j["file_size"], 98_362_432u64);
    let h = &j["hyperparameters"];
    assert_eq!(h["block_count"], 30);
    assert_eq!(h["embedding_length"], 576);
    assert_eq!(h["feed_forward_length"], 1536);
    assert_eq!(h["head_count"], 9);
    assert_eq!(h["head_count_kv"], 3);
    assert_eq!(h["rope_freq_base"].as_f64(), Some(100000.0));
    assert_eq!(h["context_length"], 8192);
    assert_eq!(h["vocab_size"], 49152);
    assert!((h["rms_eps"].as_f64().unwrap() - 1e-5).abs() < 1e-9);
    let t = &j["tokenizer"];
    assert_eq!(t["model"], "gpt2");
    assert_eq!(t["pre"], "smollm");
    assert_eq!(t["vocab_size"], 49152);
    assert_eq!(t["bos_token_id"], 1);
    assert_eq!(t["eos_token_id"], 2);
    assert_eq!(t["has_chat_template"], true);
    let totals = &j["totals_by_type"];
    assert_eq!(totals["Q4_1"]["count"], 210);
    assert_eq!(totals["F32"]["count"], 61);
    assert_eq!(totals["Q8_0"]["count"], 1);
    let down = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.ffn_down.weight")
        .expect("blk.0.ffn_down.weight listed");
    assert_eq!(down["type"], "Q4_1");
    assert_eq!(down["shape"], serde_json::json!([1536, 576]));
    assert_eq!(down["bytes"], 1536 / 32 * 20 * 576);
    // Offsets are absolute: past the header, inside the file.
    let off = down["offset"].as_u64().unwrap();
    assert!(off >= j["data_offset"].as_u64().unwrap() && off < 98_362_432);
}

#[test]
fn inspect_text_shows_the_same() {
    let text = ok_stdout(&[
        "inspect",
        model("SmolLM2-135M-Instruct.Q4_1.gguf").to_str().unwrap(),
    ]);
    for needle in [
        "block_count          30",
        "embedding_length     576",
        "head_count           9",
        "head_count_kv        3",
        "rope_freq_base       100000",
        "tensors (272)",
        "blk.29.attn_q.weight",
        "Q4_1    210 tensors",
        "chat_template        yes",
    ] {
        assert!(
            text.contains(needle),
            "inspect output lacks {needle:?}:\n{text}"
        );
    }
}

#[test]
fn q8_0_model_is_page_aligned_and_matches_llama_cpp() {
    let path = model("SmolLM2-135M-Instruct.Q8_0.gguf");
    let j = inspect_json(&path);
    assert_eq!(j["alignment"], 4096);
    assert_eq!(j["file_type"], 7);
    assert_eq!(j["tensor_count"], 272);
    let bytes = std::fs::read(&path).unwrap();
    let tensors = j["tensors"].as_array().unwrap();
    for t in tensors {
        let off = t["offset"].as_u64().unwrap();
        assert_eq!(off % 4096, 0, "{} at {off}", t["name"]);
        let want = if t["shape"].as_array().unwrap().len() == 2 {
            "Q8_0"
        } else {
            "F32"
        };
        assert_eq!(t["type"], want, "{}", t["name"]);
    }
    // The sha256 of these tensors' data in llama.cpp's `llama-quantize
    // --allow-requantize <Q4_1> <out> Q8_0` output.
    let expected = [
        (
            "blk.0.ffn_down.weight",
            "72e2d552eb2b5666c17dc8d70fbd8e0b0ec08d049c3243ed0460d3134959b3c2",
        ),
        (
            "blk.29.attn_q.weight",
            "be814af43c63264789aeed13acc55802b7fc8d6ad6a94dae67fae4933388e101",
        ),
        (
            "token_embd.weight",
            "0d728edd2a012d1663a6069567240d124c752bab88b6fcbe1a985eae428193c3",
        ),
    ];
    for (name, sha) in expected {
        let t = tensors.iter().find(|t| t["name"] == name).unwrap();
        let off = t["offset"].as_u64().unwrap() as usize;
        let len = t["bytes"].as_u64().unwrap() as usize;
        let got = format!("{:x}", Sha256::digest(&bytes[off..off + len]));
        assert_eq!(got, sha, "sha256 of {name}'s data");
    }
}

/// A small model with one tensor of each kind `convert` must handle.
fn synthetic() -> (GgufWriter, Vec<f32>, Vec<f32>) {
    let mut w = GgufWriter::new(32);
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_metadata("general.file_type", Value::U32(3));
    w.add_metadata("llama.block_count", Value::U32(1));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, vec![Value::String("a".into()); 3]),
    );
    w.add_metadata(
        "nested",
        Value::Array(
            ValueType::Array,
            vec![Value::Array(ValueType::I32, vec![Value::I32(-4)])],
        ),
    );
    let norm: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 64.0).collect();
    let weight: Vec<f32> = (0..64 * 3)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let f16: Vec<u8> = weight
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let q80 = quantize_q8_0(&weight).unwrap();
    let q40 = gguf::quant::quantize_q4_0(&weight).unwrap();
    let norm_bytes: Vec<u8> = norm.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor("norm.weight", GgmlType::F32, &[64], norm_bytes)
        .unwrap();
    w.add_tensor("f16.weight", GgmlType::F16, &[64, 3], f16)
        .unwrap();
    w.add_tensor("q4.weight", GgmlType::Q4_0, &[64, 3], q40)
        .unwrap();
    w.add_tensor("q8.weight", GgmlType::Q8_0, &[64, 3], q80)
        .unwrap();
    (w, norm, weight)
}

#[test]
fn convert_synthetic_model() {
    let dir = scratch("convert");
    let input = dir.join("in.gguf");
    let output = dir.join("out.gguf");
    let (w, _, _) = synthetic();
    std::fs::write(&input, w.to_bytes()).unwrap();
    let args = [
        "convert",
        input.to_str().unwrap(),
        output.to_str().unwrap(),
        "--type",
        "q8_0",
        "--align",
        "64",
    ];
    ok_stdout(&args);
    let inb = std::fs::read(&input).unwrap();
    let outb = std::fs::read(&output).unwrap();
    let gi = Gguf::parse(&inb).unwrap();
    let go = Gguf::parse(&outb).unwrap();
    assert_eq!(go.alignment, 64);
    assert_eq!(go.get_u32("general.alignment").unwrap(), 64);
    assert_eq!(go.get_u32("general.file_type").unwrap(), 7);
    // All other metadata copied as it was, in order.
    let strip = |g: &Gguf| -> Vec<(String, Value)> {
        g.metadata
            .iter()
            .filter(|(k, _)| k != "general.file_type" && k != "general.alignment")
            .cloned()
            .collect()
    };
    assert_eq!(strip(&go), strip(&gi));
    assert_eq!(go.tensors.len(), 4);
    for ti in &gi.tensors {
        let to = go.tensor(&ti.name).unwrap();
        assert_eq!(to.shape, ti.shape);
        assert_eq!(go.tensor_range(to).start % 64, 0);
        let old = gi.tensor_data(&inb, ti);
        let new = go.tensor_data(&outb, to);
        if ti.shape.len() == 1 || ti.ty == GgmlType::Q8_0 {
            assert_eq!(to.ty, ti.ty, "{}", ti.name);
            assert_eq!(new, old, "{} copied unchanged", ti.name);
        } else {
            assert_eq!(to.ty, GgmlType::Q8_0, "{}", ti.name);
            let x = dequantize_row(ti.ty, old, ti.n_elements() as usize).unwrap();
            assert_eq!(new, quantize_q8_0(&x).unwrap(), "{} requantised", ti.name);
        }
    }
    // No temporary file is left beside the output.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // Without --align, the input's alignment (32) is kept.
    ok_stdout(&args[..5]);
    let go = Gguf::parse(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(go.alignment, 32);
}

fn assert_fails(args: &[&str], needles: &[&str]) {
    let out = vkdecode(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "vkdecode {args:?} succeeded");
    for n in needles {
        assert!(err.contains(n), "stderr of {args:?} lacks {n:?}:\n{err}");
    }
}

#[test]
fn bad_inputs_fail_with_a_clear_message() {
    let dir = scratch("bad");
    let missing = dir.join("missing.gguf");
    let missing = missing.to_str().unwrap();
    assert_fails(&["inspect", missing], &["cannot open", "missing.gguf"]);
    let text = dir.join("notes.txt");
    std::fs::write(&text, "this is not a model\n").unwrap();
    let text = text.to_str().unwrap();
    assert_fails(&["inspect", text], &["not a GGUF file"]);
    assert_fails(
        &["inspect", "--json", dir.to_str().unwrap()],
        &["not a regular file"],
    );

    // A failed conversion leaves an existing output untouched.
    let out = dir.join("out.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let outs = out.to_str().unwrap();
    assert_fails(
        &["convert", text, outs, "--type", "q8_0"],
        &["not a GGUF file"],
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");

    let (w, _, _) = synthetic();
    let input = dir.join("in.gguf");
    std::fs::write(&input, w.to_bytes()).unwrap();
    let ins = input.to_str().unwrap();
    assert_fails(
        &["convert", ins, outs, "--align", "48"],
        &["--align 48", "power of two"],
    );
    assert_fails(
        &["convert", ins, outs, "--type", "q7_k"],
        &["invalid value 'q7_k'"],
    );
    let nodir = dir.join("no/such/dir/out.gguf");
    assert_fails(&["convert", ins, nodir.to_str().unwrap()], &["creating"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
}

/// sha256 of a file, to show it was not touched.
fn sha_of(p: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(p).unwrap()))
}

// `convert X X` replaced its input (exit 0). Fails before the fix.
#[test]
fn convert_refuses_to_write_over_its_input() {
    let dir = scratch("same-file");
    let (w, _, _) = synthetic();
    let input = dir.join("in.gguf");
    std::fs::write(&input, w.to_bytes()).unwrap();
    let before = sha_of(&input);
    let link = dir.join("link.gguf");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let hard = dir.join("hard.gguf");
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = dir.join(".").join("in.gguf");
    let ins = input.to_str().unwrap();
    for out in [&input, &link, &hard, &dotted] {
        assert_fails(
            &["convert", ins, out.to_str().unwrap()],
            &["onto itself", "same file"],
        );
        assert_eq!(
            sha_of(&input),
            before,
            "input changed by convert to {}",
            out.display()
        );
    }
    // The other way round too: the link as input, the real file as output.
    assert_fails(&["convert", link.to_str().unwrap(), ins], &["onto itself"]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(sha_of(&input), before);
    // A different file is fine.
    ok_stdout(&["convert", ins, dir.join("out.gguf").to_str().unwrap()]);
}

// `--align 1` wrote a file the engine refused ("tensor 0 starts at
// 1785697, not a multiple of 4"). Fails before the fix.
#[test]
fn convert_refuses_alignments_the_engine_cannot_use() {
    let dir = scratch("align");
    let (w, _, _) = synthetic();
    let input = dir.join("in.gguf");
    std::fs::write(&input, w.to_bytes()).unwrap();
    let (ins, out) = (input.to_str().unwrap(), dir.join("out.gguf"));
    let outs = out.to_str().unwrap();
    for bad in ["1", "2", "4", "0", "12", "4294967296"] {
        assert_fails(
            &["convert", ins, outs, "--align", bad],
            &[&format!("--align {bad}"), "power of two from 8"],
        );
        assert!(!out.exists(), "--align {bad} wrote a file");
    }
    for good in ["8", "4096"] {
        ok_stdout(&["convert", ins, outs, "--align", good]);
        let g = Gguf::parse(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(g.alignment.to_string(), good);
        for t in &g.tensors {
            assert_eq!(
                g.tensor_range(t).start % 4,
                0,
                "{} not word-aligned",
                t.name
            );
        }
    }
}

/// Sets the data offset of tensor `name` in a GGUF written by [`GgufWriter`].
fn set_tensor_offset(bytes: &mut [u8], name: &str, n_dims: usize, offset: u64) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor name in header");
    let field = at + key.len() + 4 + 8 * n_dims + 4;
    bytes[field..field + 8].copy_from_slice(&offset.to_le_bytes());
}

// Tensors aliasing one another's bytes made convert write many times
// the input. Refused (by convert's own bound, and by the reader once it refuses
// overlapping tensors). Fails before the fix.
#[test]
fn convert_refuses_aliased_tensors() {
    let dir = scratch("alias");
    let mut w = GgufWriter::new(32);
    w.add_metadata("general.architecture", Value::String("llama".into()));
    let q = quantize_q8_0(&vec![0.5f32; 256 * 4]).unwrap();
    w.add_tensor("a.weight", GgmlType::Q8_0, &[256, 4], q.clone())
        .unwrap();
    for i in 0..8 {
        w.add_tensor(
            format!("alias{i}.weight"),
            GgmlType::Q8_0,
            &[256, 4],
            q.clone(),
        )
        .unwrap();
    }
    let mut bytes = w.to_bytes();
    for i in 0..8 {
        set_tensor_offset(&mut bytes, &format!("alias{i}.weight"), 2, 0);
    }
    // Drop the bytes the aliases no longer use: the file now holds one tensor's data.
    let keep = bytes.len() - 8 * q.len().div_ceil(32) * 32;
    bytes.truncate(keep);
    let input = dir.join("in.gguf");
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.join("out.gguf");
    assert_fails(
        &["convert", input.to_str().unwrap(), out.to_str().unwrap()],
        &["overlap"],
    );
    assert!(!out.exists());
}

/// The types llama-quantize d775b8967 gives SmolLM2-135M's 211 weights (docs/facts.md,
/// "K-quants and row width"): the single K types fall back where rows are 576 wide, only
/// the 30 ffn_down (1536 wide) get the K type; the mixes follow its Q4_K_M/Q5_K_M rules.
#[test]
fn convert_default_model_to_every_type() {
    use GgmlType::*;
    let src = model("SmolLM2-135M-Instruct.Q8_0.gguf");
    let src_bytes = std::fs::read(&src).unwrap();
    let gs = Gguf::parse(&src_bytes).unwrap();
    let dir = scratch("types");
    let out = dir.join("out.gguf");
    // use_more_bits(i, 30): layers 0-2, 26-29 and every third from 5.
    let more = |l: usize| !(3..26).contains(&l) || (l - 3) % 3 == 2;
    let cases: [(&str, u32, GgmlType, GgmlType); 9] = [
        ("q4_k", 15, Q4_K, Q5_0),
        ("q5_k", 17, Q5_K, Q5_1),
        ("q6_k", 18, Q6_K, Q8_0),
        ("q3_k", 12, Q3_K, Q4_0),
        ("q2_k", 10, Q2_K, Q4_0),
        ("q5_0", 8, Q5_0, Q5_0),
        ("q5_1", 9, Q5_1, Q5_1),
        ("q4_k_m", 15, Q4_K, Q5_0),
        ("q5_k_m", 17, Q5_K, Q5_1),
    ];
    for (name, file_type, k, narrow) in cases {
        ok_stdout(&[
            "convert",
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            name,
        ]);
        let bytes = std::fs::read(&out).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.get_u32("general.file_type").unwrap(), file_type, "{name}");
        assert_eq!(g.tensors.len(), 272);
        let mixed = name.ends_with("_m");
        for t in &g.tensors {
            let n = &t.name;
            let layer: Option<usize> = n
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next()?.parse().ok());
            let want = if t.shape.len() == 1 {
                F32
            } else if mixed
                && (n == "token_embd.weight" || n.contains("attn_v") && more(layer.unwrap()))
            {
                // Q6_K for the tied output and these attn_v; 576 wide, it falls back.
                Q8_0
            } else if mixed && n.contains("ffn_down") && more(layer.unwrap()) {
                Q6_K
            } else if n.contains("ffn_down") {
                k
            } else {
                narrow
            };
            assert_eq!(t.ty, want, "{name}: {n}");
        }
        // The bytes are the reference quantiser's: dequantise the source, quantise.
        for n in ["blk.0.ffn_down.weight", "blk.7.attn_v.weight"] {
            let (ts, to) = (gs.tensor(n).unwrap(), g.tensor(n).unwrap());
            let x = dequantize_row(
                ts.ty,
                gs.tensor_data(&src_bytes, ts),
                ts.n_elements() as usize,
            )
            .unwrap();
            let want = gguf::quant::quantize(to.ty, &x).unwrap();
            assert!(
                g.tensor_data(&bytes, to) == want.as_slice(),
                "{name}: {n} bytes"
            );
        }
    }
}

/// `convert in.gguf /dev/null` (or onto a FIFO) wrote beside it and renamed the result
/// over it: the device node or FIFO became a regular file (as root, /dev/null itself).
/// An output that exists and is not a regular file is now refused, and left as it was.
#[test]
fn convert_refuses_an_output_that_is_not_a_regular_file() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("not-regular");
    let (w, _, _) = synthetic();
    let input = dir.join("in.gguf");
    std::fs::write(&input, w.to_bytes()).unwrap();
    let ins = input.to_str().unwrap();
    let fifo = dir.join("fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    assert_fails(
        &["convert", ins, fifo.to_str().unwrap()],
        &["fifo", "not a regular file"],
    );
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO was replaced"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Only once a FIFO is safe from it: a device node, and a directory.
    assert_fails(
        &["convert", ins, "/dev/null"],
        &["/dev/null", "not a regular file"],
    );
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert_fails(
        &["convert", ins, dir.to_str().unwrap()],
        &["not a regular file"],
    );
}

/// SIGTERM, SIGHUP or SIGINT while `convert` writes its output left the partial file
/// (`.<name>.tmp-<pid>`) beside it. Nothing is left now, and the status is 128 + the
/// signal (SIGKILL and `timeout`: signals_cli.rs).
#[test]
fn a_signal_during_convert_leaves_no_partial_file() {
    let input = model("SmolLM2-135M-Instruct.Q8_0.gguf");
    for (sig, code) in [("TERM", 143), ("HUP", 129), ("INT", 130)] {
        let dir = scratch(&format!("convert-{sig}"));
        let out = dir.join("out.gguf");
        let mut child = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
            .arg("convert")
            .arg(&input)
            .arg(&out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("running vkdecode convert");
        // the output is open once the conversion writes (it has no name until complete)
        let start = std::time::Instant::now();
        while !common::writes_into(child.id(), &dir) {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(120));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let caught = child.try_wait().unwrap().is_none();
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(st.success());
        let status = child.wait().unwrap();
        if !caught || status.success() {
            // it finished before the signal: nothing to check this round
            eprintln!("{sig}: convert finished first ({status})");
            continue;
        }
        assert_eq!(status.code(), Some(code), "{sig}: {status}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            left.is_empty(),
            "{sig}: left in the output's directory: {left:?}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
