//! Pre-tokenizers: how text is cut into words before byte-level BPE merges run.
//!
//! Each pre-tokenizer is the list of regular expressions that llama.cpp applies for the
//! `tokenizer.ggml.pre` name (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`). They run in
//! sequence: the first cuts the text into chunks, the next cuts every chunk on its own,
//! and so on. Text between two matches is kept as a chunk of its own, exactly as
//! llama.cpp's `unicode_regex_split` does, and a look-ahead never sees past the end of
//! its chunk (llama.cpp's custom GPT-2 splitter treats the chunk end as end of text).

use fancy_regex::Regex;

use crate::TokenizerError;

/// Longest run of one character class (letter, digit, space, other) handed to the
/// regexes whole. fancy-regex's backtracking VM keeps one stack entry per repeated
/// character and gives up at a million ("Max stack size exceeded for backtracking"),
/// so a longer run is cut into pieces of this many characters first. Text without
/// such a run, which is all real text, is split exactly as llama.cpp splits it.
pub const MAX_RUN_CHARS: usize = 4096;

/// GPT-2's pattern (llama.cpp has a hand-written matcher for exactly this regex).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's pattern, with `(?i:'s|...)` spelled out as llama.cpp adapts it.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: like Llama 3's but digits one at a time.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The names of `tokenizer.ggml.pre` this crate knows (llama.cpp's spellings).
pub const SUPPORTED: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "phi-2",
    "mpt",
    "olmo",
    "smollm",
    "starcoder",
    "refact",
    "codeshell",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "falcon3",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
];

/// Which pre-tokenizer family a `tokenizer.ggml.pre` name selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreKind {
    /// llama.cpp's fallback for files without `tokenizer.ggml.pre`.
    Default,
    /// GPT-2 (also mpt, olmo, phi-2).
    Gpt2,
    /// Every digit alone, then GPT-2 (smollm, starcoder, refact, codeshell).
    Smollm,
    /// Llama 3 (`llama-bpe`): runs of up to three digits; whole words found in the
    /// vocabulary skip the merges.
    Llama3,
    /// Qwen2: every digit alone.
    Qwen2,
}

impl PreKind {
    /// The kind for a `tokenizer.ggml.pre` name; `None` (key absent) is llama.cpp's default.
    pub fn from_name(name: Option<&str>) -> Result<PreKind, TokenizerError> {
        Ok(match name {
            None | Some("default") => PreKind::Default,
            Some("gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo") => PreKind::Gpt2,
            Some("smollm" | "starcoder" | "refact" | "codeshell") => PreKind::Smollm,
            Some("llama-bpe" | "llama3" | "llama-v3" | "falcon3") => PreKind::Llama3,
            Some("qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez") => PreKind::Qwen2,
            Some(other) => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        })
    }

    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreKind::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            PreKind::Gpt2 => &[GPT2],
            PreKind::Smollm => &[r"\p{N}", GPT2],
            PreKind::Llama3 => &[LLAMA3],
            PreKind::Qwen2 => &[QWEN2],
        }
    }

    /// Whether a word that is itself a vocabulary token is taken whole, without merges
    /// (llama.cpp's `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        self == PreKind::Llama3
    }

    /// The BOS default before `tokenizer.ggml.add_bos_token` is read.
    pub fn default_add_bos(self) -> bool {
        self == PreKind::Llama3
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    kind: PreKind,
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    pub fn new(kind: PreKind) -> Result<PreTokenizer, TokenizerError> {
        let regexes = kind
            .patterns()
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| TokenizerError::Regex {
                    pattern: p.to_string(),
                    source: Box::new(e),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { kind, regexes })
    }

    pub fn kind(&self) -> PreKind {
        self.kind
    }

    /// Cuts `text` into words, returned as byte ranges in order that cover all of it.
    pub fn split(&self, text: &str) -> Result<Vec<(usize, usize)>, TokenizerError> {
        let mut chunks = cut_long_runs(text);
        let mut next = Vec::new();
        for (re, pattern) in self.regexes.iter().zip(self.kind.patterns()) {
            next.clear();
            for &(start, end) in &chunks {
                let chunk = &text[start..end];
                let mut last = 0;
                for m in re.find_iter(chunk) {
                    let m = m.map_err(|e| TokenizerError::Regex {
                        pattern: pattern.to_string(),
                        source: Box::new(e),
                    })?;
                    if m.start() > last {
                        next.push((start + last, start + m.start()));
                    }
                    if m.end() > m.start() {
                        next.push((start + m.start(), start + m.end()));
                    }
                    last = m.end();
                }
                if last < chunk.len() {
                    next.push((start + last, end));
                }
            }
            std::mem::swap(&mut chunks, &mut next);
        }
        Ok(chunks)
    }
}

