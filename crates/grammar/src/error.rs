//! Typed errors for grammar compilation, JSON schema conversion and matching.

/// A grammar that cannot be compiled, with the 1-based position it was found at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {kind}")]
pub struct GrammarError {
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based column (in characters) of the offending text.
    pub column: usize,
    /// What is wrong.
    pub kind: GrammarErrorKind,
}

/// What is wrong with a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarErrorKind {
    #[error("expected {expected}, found {found}")]
    Expected {
        expected: &'static str,
        found: String,
    },
    #[error("unterminated literal")]
    UnterminatedLiteral,
    #[error("unterminated character class")]
    UnterminatedClass,
    #[error("bad escape sequence: {0}")]
    BadEscape(String),
    #[error("bad repetition bounds: {0}")]
    BadRepetition(String),
    #[error("empty character range {lo:?}-{hi:?}")]
    EmptyRange { lo: char, hi: char },
    #[error("reference to unknown rule `{0}`")]
    UnknownRule(String),
    #[error("rule `{0}` is defined twice")]
    DuplicateRule(String),
    #[error("no `root` rule")]
    MissingRoot,
    #[error("rule `{0}` is left-recursive (possibly through a rule or repetition that matches the empty string)")]
    LeftRecursion(String),
    #[error("grammar too large: {0}")]
    TooLarge(String),
}

/// A JSON schema that cannot be turned into a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema text is not JSON.
    #[error("schema is not valid JSON: {0}")]
    Json(String),
    /// A keyword this converter does not enforce; ignoring it would let invalid output through.
    #[error("unsupported keyword `{keyword}` at {path}")]
    Unsupported { keyword: String, path: String },
    /// A keyword whose value is malformed or outside what the converter handles.
    #[error("invalid `{keyword}` at {path}: {message}")]
    Invalid {
        keyword: String,
        path: String,
        message: String,
    },
    /// A `$ref` that does not point into `#/$defs/` or `#/definitions/` of the root schema.
    #[error("unresolvable $ref `{reference}` at {path}")]
    BadRef { reference: String, path: String },
    /// The generated grammar failed to compile (a bug in the converter if it ever happens).
    #[error("generated grammar does not compile: {0}")]
    Grammar(#[from] GrammarError),
}

/// A token or state the matcher cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error("token {0} is out of the vocabulary")]
    UnknownToken(u32),
    #[error("token {token} is not allowed by the grammar here")]
    Rejected { token: u32 },
    #[error("end-of-generation token {token} before the grammar is complete")]
    NotComplete { token: u32 },
    #[error("mask covers {mask} tokens but the vocabulary has {vocab}")]
    MaskSize { mask: usize, vocab: usize },
    #[error("generation already ended")]
    Finished,
    /// The grammar is ambiguous enough that the parse needs more live stacks than allowed.
    #[error("more than {limit} live parse stacks: the grammar is too ambiguous")]
    TooManyStacks { limit: usize },
}
