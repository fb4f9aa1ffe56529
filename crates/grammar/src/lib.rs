//! Constrained decoding: grammars that restrict which tokens a model may sample.
//!
//! Three parts, independent of the engine:
//!
//! - **GBNF** ([`CompiledGrammar::from_gbnf`]): the grammar syntax llama.cpp documents in
//!   <https://github.com/ggml-org/llama.cpp/blob/master/grammars/README.md>. Grammars
//!   match Unicode code points of the UTF-8 output. Groups and repetitions are lowered to
//!   generated rules (`x{m,n}`: m copies then a chain of n-m optionals), so the compiled
//!   form is plain rules whose alternatives are runs of character sets and rule
//!   references. Left recursion (also through empty-matching prefixes) is refused at
//!   compile time.
//! - **JSON schema** ([`json_schema_to_gbnf`], [`CompiledGrammar::from_json_schema`]):
//!   a subset of JSON schema turned into GBNF text; any keyword that would constrain
//!   values but is not enforced is an error, never silently dropped. See [`json_schema`].
//! - **Token matcher** ([`Matcher`]): the per-request state that yields a [`TokenMask`] per
//!   step and advances by the sampled token. It holds its grammar and [`Vocab`] by `Arc`,
//!   so it can live in a request's task without borrowing from the engine.
//!
//! # The automaton
//!
//! The parser is a pushdown recogniser that keeps every live parse at once: a parse is a
//! stack of grammar positions (top = next character set to match, below = where to resume
//! when the rule above ends), and the state is the set of live stacks. Stacks are
//! hash-consed `(position, parent)` nodes, so they share tails, and stack sets are
//! interned, so a state is an integer. References in tail position do not push, so
//! repetitions loop in place and a JSON string keeps returning to the same state.
//!
//! Tokens are bytes, not characters, so the matcher runs a byte-level automaton on top:
//! a state is (stack set, bytes of an incomplete UTF-8 character). A partial character is
//! kept only if some code point it can still become is allowed by some stack, so a token
//! that ends mid-character is allowed exactly when a continuation exists. Each byte-level
//! state gets a 256-entry transition table, filled lazily; the automaton is a lazily
//! built DFA over stack sets.
//!
//! # Why the trie
//!
//! Tokens share prefixes (` the`, ` then`, ` there`). The vocabulary is stored once as a
//! byte trie laid out in depth-first pre-order, each node knowing where its subtree ends;
//! a mask is one forward scan from the current state, following cached transitions and
//! jumping over a whole subtree at the first byte no stack survives. A state's finished
//! mask is cached too, so the states a JSON value returns to over and over (inside a
//! string, between array items) cost a copy of the bitset. Masks and transitions live in
//! the [`Matcher`]; [`Matcher::reset`] reuses them for the next request with the same
//! grammar.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use grammar::{CompiledGrammar, Matcher, TokenMask, Vocab};
//!
//! // Token 0 ends generation; the others are byte strings.
//! let tokens: Vec<Vec<u8>> = vec![vec![], b"{\"".to_vec(), b"a\":".to_vec(), b"1}".to_vec(), b"x".to_vec()];
//! let vocab = Arc::new(Vocab::new(&tokens, &[0]));
//! let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}"#;
//! let grammar = Arc::new(CompiledGrammar::from_json_schema(schema)?);
//! let mut matcher = Matcher::new(grammar, vocab.clone())?;
//! let mut mask = TokenMask::new(vocab.len());
//! for expected in [1, 2, 3] {
//!     matcher.fill_mask(&mut mask)?;
//!     assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![expected]);
//!     matcher.accept(expected)?; // in the engine: the token sampled under the mask
//! }
//! matcher.fill_mask(&mut mask)?;
//! assert!(mask.is_allowed(0) && matcher.is_complete());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is exact
//!
//! The mask is exact: a token is allowed if and only if its bytes are a prefix of some
//! sentence of the grammar (with a pending partial character counted as allowed when a
//! completion exists), and end-of-generation only when the text is complete. It does not
//! look ahead further: a token can be allowed that leads to a state from which the
//! vocabulary cannot finish (only possible if the vocabulary lacks some characters).
//! Ambiguous grammars keep at most [`MAX_STACKS`] live stacks; beyond that matching
//! fails with [`MatchError::TooManyStacks`] instead of growing without bound.
#![forbid(unsafe_code)]

mod automaton;
mod charset;
mod compile;
mod error;
pub mod json_schema;
mod key_order;
mod mask;
mod matcher;
mod parse;
mod vocab;

pub use automaton::MAX_STACKS;
pub use compile::CompiledGrammar;
pub use error::{GrammarError, GrammarErrorKind, MatchError, SchemaError};
pub use json_schema::{
    json_schema_to_gbnf, json_schema_value_to_gbnf, ANY_JSON_OBJECT_GBNF, ANY_JSON_VALUE_GBNF,
};
pub use mask::TokenMask;
pub use matcher::Matcher;
pub use parse::MAX_REPEAT;
pub use vocab::Vocab;
