//! The chat page at `/` in a real browser: headless Chromium driven by selenium from the
//! test venv (crates/cli/tests/chat_page.py does the clicking) against `vkdecode serve`
//! on the default model, with and without `--api-key`. Two greedy turns (one sent with
//! Enter, one with the button) stream into the page, the second request carries the
//! whole conversation, the stop button ends a long reply, the server's 401 shows in the
//! page, and the browser's console has no errors. Over raw HTTP: the page needs no key,
//! and the page's own origin passes the server's Origin check.
//!
//! Needs Chromium and its driver (`scripts/setup` installs Debian's `chromium` and
//! `chromium-driver`; `VKDECODE_CHROMIUM` and `VKDECODE_CHROMEDRIVER` name others) and
//! `selenium` in `.venv-test`. Without them the browser part fails saying what is
//! missing, unless `VKDECODE_ALLOW_NO_BROWSER=1` (then it prints a note and passes).

mod serve_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serve_common::{cli_greedy, Server};

const KEY: &str = "page-key";

/// What the browser part needs.
struct Browser {
    python: PathBuf,
    chromium: PathBuf,
    driver: PathBuf,
}

/// The first of `env`'s value and `candidates` that exists.
fn find(env: &str, candidates: &[PathBuf]) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(format!("{env}={} does not exist", p.display()))
        };
    }
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| {
            let names: Vec<_> = candidates.iter().map(|p| p.display().to_string()).collect();
            format!("none of {} exists (or set {env})", names.join(", "))
        })
}

/// Chromium, chromedriver and the venv's python with selenium; `None` (after a note) when
/// one is missing and `VKDECODE_ALLOW_NO_BROWSER=1`.
fn browser() -> Option<Browser> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv-test/bin/python");
    // GitHub's Ubuntu images carry Google Chrome and name its driver's folder
    let github_driver =
        std::env::var_os("CHROMEWEBDRIVER").map(|d| Path::new(&d).join("chromedriver"));
    let found = (|| {
        let chromium = find(
            "VKDECODE_CHROMIUM",
            &["/usr/bin/chromium", "/usr/bin/google-chrome"].map(PathBuf::from),
        )?;
        let mut drivers = vec![PathBuf::from("/usr/bin/chromedriver")];
        drivers.extend(github_driver);
        let driver = find("VKDECODE_CHROMEDRIVER", &drivers)?;
        let has_selenium = python.exists()
            && Command::new(&python)
                .args(["-c", "import selenium"])
                .status()
                .is_ok_and(|s| s.success());
        if !has_selenium {
            return Err(format!("{} cannot import selenium", python.display()));
        }
        Ok(Browser {
            python: python.clone(),
            chromium,
            driver,
        })
    })();
    match found {
        Ok(b) => Some(b),
        Err(why) if std::env::var("VKDECODE_ALLOW_NO_BROWSER").is_ok_and(|v| v == "1") => {
            eprintln!("note: {why}; skipping the browser (VKDECODE_ALLOW_NO_BROWSER=1)");
            None
        }
        Err(why) => panic!(
            "{why}: run scripts/setup (it installs chromium and chromium-driver, and selenium \
             into .venv-test), or set VKDECODE_ALLOW_NO_BROWSER=1 to skip the browser"
        ),
    }
}

/// Runs chat_page.py against `s`; what the page showed.
fn drive(b: &Browser, s: &Server, key: Option<&str>) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chat_page.py");
    let mut cmd = Command::new(&b.python);
    cmd.arg(&script)
        .env("PAGE_URL", format!("http://{}/", s.addr))
        .env("CHROMIUM", &b.chromium)
        .env("CHROMEDRIVER", &b.driver)
        .env_remove("API_KEY");
    if let Some(k) = key {
        cmd.env("API_KEY", k);
    }
    let out = cmd.output().expect("run the test venv's python");
    assert!(
        out.status.success(),
        "chat_page.py failed:\n{}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "chat_page.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The greedy answer to the page's first question, as the CLI gives it.
fn first_answer() -> String {
    cli_greedy(
        "What is the capital of France?",
        24,
        &["--chat", "-c", "512"],
    )
}

#[test]
fn the_page_chats_streams_and_stops() {
    let Some(b) = browser() else {
        return;
    };
    let s = Server::start(&["-c", "512"]);
    let results = drive(&b, &s, None);
    let replies = results["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 2, "{results}");
    assert_eq!(replies[0]["text"], first_answer(), "{results}");
    assert!(results["stopped"].as_str().is_some(), "{results}");
}

#[test]
fn the_page_works_with_an_api_key() {
    let s = Server::start(&["-c", "512", "--api-key", KEY]);
    // the page itself needs no key
    let page = s.get("/");
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/html")));
    assert!(page
        .header("content-security-policy")
        .is_some_and(|c| c.contains("connect-src 'self'")));
    assert!(page.text().contains("SmolLM2-135M-Instruct.Q8_0"));
    assert!(page.text().contains("id=\"prompt\""));
    // what the page sends: Origin http:// + the Host it came from passes, without CORS
    // headers; the same Origin under another Host is another site's
    let chat = br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}"#;
    let bearer = format!("Bearer {KEY}");
    let origin = format!("http://{}", s.addr);
    let post = |host: &str| {
        let mut req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n\
             Authorization: {bearer}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            chat.len()
        )
        .into_bytes();
        req.extend_from_slice(chat);
        s.raw(&req)
    };
    let same = post(&s.addr);
    assert_eq!(same.status, 200, "same origin: {}", same.text());
    assert!(
        !same
            .headers
            .iter()
            .any(|(k, _)| k.starts_with("access-control-")),
        "{:?}",
        same.headers
    );
    let other = post("localhost");
    assert_eq!(
        other.status,
        403,
        "Origin {origin} under Host localhost: {}",
        other.text()
    );

    let Some(b) = browser() else {
        return;
    };
    let results = drive(&b, &s, Some(KEY));
    assert_eq!(results["replies"].as_array().unwrap().len(), 2, "{results}");
    assert_eq!(results["replies"][0]["text"], first_answer(), "{results}");
}
