//! The vocabulary: token texts, scores, types, special ids, and what each token
//! contributes to decoded text. Mirrors the parts of llama.cpp's `llama_vocab::load`
//! that decide token behaviour.

use std::collections::HashMap;

use crate::TokenizerError;

/// A token's type as stored in `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`, BOS, EOS): matched whole only when special
    /// tokens are parsed.
    Control,
    /// 4: a user-defined token: always matched whole in text.
    UserDefined,
    /// 5: unused.
    Unused,
    /// 6: a byte token `<0xXX>`.
    Byte,
    /// Anything else.
    Undefined,
}

impl TokenType {
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Attribute bits (llama.cpp's `llama_token_attr`): a token can gain `CONTROL` on top
/// of its stored type when its text marks it as an end-of-generation token.
pub(crate) mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const CONTROL: u8 = 4;
    pub const USER_DEFINED: u8 = 8;
    pub const UNUSED: u8 = 16;
    pub const BYTE: u8 = 32;
}

fn type_attr(t: TokenType) -> u8 {
    match t {
        TokenType::Normal => attr::NORMAL,
        TokenType::Unknown => attr::UNKNOWN,
        TokenType::Control => attr::CONTROL,
        TokenType::UserDefined => attr::USER_DEFINED,
        TokenType::Unused => attr::UNUSED,
        TokenType::Byte => attr::BYTE,
        TokenType::Undefined => 0,
    }
}

/// Texts llama.cpp treats as end-of-generation whatever the metadata says
/// (`special_eog_ids`), plus its FIM pad/repo/separator tokens.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP: &[&str] = &["<|file_sep|>"];

/// The raw vocabulary with its attributes and special ids resolved.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u8>,
    pub ids: HashMap<String, u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// End-of-generation ids, sorted.
    pub eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first (ties: lower id):
    /// the order in which they are cut out of text.
    pub specials: Vec<u32>,
}

/// Special ids as given by metadata, before defaults are applied.
#[derive(Debug, Default, Clone)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
}

impl Vocab {
    pub fn new(
        mut texts: Vec<String>,
        types: Option<&[i32]>,
        scores: Option<&[f32]>,
        given: &SpecialIds,
        defaults: &SpecialIds,
    ) -> Result<Vocab, TokenizerError> {
        let n = texts.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if let Some(t) = types {
            if t.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.token_type",
                    expected: n,
                    found: t.len(),
                });
            }
        }
        if let Some(s) = scores {
            if s.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.scores",
                    expected: n,
                    found: s.len(),
                });
            }
        }
        let mut ids = HashMap::with_capacity(n);
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                // llama.cpp's name for an empty entry, so it can never match text.
                *text = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(text.clone(), i as u32) {
                return Err(TokenizerError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: i as u32,
                });
            }
        }
        let mut attrs: Vec<u8> = match types {
            Some(t) => t[..n]
                .iter()
                .map(|&v| type_attr(TokenType::from_i32(v)))
                .collect(),
            None => vec![attr::NORMAL; n],
        };
        let scores = match scores {
            Some(s) => s[..n].to_vec(),
            None => vec![0.0; n],
        };

        // A metadata id outside the vocabulary is an error (llama.cpp warns and falls
        // back to its default, which silently gave BOS id 11); a default outside it is
        // dropped.
        let pick = |key: &'static str, g: Option<u32>, d: Option<u32>| match g {
            Some(id) if (id as usize) >= n => Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id,
                n_vocab: n,
            }),
            Some(id) => Ok(Some(id)),
            None => Ok(d.filter(|&id| (id as usize) < n)),
        };
        let bos = pick("tokenizer.ggml.bos_token_id", given.bos, defaults.bos)?;
        let eos = pick("tokenizer.ggml.eos_token_id", given.eos, defaults.eos)?;
        let unk = pick("tokenizer.ggml.unknown_token_id", given.unk, defaults.unk)?;
        let pad = pick("tokenizer.ggml.padding_token_id", given.pad, defaults.pad)?;
        let eot = pick("tokenizer.ggml.eot_token_id", given.eot, None)?;
        let eom = pick("tokenizer.ggml.eom_token_id", given.eom, None)?;

        let find_first = |list: &[&str]| list.iter().filter_map(|t| ids.get(*t).copied()).min();
        let mut eog: Vec<u32> = Vec::new();
        for list in [FIM_PAD, FIM_REP, FIM_SEP] {
            eog.extend(find_first(list));
        }
        eog.extend(EOG_TEXTS.iter().filter_map(|t| ids.get(*t).copied()));
        for &id in &eog {
            attrs[id as usize] |= attr::CONTROL;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Vocab {
            texts,
            scores,
            attrs,
            ids,
            bos,
            eos,
            unk,
            pad,
            eog,
            specials,
        })
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u8 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    pub fn get(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The id of byte token `<0xXX>`, if the vocabulary has one.
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        self.get(&format!("<0x{b:02X}>"))
    }
}

/// Parses a byte token's text `<0xXX>`.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
