//! The crate's one error type.

/// Everything that can go wrong building a tokenizer, encoding text or rendering a chat
/// template. Messages name the metadata key, token or id involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key could not be read (missing, or of the wrong type).
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] gguf::GgufError),

    #[error("unknown tokenizer model '{0}' (tokenizer.ggml.model); supported: gpt2, llama")]
    UnknownModel(String),

    #[error("unknown pre-tokenizer '{0}' (tokenizer.ggml.pre); supported: {supported}", supported = crate::pretokenize::SUPPORTED.join(", "))]
    UnknownPreTokenizer(String),

    #[error("{key} has {found} entries, but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        expected: usize,
        found: usize,
    },

    #[error("duplicate token {text:?} in the vocabulary: ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },

    #[error("the vocabulary is empty (tokenizer.ggml.tokens)")]
    EmptyVocabulary,

    #[error("{flag} is true, but {id_key} names no token")]
    MissingSpecialToken {
        flag: &'static str,
        id_key: &'static str,
    },

    #[error("byte 0x{byte:02X} has no token (neither <0x{byte:02X}> nor an unknown token exists)")]
    NoByteToken { byte: u8 },

    #[error("pre-tokenizer regex /{pattern}/: {source}")]
    Regex {
        pattern: String,
        #[source]
        source: Box<fancy_regex::Error>,
    },

    #[error("chat template stopped: {0}")]
    TemplateLimit(crate::chat::TemplateLimit),

    #[error("{key} is {id}, but the vocabulary has only {n_vocab} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u32,
        n_vocab: usize,
    },

    #[error("the chat template changes message text so that it cannot be kept plain text, and the prompt then holds a special token the template did not write ({token:?}); remove it from the messages, or allow special tokens in messages")]
    UnprotectableContent { token: String },

    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
}
