//! The tokenizer's vocabulary as byte strings, and the byte trie the mask walk follows.

/// The trie in depth-first pre-order, as parallel arrays: node `i`'s subtree is the
/// contiguous range `i..end[i]`, so a walk is one forward scan that jumps to `end[i]` to
/// skip a dead subtree (no explicit stack, memory read in order). Node 0 is the root.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trie {
    /// The byte on the edge into node `i`.
    pub byte: Vec<u8>,
    /// Length of the byte string that reaches node `i`.
    pub depth: Vec<u32>,
    /// One past the last node of `i`'s subtree.
    pub end: Vec<u32>,
    /// Tokens ending at node `i` are `tokens[token_start[i]..token_start[i + 1]]`.
    pub token_start: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Longest token, in bytes.
    pub max_depth: usize,
}

/// Token byte strings plus the end-of-generation tokens, built once per tokenizer and
/// shared by every [`Matcher`](crate::Matcher).
///
/// A token with an empty byte string (control tokens, say) is never allowed by a mask.
#[derive(Debug, Clone)]
pub struct Vocab {
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    eos: Vec<u32>,
    is_eos: Vec<bool>,
    pub(crate) trie: Trie,
}

impl Vocab {
    /// `tokens[id]` is the UTF-8 (possibly partial) byte string token `id` decodes to;
    /// `eos` lists the ids that end generation. Eos ids outside the vocabulary are ignored.
    pub fn new(tokens: &[Vec<u8>], eos: &[u32]) -> Self {
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        let mut bytes = Vec::new();
        offsets.push(0);
        for t in tokens {
            bytes.extend_from_slice(t);
            offsets.push(bytes.len() as u32);
        }
        let mut is_eos = vec![false; tokens.len()];
        let eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < tokens.len())
            .collect();
        for &e in &eos {
            is_eos[e as usize] = true;
        }
        let trie = build_trie(tokens, &is_eos);
        Vocab {
            offsets,
            bytes,
            eos,
            is_eos,
            trie,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.is_eos.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.is_eos.is_empty()
    }

    /// The byte string of token `id`.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The end-of-generation token ids.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.is_eos.get(id as usize).copied().unwrap_or(false)
    }
}

/// Builds the trie from the tokens sorted by bytes: sorted order creates nodes in
/// pre-order, and a node's subtree ends where the next token leaves its prefix.
fn build_trie(tokens: &[Vec<u8>], is_eos: &[bool]) -> Trie {
    let mut order: Vec<u32> = (0..tokens.len() as u32)
        .filter(|&i| !is_eos[i as usize] && !tokens[i as usize].is_empty())
        .collect();
    order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
    let mut byte = vec![0u8];
    let mut depth = vec![0u32];
    let mut end = vec![0u32];
    let mut node_tokens: Vec<Vec<u32>> = vec![Vec::new()];
    // Open nodes along the current token's path, root first.
    let mut path: Vec<u32> = vec![0];
    let mut prev: &[u8] = &[];
    for &t in &order {
        let bytes = &tokens[t as usize][..];
        let common = prev.iter().zip(bytes).take_while(|(a, b)| a == b).count();
        while path.len() > common + 1 {
            let closed = path.pop().expect("path holds the root");
            end[closed as usize] = byte.len() as u32;
        }
        for (i, &b) in bytes.iter().enumerate().skip(common) {
            path.push(byte.len() as u32);
            byte.push(b);
            depth.push(i as u32 + 1);
            end.push(0);
            node_tokens.push(Vec::new());
        }
        node_tokens[*path.last().expect("path holds the root") as usize].push(t);
        prev = bytes;
    }
    for open in path {
        end[open as usize] = byte.len() as u32;
    }
    let mut token_start = Vec::with_capacity(byte.len() + 1);
    let mut flat = Vec::with_capacity(order.len());
    token_start.push(0);
    for ts in node_tokens {
        flat.extend(ts);
        token_start.push(flat.len() as u32);
    }
    let max_depth = depth.iter().copied().max().unwrap_or(0) as usize;
    Trie {
        byte,
        depth,
        end,
        token_start,
        tokens: flat,
        max_depth,
    }
}
