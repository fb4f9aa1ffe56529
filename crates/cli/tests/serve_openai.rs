//! `vkdecode serve` driven by the `openai` Python package, streaming and not, chat and
//! completions (crates/cli/tests/serve_openai.py does the talking). The package lives in
//! the test venv `.venv-test` that `scripts/setup` makes; without it the test fails
//! saying so, unless `VKDECODE_ALLOW_NO_VENV=1` (then it prints a note and passes).

mod serve_common;

use std::path::PathBuf;
use std::process::Command;

use serve_common::{cli_greedy, venv_python, Server};

#[test]
fn the_openai_package_talks_to_the_server() {
    let Some(python) = venv_python() else {
        return;
    };
    let s = Server::start(&["--parallel", "2", "-c", "512", "--api-key", "test-key"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_openai.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("BASE_URL", format!("http://{}/v1", s.addr))
        .env("API_KEY", "test-key")
        .output()
        .expect("run the test venv's python");
    assert!(
        out.status.success(),
        "serve_openai.py failed:\n{}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // what the package received is the CLI's greedy text
    assert_eq!(
        results["completion"],
        cli_greedy("The capital of France is", 8, &["-c", "512"]),
    );
    assert_eq!(
        results["chat"],
        cli_greedy(
            "What is the capital of France?",
            16,
            &["--chat", "-c", "512"]
        ),
    );
}