/// The character classes the patterns tell apart.
fn class(c: char) -> u8 {
    if c.is_alphabetic() {
        0
    } else if c.is_numeric() {
        1
    } else if c.is_whitespace() {
        2
    } else {
        3
    }
}

/// `text` as one chunk, or, when it holds a run of one class longer than
/// [`MAX_RUN_CHARS`], as chunks cut every [`MAX_RUN_CHARS`] characters of such a run.
fn cut_long_runs(text: &str) -> Vec<(usize, usize)> {
    let mut chunks = Vec::new();
    let (mut start, mut run_class, mut run_len) = (0, u8::MAX, 0);
    for (i, c) in text.char_indices() {
        let k = class(c);
        if k != run_class {
            (run_class, run_len) = (k, 0);
        }
        if run_len == MAX_RUN_CHARS {
            chunks.push((start, i));
            (start, run_len) = (i, 0);
        }
        run_len += 1;
    }
    chunks.push((start, text.len()));
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreKind, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(kind).unwrap();
        pre.split(text)
            .unwrap()
            .into_iter()
            .map(|(a, b)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn smollm_splits_every_digit() {
        assert_eq!(
            words(PreKind::Smollm, "is 3.14, -42"),
            ["is", " ", "3", ".", "1", "4", ",", " -", "4", "2"]
        );
    }

    #[test]
    fn gpt2_keeps_digit_runs_and_contractions() {
        assert_eq!(
            words(PreKind::Gpt2, "it's 1234 ok"),
            ["it", "'s", " 1234", " ok"]
        );
    }

    #[test]
    fn whitespace_run_leaves_one_space_for_the_next_word() {
        assert_eq!(words(PreKind::Gpt2, "a    b"), ["a", "   ", " b"]);
        assert_eq!(words(PreKind::Gpt2, "a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(words(PreKind::Gpt2, "end  "), ["end", "  "]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(
            words(PreKind::Llama3, "x 12345\n\n  y"),
            ["x", " ", "123", "45", "\n\n", " ", " y"]
        );
    }

    #[test]
    fn unknown_name_is_an_error_naming_it() {
        let err = PreKind::from_name(Some("klingon")).unwrap_err();
        assert!(err.to_string().contains("'klingon'"), "{err}");
    }

    #[test]
    fn a_million_letter_word_splits_without_a_regex_error() {
        // A crafted input once gave "Max stack size exceeded for backtracking".
        for (kind, unit) in [
            (PreKind::Smollm, "a"),
            (PreKind::Gpt2, " "),
            (PreKind::Llama3, "é"),
            (PreKind::Qwen2, "-"),
            (PreKind::Default, "7"),
        ] {
            let text = unit.repeat(1_000_000);
            let pre = PreTokenizer::new(kind).unwrap();
            let parts = pre.split(&text).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            let mut at = 0;
            for &(a, b) in &parts {
                assert_eq!(a, at, "{kind:?}: gap or overlap");
                assert!(text[a..b].chars().count() <= MAX_RUN_CHARS, "{kind:?}");
                at = b;
            }
            assert_eq!(at, text.len());
        }
        // Runs up to the limit are left whole.
        let text = "b".repeat(MAX_RUN_CHARS);
        assert_eq!(
            words(PreKind::Gpt2, &format!("x {text}")),
            ["x", &format!(" {text}")]
        );
    }

    #[test]
    fn split_covers_the_text() {
        let text = "Ünïcödé 日本語 🎉🎉  \n\t x = f(y);";
        for kind in [
            PreKind::Default,
            PreKind::Gpt2,
            PreKind::Smollm,
            PreKind::Llama3,
            PreKind::Qwen2,
        ] {
            assert_eq!(words(kind, text).concat(), text, "{kind:?}");
        }
    }
}
