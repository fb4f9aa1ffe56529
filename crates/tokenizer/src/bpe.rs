//! Byte-level BPE (GPT-2 style), as llama.cpp's `llm_tokenizer_bpe_session` runs it.
//!
//! A word's bytes are first mapped to printable characters (GPT-2's `bytes_to_unicode`:
//! printable Latin-1 bytes stand for themselves, the other 68 bytes become U+0100..).
//! The word starts as one symbol per character; repeatedly the adjacent pair with the
//! lowest merge rank is joined (ties: the leftmost), until no pair has a rank. Each
//! final symbol is looked up in the vocabulary.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::symbols::{join, pieces, split_chars, Symbol};

/// GPT-2's byte-to-character table.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(256 + n).unwrap_or('\0');
            n += 1;
            c
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`], as a map.
pub fn char_to_byte_map(table: &[char; 256]) -> HashMap<char, u8> {
    table
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Merge ranks, keyed by the merge line as stored (`"left right"`).
#[derive(Debug, Default)]
pub struct Merges {
    ranks: HashMap<String, u32>,
}

impl Merges {
    /// Builds the table from `tokenizer.ggml.merges`. A line is split at its first space
    /// after the first byte (llama.cpp's rule); lines without one are ignored.
    pub fn new<'a>(lines: impl IntoIterator<Item = &'a str>) -> Merges {
        let mut ranks = HashMap::new();
        for (rank, line) in lines.into_iter().enumerate() {
            let Some(first) = line.chars().next() else {
                continue;
            };
            if !line[first.len_utf8()..].contains(' ') {
                continue;
            }
            ranks.entry(line.to_string()).or_insert(rank as u32);
        }
        Merges { ranks }
    }

    pub(crate) fn len(&self) -> usize {
        self.ranks.len()
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.ranks.get(key.as_str()).copied()
    }
}

/// A queued merge candidate: `(Reverse(rank), Reverse(left), right, left len, right
/// len)`. On a max-heap the lowest rank comes out first, then the leftmost pair; the
/// lengths recorded at push time detect entries made stale by later merges.
type Candidate = (Reverse<u32>, Reverse<usize>, usize, usize, usize);

/// Runs the merges over one byte-encoded word and calls `emit` with each final piece.
pub fn merge_word(word: &str, merges: &Merges, emit: impl FnMut(&str)) {
    let mut symbols = split_chars(word);
    if symbols.len() > 1 {
        let mut key = String::new();
        let mut heap: BinaryHeap<Candidate> = BinaryHeap::new();
        let text = |s: &Symbol| &word[s.start..s.start + s.len];
        let push = |heap: &mut BinaryHeap<_>, key: &mut String, syms: &[Symbol], l: usize| {
            if let Some(r) = syms[l].next {
                if let Some(rank) = merges.rank(key, text(&syms[l]), text(&syms[r])) {
                    heap.push((Reverse(rank), Reverse(l), r, syms[l].len, syms[r].len));
                }
            }
        };
        for i in 0..symbols.len() - 1 {
            push(&mut heap, &mut key, &symbols, i);
        }
        while let Some((_, Reverse(l), r, llen, rlen)) = heap.pop() {
            if symbols[l].len != llen || symbols[r].len != rlen || llen == 0 || rlen == 0 {
                continue;
            }
            join(&mut symbols, l, r);
            if let Some(p) = symbols[l].prev {
                push(&mut heap, &mut key, &symbols, p);
            }
            push(&mut heap, &mut key, &symbols, l);
        }
    }
    pieces(&symbols, word).for_each(emit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        let inv = char_to_byte_map(&t);
        assert_eq!(inv.len(), 256);
    }

    fn pieces(word: &str, merges: &[&str]) -> Vec<String> {
        let m = Merges::new(merges.iter().copied());
        let mut out = Vec::new();
        merge_word(word, &m, |p| out.push(p.to_string()));
        out
    }

    #[test]
    fn lowest_rank_wins_then_leftmost() {
        // "b c" outranks "a b": abc -> a|bc.
        assert_eq!(pieces("abc", &["b c", "a b"]), ["a", "bc"]);
        assert_eq!(pieces("abc", &["a b", "b c"]), ["ab", "c"]);
        // Equal pairs: the leftmost merges first.
        assert_eq!(pieces("aaa", &["a a"]), ["aa", "a"]);
        assert_eq!(pieces("aaaa", &["a a", "aa aa"]), ["aaaa"]);
        assert_eq!(pieces("xyz", &[]), ["x", "y", "z"]);
    }
}
