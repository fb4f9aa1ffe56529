//! Log-probabilities, `n` > 1, penalties, `logit_bias` and seeds through the `openai`
//! Python package (crates/cli/tests/serve_sampling.py does the talking; it needs the test
//! venv as serve_openai.rs does), then the CLI's llama-cli flags for the same controls,
//! whose output must equal the server's.

mod serve_common;

use std::path::PathBuf;
use std::process::Command;

use serve_common::{cli_greedy, venv_python, Server};

const LOOP: &str = "one two three one two three one two three one two three";
const PROMPT: &str = "The capital of France is";

#[test]
fn the_openai_package_gets_logprobs_choices_and_penalties() {
    let Some(python) = venv_python() else {
        return;
    };
    let s = Server::start(&["--parallel", "3", "-c", "512", "--api-key", "test-key"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_sampling.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("BASE_URL", format!("http://{}/v1", s.addr))
        .env("API_KEY", "test-key")
        .output()
        .expect("run the test venv's python");
    assert!(
        out.status.success(),
        "serve_sampling.py failed:\n{}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // the CLI's flags do what the request fields do
    let pen = &results["penalties"];
    let plain = cli_greedy(LOOP, 32, &[]);
    assert_eq!(pen[0], plain);
    for (i, flags) in [
        ["--frequency-penalty", "2"],
        ["--presence-penalty", "2"],
        ["--repeat-penalty", "1.5"],
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(pen[i + 1], cli_greedy(LOOP, 32, flags), "{flags:?}");
    }
    let banana = format!("{}+100", results["banana"]);
    assert_eq!(
        cli_greedy(PROMPT, 4, &["--logit-bias", &banana]),
        " banana".repeat(4)
    );
    let ban = format!("{}-inf", results["first"]);
    let greedy = cli_greedy(PROMPT, 4, &[]);
    let banned = cli_greedy(PROMPT, 4, &["--logit-bias", &ban]);
    assert_ne!(banned, greedy);
}

#[test]
fn the_cli_documents_and_checks_the_sampling_flags() {
    let help = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--repeat-penalty",
        "--repeat-last-n",
        "--presence-penalty",
        "--frequency-penalty",
        "--logit-bias <TOKEN_ID(+|-)BIAS>",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    for (flag, value) in [
        ("--frequency-penalty", "2.5"),
        ("--presence-penalty", "-3"),
        ("--logit-bias", "15043"),
        ("--logit-bias", "x+1"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
            .arg("-m")
            .arg(serve_common::q8())
            .args(["-p", "hi", "-n", "1", flag, value])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}
