//! GBNF parsing and compilation: every construct, and error positions.

mod common;

use common::{accepts, compile};
use grammar::{CompiledGrammar, GrammarErrorKind};

fn err(src: &str) -> (usize, usize, GrammarErrorKind) {
    let e = CompiledGrammar::from_gbnf(src).expect_err("must not compile");
    (e.line, e.column, e.kind)
}

#[test]
fn literals_and_escapes() {
    let g = compile(r#"root ::= "a\n\t\r\\\"\x41\u00e9\U0001F642""#);
    assert!(accepts(&g, "a\n\t\r\\\"Aé🙂"));
    assert!(!accepts(&g, "a\n\t\r\\\"Aé"));
    let g = compile("root ::= \"日本\"");
    assert!(accepts(&g, "日本"));
    assert!(!accepts(&g, "日"));
}

#[test]
fn classes_ranges_negation_and_any() {
    let g = compile("root ::= [a-z0-9_] [^a-c\\]] .");
    assert!(accepts(&g, "x_z"));
    assert!(accepts(&g, "0d日"));
    assert!(!accepts(&g, "xa1"));
    assert!(!accepts(&g, "x]1"));
    assert!(!accepts(&g, "Xd1"));
    let g = compile("root ::= [-a] [a-]");
    assert!(accepts(&g, "--"));
    assert!(accepts(&g, "aa"));
    let g = compile("root ::= [\\x00-\\x1F\\u00e9]");
    assert!(accepts(&g, "\u{1}"));
    assert!(accepts(&g, "é"));
    assert!(!accepts(&g, " "));
}

#[test]
fn alternation_grouping_and_references() {
    let g = compile(
        "root ::= greet (\" \" name)?\ngreet ::= \"hi\" | \"hello\"\nname ::= [A-Z] [a-z]*",
    );
    for ok in ["hi", "hello", "hi Bob", "hello X"] {
        assert!(accepts(&g, ok), "{ok}");
    }
    for bad in ["", "hey", "hi ", "hi bob", "hihello"] {
        assert!(!accepts(&g, bad), "{bad}");
    }
}

#[test]
fn repetitions() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("root ::= \"a\"*", &["", "a", "aaaa"], &["b"]),
        ("root ::= \"a\"+", &["a", "aaa"], &[""]),
        ("root ::= \"a\"?", &["", "a"], &["aa"]),
        ("root ::= \"ab\"{2}", &["abab"], &["ab", "ababab"]),
        ("root ::= [0-9]{2,}", &["12", "12345"], &["1"]),
        ("root ::= [0-9]{1,3}", &["1", "12", "123"], &["", "1234"]),
        (
            "root ::= (\"x\" | \"yz\"){0,2}",
            &["", "x", "yzx", "xx"],
            &["xxx", "y"],
        ),
        ("root ::= [a]{ 0 , 1 }", &["", "a"], &["aa"]),
    ];
    for (src, good, bad) in cases {
        let g = compile(src);
        for s in *good {
            assert!(accepts(&g, s), "{src} should accept {s:?}");
        }
        for s in *bad {
            assert!(!accepts(&g, s), "{src} should reject {s:?}");
        }
    }
}

#[test]
fn comments_and_multi_line_rules() {
    let g = compile(
        "# leading comment\nroot ::= # after the operator\n  \"a\" # a\n  | \"b\"\n    \"c\" # continued\nother ::= \"z\" # unused\n",
    );
    assert!(accepts(&g, "a"));
    assert!(accepts(&g, "bc"));
    assert!(!accepts(&g, "b"));
}

#[test]
fn right_recursion_and_nesting() {
    let g = compile("root ::= \"(\" root \")\" | \"\"");
    assert!(accepts(&g, "((()))"));
    assert!(!accepts(&g, "(()"));
}

#[test]
fn error_positions() {
    assert_eq!(
        err("root ::= foo"),
        (1, 10, GrammarErrorKind::UnknownRule("foo".into()))
    );
    assert_eq!(err("a ::= \"x\"\n"), (1, 1, GrammarErrorKind::MissingRoot));
    assert_eq!(
        err("root ::= \"x\"\n\nb ::= \"abc"),
        (3, 7, GrammarErrorKind::UnterminatedLiteral)
    );
    assert_eq!(
        err("root ::= [a-z"),
        (1, 10, GrammarErrorKind::UnterminatedClass)
    );
    assert!(matches!(
        err("root ::=\n  \"a\\q\""),
        (2, 5, GrammarErrorKind::BadEscape(_))
    ));
    assert!(matches!(
        err("root ::= \"\\x4\""),
        (1, 11, GrammarErrorKind::BadEscape(_))
    ));
    assert!(matches!(
        err("root ::= \"\\uD800\""),
        (1, 11, GrammarErrorKind::BadEscape(_))
    ));
    assert!(matches!(
        err("root ::= \"a\"{3,2}"),
        (1, 13, GrammarErrorKind::BadRepetition(_))
    ));
    assert!(matches!(
        err("root ::= \"a\"{1,99999}"),
        (1, 13, GrammarErrorKind::BadRepetition(_))
    ));
    assert!(matches!(
        err("root ::= \"a\"{x}"),
        (1, 14, GrammarErrorKind::Expected { .. })
    ));
    assert!(matches!(
        err("root ::= [z-a]"),
        (1, 12, GrammarErrorKind::EmptyRange { lo: 'z', hi: 'a' })
    ));
    assert!(matches!(
        err("root ::= (\"a\" | \"b\""),
        (1, 20, GrammarErrorKind::Expected { .. })
    ));
    assert!(matches!(
        err("root ::= \"a\"\nroot ::= \"b\""),
        (2, 1, GrammarErrorKind::DuplicateRule(_))
    ));
    assert!(matches!(
        err("root = \"a\""),
        (1, 6, GrammarErrorKind::Expected { .. })
    ));
    assert!(matches!(
        err("root ::= \"a\" @"),
        (1, 14, GrammarErrorKind::Expected { .. })
    ));
    let e = CompiledGrammar::from_gbnf("root ::= foo").unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 1, column 10: reference to unknown rule `foo`"
    );
}

#[test]
fn left_recursion_is_refused() {
    assert_eq!(
        err("root ::= root \"a\" | \"a\""),
        (1, 1, GrammarErrorKind::LeftRecursion("root".into()))
    );
    assert_eq!(
        err("root ::= x\nx ::= y? root\ny ::= \"y\""),
        (1, 1, GrammarErrorKind::LeftRecursion("root".into()))
    );
    assert!(matches!(
        err("root ::= (\"a\"?)*"),
        (_, _, GrammarErrorKind::LeftRecursion(_))
    ));
}

#[test]
fn generated_names_do_not_clash_with_user_rules() {
    let g = compile("root ::= \"a\"* root-1\nroot-1 ::= \"b\"");
    assert!(accepts(&g, "aab"));
    assert!(!accepts(&g, "aa"));
}
