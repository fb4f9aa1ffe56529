//! SentencePiece-style BPE over scores (`tokenizer.ggml.model = "llama"`), as
//! llama.cpp's `llm_tokenizer_spm_session` runs it.
//!
//! Spaces are written `▁` (U+2581) before this runs. The text starts as one symbol per
//! character; repeatedly the adjacent pair whose concatenation is a vocabulary token
//! with the highest score is joined (ties: the leftmost). A final symbol that is not a
//! token falls back to byte tokens `<0xXX>`.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::symbols::{join, pieces, split_chars, Symbol};

/// The vocabulary lookups the merge loop needs.
pub trait SpmVocab {
    /// The id and score of the token spelled `text`.
    fn lookup(&self, text: &str) -> Option<(u32, f32)>;
}

/// A pair candidate ordered by score (higher first), then position (leftmost first).
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(Reverse(self.left).cmp(&Reverse(other.left)))
    }
}

/// Runs the score-based merges over `text` and calls `emit` with each final piece; a
/// piece that is a token is passed as `Ok(id)`, one that is not as `Err(text)` (the
/// caller spells it in byte tokens).
pub fn merge(text: &str, vocab: &impl SpmVocab, mut emit: impl FnMut(Result<u32, &str>)) {
    let mut symbols = split_chars(text);
    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: usize| {
        if let Some(r) = syms[l].next {
            let size = syms[l].len + syms[r].len;
            let start = syms[l].start;
            if let Some((_, score)) = vocab.lookup(&text[start..start + size]) {
                heap.push(Bigram {
                    score,
                    left: l,
                    right: r,
                    size,
                });
            }
        }
    };
    for i in 0..symbols.len().saturating_sub(1) {
        push(&mut heap, &symbols, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left, b.right);
        if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != b.size {
            continue;
        }
        join(&mut symbols, l, r);
        if let Some(p) = symbols[l].prev {
            push(&mut heap, &symbols, p);
        }
        push(&mut heap, &symbols, l);
    }
    for piece in pieces(&symbols, text) {
        match vocab.lookup(piece) {
            Some((id, _)) => emit(Ok(id)),
            None => emit(Err(piece)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct V(HashMap<&'static str, (u32, f32)>);
    impl SpmVocab for V {
        fn lookup(&self, text: &str) -> Option<(u32, f32)> {
            self.0.get(text).copied()
        }
    }

    fn run(text: &str, v: &V) -> Vec<Result<u32, String>> {
        let mut out = Vec::new();
        merge(text, v, |p| out.push(p.map_err(str::to_string)));
        out
    }

    #[test]
    fn highest_score_merges_first() {
        let v = V(HashMap::from([
            ("a", (1, -1.0)),
            ("b", (2, -1.0)),
            ("c", (3, -1.0)),
            ("ab", (4, -5.0)),
            ("bc", (5, -2.0)),
        ]));
        assert_eq!(run("abc", &v), [Ok(1), Ok(5)]);
        assert_eq!(run("abx", &v), [Ok(4), Err("x".into())]);
    }
}
