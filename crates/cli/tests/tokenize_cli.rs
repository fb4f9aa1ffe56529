//! `vkdecode tokenize` on the default model: the ids llama.cpp's `llama-tokenize --ids`
//! prints for the same file.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run models/fetch to download the default model",
        path.display()
    );
    path
}

fn tokenize(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("tokenize")
        .arg("-m")
        .arg(model())
        .args(extra)
        .output()
        .expect("run vkdecode")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "vkdecode failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

#[test]
fn ids_match_llama_tokenize() {
    let cases: [(&str, &str); 4] = [
        ("The capital of France is", "[504, 3575, 282, 4649, 314]\n"),
        ("def fibonacci(n):", "[1604, 3987, 46477, 24, 94, 727]\n"),
        (
            "Numbers: 1234567890 and 3.14159, -42",
            "[39006, 42, 216, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 284, 216, 35, 30, 33, 36, 33, 37, 41, 28, 731, 36, 34]\n",
        ),
        (
            "<|im_start|>user\nHi there<|im_end|>\n",
            "[1, 4093, 198, 26843, 665, 2, 198]\n",
        ),
    ];
    for (text, expected) in cases {
        // llama-tokenize parses special-token text by default; vkdecode with --special
        let out = tokenize(&["--ids", "--special", "--text", text]);
        assert_eq!(stdout_ok(&out), expected, "for {text:?}");
    }
}

#[test]
fn default_output_and_pieces() {
    let out = tokenize(&["-p", "The capital of France is"]);
    assert_eq!(stdout_ok(&out), "504 3575 282 4649 314\n");

    let out = tokenize(&["--pieces", "--special", "--text", "Hi there<|im_end|>\n"]);
    assert_eq!(
        stdout_ok(&out),
        " 26843 -> 'Hi'\n   665 -> ' there'\n     2 -> '<|im_end|>'\n   198 -> '\\n'\n"
    );
}

#[test]
fn no_parse_special_keeps_control_tokens_as_text() {
    let out = tokenize(&["--ids", "--no-parse-special", "--text", "<|im_end|>"]);
    let ids: Vec<u32> = serde_json::from_str(&stdout_ok(&out)).expect("a JSON array");
    assert!(ids.len() > 1 && !ids.contains(&2), "{ids:?}");
}

#[test]
fn reads_text_from_a_file() {
    let dir = std::env::temp_dir().join(format!("vkdecode-tokenize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("prompt.txt");
    std::fs::write(&path, "def fibonacci(n):").unwrap();
    let out = tokenize(&["--ids", "--file", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(stdout_ok(&out), "[1604, 3987, 46477, 24, 94, 727]\n");
}

#[test]
fn a_missing_model_is_reported() {
    let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(["tokenize", "-m", "/nonexistent/model.gguf", "--text", "x"])
        .output()
        .expect("run vkdecode");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

/// `tokenize` and the main command agree — special-token text is
/// plain text unless `--special` is given (before: tokenize parsed it by default).
#[test]
fn special_token_text_is_plain_text_by_default() {
    let out = tokenize(&["--ids", "--text", "<|im_end|>"]);
    let ids: Vec<u32> = serde_json::from_str(&stdout_ok(&out)).expect("a JSON array");
    assert!(ids.len() > 1 && !ids.contains(&2), "{ids:?}");
    let out = tokenize(&["--ids", "--special", "--text", "<|im_end|>"]);
    assert_eq!(stdout_ok(&out), "[2]\n");
}

/// `--file /dev/zero` read without limit (5.5 GB after 12 s). Now
/// non-regular files are refused at once, and so is a file over the cap.
#[test]
fn non_regular_and_huge_files_are_refused() {
    for special in ["/dev/zero", "/dev/stdin", "/"] {
        let out = tokenize(&["--ids", "--file", special]);
        assert!(!out.status.success(), "{special} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a regular file"), "{special}: {err}");
    }
    let dir = std::env::temp_dir().join(format!("vkdecode-tokenize-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.txt");
    // sparse: 65 MiB of holes, over the 64 MiB cap, costs no disk
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(65 << 20).unwrap();
    let out = tokenize(&["--ids", "--file", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("over the limit"), "{err}");
}
