//! `vkdecode serve` driven by the `openai` Python package, streaming and not, chat and
//! completions (crates/cli/tests/serve_openai.py does the talking). The package lives in
//! the test venv `.venv-test` that `scripts/setup` makes; without it the test fails
//! saying so, unless `VKDECODE_ALLOW_NO_VENV=1` (then it prints a note and passes).

mod serve_common;

use std::path::PathBuf;
use std::process::Command;

use serve_common::{cli_greedy, venv_python, Server};

const CITY_PROMPT: &str =
    "Give the name, the country and the population in millions of the capital of France.";

/// The schema serve_openai.py sends as `response_format`.
const CITY_SCHEMA: &str = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "country": {"enum": ["France", "Germany", "Italy"]}, "population": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["name", "country", "population"], "additionalProperties": false}"#;

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
        .env("CITY_PROMPT", CITY_PROMPT)
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
    // structured output: the server's answer is the CLI's --json-schema answer
    assert_eq!(
        results["json_schema"],
        cli_greedy(
            CITY_PROMPT,
            60,
            &["--chat", "-c", "512", "--json-schema", CITY_SCHEMA]
        ),
    );
}
