//! Special tokens in text: cutting them out whole (llama.cpp's
//! `tokenizer_st_partition`), and keeping a chat's message content plain text so that
//! only the template's own markup becomes control tokens.

use std::ops::Range;

use super::{Fragment, Tokenizer};
use crate::vocab::attr;
use crate::{RenderedChat, TokenizerError};

impl Tokenizer {
    /// Encodes a prompt rendered by [`ChatTemplate::render_chat`](crate::ChatTemplate):
    /// special tokens written by the template become their ids, while message content
    /// is plain text (`<|im_start|>` typed by a user stays the characters
    /// `<|im_start|>`), unless `parse_special_in_content`. User-defined tokens are
    /// matched everywhere, as in [`encode`](Self::encode).
    ///
    /// When the template changed the content so that its place in the output is unknown
    /// ([`RenderedChat::content_ranges`] is `None`), the prompt is encoded with specials
    /// parsed if it holds the same special tokens as the template's output without the
    /// content ([`RenderedChat::marked_text`]), and refused with
    /// [`TokenizerError::UnprotectableContent`] otherwise.
    pub fn encode_chat(
        &self,
        chat: &RenderedChat,
        add_special: bool,
        parse_special_in_content: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if parse_special_in_content {
            return self.encode(chat.text(), add_special, true);
        }
        if let Some(ranges) = chat.content_ranges() {
            return self.encode_protected(chat.text(), add_special, true, ranges);
        }
        // Safe only if the specials in the prompt are the ones the template writes by
        // itself (those of the marked render; without one, none from any content).
        let specials = |text: &str| -> Vec<u32> {
            self.partition(text, true, &[])
                .into_iter()
                .filter_map(|f| match f {
                    Fragment::Token(id) if self.is_special(id) => Some(id),
                    _ => None,
                })
                .collect()
        };
        let got = specials(chat.text());
        let first_extra = match chat.marked_text() {
            Some(marked) => {
                let own = specials(marked);
                let diff = got
                    .iter()
                    .zip(&own)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(own.len()));
                (got != own)
                    .then(|| got.get(diff).or(own.get(diff)).copied())
                    .flatten()
            }
            None => chat
                .contents()
                .iter()
                .find_map(|c| specials(c).first().copied()),
        };
        if let Some(id) = first_extra {
            return Err(TokenizerError::UnprotectableContent {
                token: self.vocab.texts[id as usize].clone(),
            });
        }
        self.encode(chat.text(), add_special, true)
    }

    /// Cuts special tokens out of `text`, longest first, as llama.cpp's
    /// `tokenizer_st_partition` does. Control and unknown tokens only when
    /// `parse_special`, and never where they would overlap a `protected` range.
    pub(super) fn partition(
        &self,
        text: &str,
        parse_special: bool,
        protected: &[Range<usize>],
    ) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0, text.len()));
        let mut next = Vec::new();
        for &id in &self.vocab.specials {
            let control = self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0;
            if control && !parse_special {
                continue;
            }
            let blocked =
                |s: usize, e: usize| control && protected.iter().any(|r| r.start < e && s < r.end);
            let special = self.vocab.texts[id as usize].as_str();
            next.clear();
            for &f in &fragments {
                let Fragment::Text(a, b) = f else {
                    next.push(f);
                    continue;
                };
                let hay = &text[a..b];
                let (mut last, mut from) = (0, 0);
                while let Some(rel) = hay[from..].find(special) {
                    let pos = from + rel;
                    if blocked(a + pos, a + pos + special.len()) {
                        // Stays text; a match starting inside it may still be allowed.
                        from = pos + hay[pos..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    if pos > last {
                        next.push(Fragment::Text(a + last, a + pos));
                    }
                    next.push(Fragment::Token(id));
                    last = pos + special.len();
                    from = last;
                }
                if a + last < b {
                    next.push(Fragment::Text(a + last, b));
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}
