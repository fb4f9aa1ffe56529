//! [`Tokenizer`]: text to ids and back, as llama.cpp's `llama_vocab::tokenize` and
//! `token_to_piece` do it.

use std::collections::HashMap;

use crate::bpe::{self, Merges};
use crate::pretokenize::{PreKind, PreTokenizer};
use crate::spm::{self, SpmVocab};
use crate::vocab::{attr, parse_byte_token, SpecialIds, TokenType, Vocab};
use crate::TokenizerError;

mod special;

/// The tokenization algorithm (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// `"gpt2"`: byte-level BPE with ranked merges.
    Bpe,
    /// `"llama"`: SentencePiece-style merges by score.
    Spm,
}

/// Everything a tokenizer is built from, as plain data. [`TokenizerSpec::from_gguf`]
/// reads it from metadata; tests can fill it by hand.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte); all normal when absent.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`, `"left right"`, highest priority first (BPE).
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; the model's default when absent.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; false when absent.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; true for SentencePiece when absent.
    pub add_space_prefix: Option<bool>,
}

fn opt<'g, T>(
    g: &'g gguf::Gguf,
    key: &str,
    read: impl FnOnce(&'g gguf::Gguf, &str) -> Result<T, gguf::GgufError>,
) -> Result<Option<T>, TokenizerError> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(read(g, key)?))
}

impl TokenizerSpec {
    /// Reads the `tokenizer.*` metadata. Required: `tokenizer.ggml.model`,
    /// `tokenizer.ggml.tokens`, and `tokenizer.ggml.merges` for `gpt2`.
    pub fn from_gguf(g: &gguf::Gguf) -> Result<TokenizerSpec, TokenizerError> {
        let model = g.get_str("tokenizer.ggml.model")?.to_string();
        if model != "gpt2" && model != "llama" {
            return Err(TokenizerError::UnknownModel(model));
        }
        let tokens = g
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let merges = if model == "gpt2" {
            g.get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };
        let scores = match opt(g, "tokenizer.ggml.scores", gguf::Gguf::get_f32_array) {
            Ok(s) => s,
            // llama.cpp also accepts integer scores.
            Err(_) => opt(g, "tokenizer.ggml.scores", gguf::Gguf::get_i32_array)?
                .map(|v| v.into_iter().map(|s| s as f32).collect()),
        };
        let id = |key: &str| opt(g, key, gguf::Gguf::get_u32);
        Ok(TokenizerSpec {
            pre: opt(g, "tokenizer.ggml.pre", |g, k| {
                g.get_str(k).map(str::to_string)
            })?,
            token_types: opt(g, "tokenizer.ggml.token_type", gguf::Gguf::get_i32_array)?,
            scores,
            merges,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            eom_id: id("tokenizer.ggml.eom_token_id")?,
            add_bos: opt(g, "tokenizer.ggml.add_bos_token", gguf::Gguf::get_bool)?,
            add_eos: opt(g, "tokenizer.ggml.add_eos_token", gguf::Gguf::get_bool)?,
            add_space_prefix: opt(g, "tokenizer.ggml.add_space_prefix", gguf::Gguf::get_bool)?,
            model,
            tokens,
        })
    }
}

#[derive(Debug)]
enum Algo {
    Bpe {
        pre: PreTokenizer,
        merges: Merges,
        byte_chars: Box<[char; 256]>,
    },
    Spm,
}

/// A piece of input: raw text (a byte range) or a special token cut out whole.
#[derive(Debug, Clone, Copy)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// A tokenizer built from GGUF metadata.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    algo: Algo,
    model: Model,
    pre_name: Option<String>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// What each token contributes to decoded text (llama.cpp's piece cache).
    bytes: Vec<Box<[u8]>>,
}

impl Tokenizer {
    /// Builds the tokenizer described by the file's `tokenizer.*` metadata.
    pub fn from_gguf(g: &gguf::Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(TokenizerSpec::from_gguf(g)?)
    }

