//! The example grammars in `grammars/`: they compile and accept and reject known strings.

mod common;

use common::{accepts, compile};

fn load(name: &str) -> std::sync::Arc<grammar::CompiledGrammar> {
    let path = format!("{}/../../grammars/{name}", env!("CARGO_MANIFEST_DIR"));
    compile(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

fn check(name: &str, good: &[&str], bad: &[&str]) {
    let g = load(name);
    for s in good {
        assert!(accepts(&g, s), "{name} should accept {s:?}");
    }
    for s in bad {
        assert!(!accepts(&g, s), "{name} should reject {s:?}");
    }
}

#[test]
fn arithmetic() {
    check(
        "arithmetic.gbnf",
        &["1", "1 + 2", "(1+2)*3", "-4 / (2 - -3)", "10*0", "((7))"],
        &["", "1 +", "01", "(1", "1 ++ 2", "1  + 2", "a"],
    );
}

#[test]
fn list() {
    check(
        "list.gbnf",
        &["- a\n", "- milk\n- eggs 🥚\n", &"- x\n".repeat(10)],
        &["", "- \n", "- a", "* a\n", &"- x\n".repeat(11)],
    );
}

#[test]
fn json() {
    check(
        "json.gbnf",
        &[
            "{}",
            "[]",
            "{\"a\": [1, -2.5e+3, true, null], \"b\": {\"c\": \"\\u00e9\\n\"}}",
            "{\n  \"k\": \"日本\"\n}",
            "\"x\"",
            "-0.0",
        ],
        &[
            "{",
            "{\"a\" 1}",
            "[1,]",
            "01",
            "\"\\x\"",
            "\"a\nb\"",
            "{}  ",
            "tru",
            "{\"a\":1 , }",
        ],
    );
}

#[test]
fn chess() {
    check(
        "chess.gbnf",
        &[
            "1. e4 e5",
            "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6",
            "1. d4 Nf6\n2. c4 exd5+",
            "1. O-O O-O-O#",
            "1. e8=Q Rxe8",
        ],
        &[
            "1. e4",
            "1. e9 e5",
            "1. Zf3 e5",
            "2. e4 e5",
            "1. e4 e5\n9. a3 a6",
        ],
    );
}
