//! `vkdecode chat` driven through stdin (not a terminal: one message per line) on the
//! default model: two turns, the second prefilling only its new tokens (`/stats`) and
//! answering exactly as the one-shot CLI does on the same rendered prompt (greedy); then
//! `/system` and `/clear` start a new conversation and `/quit` ends the session. And
//! Ctrl-C (SIGINT to the `vkdecode` process, as a terminal sends it) stops the answer
//! being written, not the program.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{collect, q8, signal, vkdecode, wait_for, Tag, TAG_ENV};
use tokenizer::{ChatTemplate, Message, Tokenizer};

/// (prompt tokens, prefilled, reused) from a `/stats` line.
fn turn_counts(line: &str) -> (usize, usize, usize) {
    let num = |key: &str| -> usize {
        let at = line
            .find(key)
            .unwrap_or_else(|| panic!("{key:?} in {line:?}"))
            + key.len();
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    (num("prompt "), num("(prefilled "), num(", reused "))
}

#[test]
fn chat_reuses_the_cache_between_turns_and_answers_as_the_one_shot_cli() {
    let model = q8();
    let file = gguf::GgufFile::open(&model).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    let template = ChatTemplate::from_gguf(file.gguf()).unwrap().unwrap();
    let render = |messages: &[Message]| {
        engine::generate::chat_prompt_ids(&tok, &template, messages, false).unwrap()
    };
    let (q1, q2) = ("What is the capital of France?", "And of Germany?");

    let model_arg = model.to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args([
            "chat", "-m", model_arg, "--temp", "0", "-n", "24", "-c", "512",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!(
        "{q1}\n/stats\n{q2}\n/stats\n/system You answer in one word.\n/clear\nHi\n/stats\n/help\n/quit\nnot read\n"
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}\nstdout: {stdout}");

    // answer 1, [stats], answer 2, [stats], notices, answer 3, [stats], help
    let parts: Vec<&str> = stdout.split("[stats] ").collect();
    assert_eq!(parts.len(), 4, "three /stats lines in {stdout:?}");
    let answer1 = parts[0].strip_suffix('\n').unwrap();
    let (stats1, rest) = parts[1].split_once('\n').unwrap();
    let answer2 = rest.strip_suffix('\n').unwrap();
    let (stats2, rest) = parts[2].split_once('\n').unwrap();
    assert!(rest.starts_with("[system message set; new conversation]\n[conversation cleared]\n"));
    let (stats3, help) = parts[3].split_once('\n').unwrap();
    assert!(help.contains("/system TEXT") && !stdout.contains("not read"));
    assert!(!answer1.is_empty() && !answer2.is_empty());

    // turn 1: the whole prompt prefilled
    let p1 = render(&[Message::new("user", q1)]);
    assert_eq!(turn_counts(stats1), (p1.len(), p1.len(), 0), "{stats1}");
    // turn 2: the conversation so far is reused, only the new turn prefilled
    let history = [
        Message::new("user", q1),
        Message::new("assistant", answer1),
        Message::new("user", q2),
    ];
    let p2 = render(&history);
    let (n, prefilled, reused) = turn_counts(stats2);
    assert_eq!(n, p2.len(), "{stats2}");
    assert!(
        reused >= p1.len(),
        "turn 2 reused {reused} < turn 1's {}",
        p1.len()
    );
    assert_eq!(prefilled, n - reused);
    assert!(prefilled <= p2.len() - p1.len(), "{stats2}");
    // turn 3, after /system and /clear: the new system prompt, one user message
    let p3 = render(&[
        Message::new("system", "You answer in one word."),
        Message::new("user", "Hi"),
    ]);
    assert_eq!(turn_counts(stats3).0, p3.len(), "{stats3}");

    // the one-shot CLI on turn 2's rendered prompt answers the same (greedy)
    let ids: Vec<String> = p2.iter().map(u32::to_string).collect();
    let ids = ids.join(",");
    let one = vkdecode(&[
        "-m",
        model_arg,
        "--prompt-ids",
        &ids,
        "--temp",
        "0",
        "-n",
        "24",
        "-c",
        "512",
    ]);
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let one = String::from_utf8(one.stdout).unwrap();
    assert_eq!(one.strip_suffix('\n').unwrap(), answer2);
}

#[test]
fn ctrl_c_stops_the_answer_not_the_chat() {
    let model = q8();
    // supervised, as a user runs it: the signal goes to the vkdecode process, which
    // passes it on to its worker
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(["chat", "-m", model.to_str().unwrap(), "--temp", "0"])
        .args(["-n", "400", "-c", "1024"])
        .env_remove("VKDECODE_WORKER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"Write a very long essay about the history of Rome.\n")
        .unwrap();
    // the answer has begun (400 tokens take far longer than this wait)
    wait_for("the answer to begin", &stdout, |s| s.len() >= 40);
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_for("[stopped]", &stderr, |s| s.contains("[stopped]"));
    let stopped_at = stdout.lock().unwrap().len();

    // the chat goes on: the next message is answered, then /quit leaves with status 0
    stdin.write_all(b"What is 2+2?\n/quit\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let out = stdout.lock().unwrap().clone();
    let err = stderr.lock().unwrap().clone();
    assert!(status.success(), "{status}\nstderr: {err}\nstdout: {out}");
    let essay = &out[..stopped_at];
    let answer = out[stopped_at..].trim();
    assert!(
        essay.split_whitespace().count() < 300,
        "the essay was not cut short: {essay:?}"
    );
    assert!(answer.contains('4'), "the next answer: {answer:?}");
    assert_eq!(err.matches("[stopped]").count(), 1, "stderr: {err}");
}

/// One line that was not valid UTF-8 ended the whole session ("reading stdin: stream did
/// not contain valid UTF-8", exit 1), losing the conversation; and a line had no length
/// limit (a 100 MB line was tokenised in full, 975 MB resident, before it was refused).
/// Now both are reported and the session goes on; the long line is refused as it is
/// read, without holding it in memory.
#[test]
fn a_bad_or_huge_line_is_refused_and_the_chat_goes_on() {
    let model = q8();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(["chat", "-m", model.to_str().unwrap(), "--temp", "0"])
        .args(["-n", "8", "-c", "512"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Hello\n").unwrap();
    stdin.flush().unwrap();
    wait_for("the first answer", &stdout, |s| s.contains('\n'));
    let hwm = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before_kb = hwm(pid);

    stdin.write_all(b"caf\xe9 au lait\n").unwrap();
    stdin.flush().unwrap();
    wait_for("the UTF-8 refusal", &stderr, |s| {
        s.contains("not valid UTF-8")
    });

    // 64 MiB in one line, written from a thread (the reader may refuse it before the end)
    let mut writer = stdin;
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..64 {
            writer.write_all(&chunk).ok()?;
        }
        writer.write_all(b"\n").ok()?;
        Some(writer)
    });
    wait_for("the long-line refusal", &stderr, |s| s.contains("too long"));
    let mut writer = feeder
        .join()
        .unwrap()
        .expect("the chat reads past the long line");
    let grown_kb = hwm(pid).saturating_sub(before_kb);
    assert!(
        grown_kb < 32 << 10,
        "the peak resident memory grew by {grown_kb} KiB on a 64 MiB line"
    );
    let answered = stdout.lock().unwrap().len();
    writer.write_all(b"What is 2+2?\n/quit\n").unwrap();
    drop(writer);
    let status = child.wait().unwrap();
    let out = stdout.lock().unwrap().clone();
    let err = stderr.lock().unwrap().clone();
    assert!(status.success(), "{status}\nstderr: {err}\nstdout: {out}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !out[answered..].trim().is_empty(),
        "the question after the refused lines is answered: {out}"
    );
}

/// Whether this process ignores SIGHUP (started under `nohup`): a child inherits that, so
/// a hang-up is then meant not to end it.
fn hangups_are_ignored() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGHUP - 1)) != 0)
}

/// SIGTERM, SIGHUP or SIGKILL while an answer is being written ends the chat within 2 s,
/// leaving no process behind (chat runs in the process the user started). Under `nohup`
/// the chat inherits an ignored SIGHUP, as it should, and the hang-up case is skipped.
#[test]
fn a_signal_during_an_answer_leaves_no_process() {
    let model = q8();
    for sig in ["TERM", "HUP", "KILL"] {
        if sig == "HUP" && hangups_are_ignored() {
            eprintln!("note: SIGHUP is ignored here (nohup?): the hang-up case is skipped");
            continue;
        }
        let tag = Tag::new(&format!("chat-{sig}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
            .args(["chat", "-m", model.to_str().unwrap(), "--temp", "0"])
            .args(["-n", "400", "-c", "1024"])
            .env(TAG_ENV, &tag.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = collect(child.stdout.take().unwrap());
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"Write a very long essay about the history of Rome.\n")
            .unwrap();
        wait_for("the answer to begin", &stdout, |s| s.len() >= 20);
        assert!(signal(child.id(), sig));
        let left = tag.wait_gone(std::time::Duration::from_secs(2));
        assert!(left.is_empty(), "{sig}: still running: {left:?}");
        let status = child.wait().unwrap();
        assert!(!status.success(), "{sig}: {status}");
    }
}