    /// Builds a tokenizer from plain data.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer, TokenizerError> {
        let model = match spec.model.as_str() {
            "gpt2" => Model::Bpe,
            "llama" => Model::Spm,
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
        // llama.cpp's defaults per model, used when the metadata has no id.
        let defaults = match model {
            Model::Bpe => SpecialIds {
                bos: Some(11),
                eos: Some(11),
                ..SpecialIds::default()
            },
            Model::Spm => SpecialIds {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..SpecialIds::default()
            },
        };
        let given = SpecialIds {
            bos: spec.bos_id,
            eos: spec.eos_id,
            unk: spec.unk_id,
            pad: spec.pad_id,
            eot: spec.eot_id,
            eom: spec.eom_id,
        };
        let vocab = Vocab::new(
            spec.tokens,
            spec.token_types.as_deref(),
            spec.scores.as_deref(),
            &given,
            &defaults,
        )?;
        let (algo, default_add_bos) = match model {
            Model::Bpe => {
                let kind = PreKind::from_name(spec.pre.as_deref())?;
                let algo = Algo::Bpe {
                    pre: PreTokenizer::new(kind)?,
                    merges: Merges::new(spec.merges.iter().map(String::as_str)),
                    byte_chars: Box::new(bpe::byte_to_char_table()),
                };
                (algo, kind.default_add_bos())
            }
            Model::Spm => (Algo::Spm, true),
        };
        let add_bos = spec.add_bos.unwrap_or(default_add_bos);
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && vocab.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_bos_token",
                id_key: "tokenizer.ggml.bos_token_id",
            });
        }
        if add_eos && vocab.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_eos_token",
                id_key: "tokenizer.ggml.eos_token_id",
            });
        }
        let add_space_prefix = spec.add_space_prefix.unwrap_or(model == Model::Spm);
        let bytes = token_bytes_table(&vocab, model);
        Ok(Tokenizer {
            vocab,
            algo,
            model,
            pre_name: spec.pre,
            add_bos,
            add_eos,
            add_space_prefix,
            bytes,
        })
    }

    /// Turns text into ids. `add_special`: add BOS (and EOS) as the metadata says.
    /// `parse_special`: control tokens written in the text (`<|im_start|>`) become their
    /// ids; otherwise they are tokenized as plain text. User-defined tokens are always
    /// matched whole. A chat prompt should go through [`encode_chat`](Self::encode_chat)
    /// instead, which parses specials in the template's markup only.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_protected(text, add_special, parse_special, &[])
    }

    /// [`encode`](Self::encode), where no control or unknown token may be cut out of a
    /// byte range in `protected` (sorted, disjoint).
    fn encode_protected(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        protected: &[std::ops::Range<usize>],
    ) -> Result<Vec<u32>, TokenizerError> {
        let fragments = self.partition(text, parse_special, protected);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.vocab.bos);
        }
        match &self.algo {
            Algo::Bpe {
                pre,
                merges,
                byte_chars,
            } => {
                let mut word = String::new();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => {
                            for (s, e) in pre.split(&text[a..b])? {
                                word.clear();
                                word.extend(
                                    text[a + s..a + e].bytes().map(|b| byte_chars[b as usize]),
                                );
                                self.bpe_word(&word, pre.kind(), merges, &mut out);
                            }
                        }
                    }
                }
            }
            Algo::Spm => {
                // A space is prefixed to the first text fragment and to every fragment
                // after a special token (llama.cpp's `is_prev_special`).
                let mut prev_special = true;
                let mut escaped = String::new();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(a, b) => {
                            escaped.clear();
                            if self.add_space_prefix && prev_special {
                                escaped.push('▁');
                            }
                            escaped.extend(text[a..b].chars().map(|c| {
                                if c == ' ' {
                                    '▁'
                                } else {
                                    c
                                }
                            }));
                            self.spm_text(&escaped, &mut out)?;
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.vocab.eos);
        }
        Ok(out)
    }

    fn bpe_word(&self, word: &str, kind: PreKind, merges: &Merges, out: &mut Vec<u32>) {
        if kind.ignore_merges() {
            if let Some(id) = self.vocab.get(word) {
                out.push(id);
                return;
            }
        }
        bpe::merge_word(word, merges, |piece| match self.vocab.get(piece) {
            Some(id) => out.push(id),
            // A merge result missing from the vocabulary: llama.cpp looks each of its
            // bytes up as a one-byte token and drops those it cannot find.
            None => {
                for (i, b) in piece.bytes().enumerate() {
                    if b.is_ascii() {
                        out.extend(self.vocab.get(&piece[i..i + 1]));
                    }
                }
            }
        });
    }

    fn spm_text(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut failed = None;
        spm::merge(text, &self.vocab, |piece| match piece {
            Ok(id) => out.push(id),
            Err(piece) => {
                for b in piece.bytes() {
                    let id = self
                        .vocab
                        .byte_token(b)
                        .or_else(|| {
                            b.is_ascii()
                                .then(|| self.vocab.get(&(b as char).to_string()))
                                .flatten()
                        })
                        .or(self.vocab.unk);
                    match id {
                        Some(id) => out.push(id),
                        None => failed = Some(TokenizerError::NoByteToken { byte: b }),
                    }
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ids back to text: every token's bytes (control tokens as their text),
    /// concatenated; only invalid UTF-8 is replaced (U+FFFD). Ids outside the
    /// vocabulary contribute nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes_ref(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Like [`decode`](Self::decode), but drops the one space a SentencePiece model
    /// puts before the first word (`add_space_prefix`), as `llama_detokenize` does:
    /// `detokenize(encode(s, false, false)) == s`.
    pub fn detokenize(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let b = self.token_bytes_ref(id);
            let b = match b.split_first() {
                Some((b' ', rest)) if i == 0 && self.add_space_prefix => rest,
                _ => b,
            };
            bytes.extend_from_slice(b);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The token's raw vocabulary string (`Ġthe`, `▁the`, `<|im_end|>`).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The bytes this token contributes to text (possibly part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }

    /// [`token_bytes`](Self::token_bytes) without the copy; empty for unknown ids.
    pub fn token_bytes_ref(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| b)
    }

    /// The id of the token spelled exactly `text` in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text)
    }

    /// The stored type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        let a = *self.vocab.attrs.get(id as usize)?;
        Some(if a & attr::NORMAL != 0 {
            TokenType::Normal
        } else if a & attr::BYTE != 0 {
            TokenType::Byte
        } else if a & attr::USER_DEFINED != 0 {
            TokenType::UserDefined
        } else if a & attr::UNKNOWN != 0 {
            TokenType::Unknown
        } else if a & attr::CONTROL != 0 {
            TokenType::Control
        } else if a & attr::UNUSED != 0 {
            TokenType::Unused
        } else {
            TokenType::Undefined
        })
    }

    /// Whether `id` is a control or unknown token (not text a user would see).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    /// The SentencePiece score of `id` (0 for BPE vocabularies).
    pub fn score(&self, id: u32) -> Option<f32> {
        self.vocab.scores.get(id as usize).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn model(&self) -> Model {
        self.model
    }

    /// `tokenizer.ggml.pre`, as stored.
    pub fn pre_name(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Whether generation stops at `id`: EOS, EOT, and the tokens llama.cpp recognises
    /// by text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The number of BPE merges (0 for SentencePiece).
    pub fn n_merges(&self) -> usize {
        match &self.algo {
            Algo::Bpe { merges, .. } => merges.len(),
            Algo::Spm => 0,
        }
    }
}

impl SpmVocab for Vocab {
    fn lookup(&self, text: &str) -> Option<(u32, f32)> {
        let id = self.get(text)?;
        Some((id, self.scores[id as usize]))
    }
}

/// llama.cpp's `token_to_piece(.., special = true)` for every token.
fn token_bytes_table(vocab: &Vocab, model: Model) -> Vec<Box<[u8]>> {
    let byte_of: HashMap<char, u8> = bpe::char_to_byte_map(&bpe::byte_to_char_table());
    vocab
        .texts
        .iter()
        .zip(&vocab.attrs)
        .map(|(text, &a)| -> Box<[u8]> {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                text.as_bytes().into()
            } else if a & attr::NORMAL != 0 {
                match model {
                    Model::Spm => text.replace('▁', " ").into_bytes().into(),
                    // Characters outside GPT-2's byte table (llama.cpp prints an
                    // UNK_BYTE marker for them) are kept as their own UTF-8.
                    Model::Bpe => {
                        let mut out = Vec::with_capacity(text.len());
                        for c in text.chars() {
                            match byte_of.get(&c) {
                                Some(&b) => out.push(b),
                                None => {
                                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes())
                                }
                            }
                        }
                        out.into()
                    }
                }
            } else if a & attr::BYTE != 0 {
                match parse_byte_token(text) {
                    Some(b) => Box::new([b]),
                    None => text.as_bytes().into(),
                }
            } else {
                // Unused and undefined tokens print nothing.
                Box::new([])
            }
        })
        .collect()
}
