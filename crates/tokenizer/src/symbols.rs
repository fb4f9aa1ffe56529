//! The doubly linked list of pieces that both merge loops work on (byte-level BPE by merge
//! rank, SentencePiece by score): it starts as one symbol per character, and a merge makes
//! the left symbol absorb its right neighbour.

/// A piece of the text: `text[start..start + len]`; `len == 0` once merged away.
#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    pub len: usize,
    pub prev: Option<usize>,
    pub next: Option<usize>,
}

/// One symbol per character of `text`, linked in order.
pub(crate) fn split_chars(text: &str) -> Vec<Symbol> {
    let n = text.chars().count();
    text.char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: (i + 1 < n).then_some(i + 1),
        })
        .collect()
}

/// Merges `r` into its left neighbour `l`.
pub(crate) fn join(symbols: &mut [Symbol], l: usize, r: usize) {
    symbols[l].len += symbols[r].len;
    symbols[r].len = 0;
    symbols[l].next = symbols[r].next;
    if let Some(n) = symbols[r].next {
        symbols[n].prev = Some(l);
    }
}

/// The pieces left after merging, in order.
pub(crate) fn pieces<'a>(symbols: &'a [Symbol], text: &'a str) -> impl Iterator<Item = &'a str> {
    symbols
        .iter()
        .filter(|s| s.len > 0)
        .map(move |s| &text[s.start..s.start + s.len])
}
