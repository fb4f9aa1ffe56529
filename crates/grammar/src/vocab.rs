//! The tokenizer's vocabulary as byte strings, and the byte trie the mask walk follows.

/// The trie in depth-first pre-order: node `i`'s subtree is the contiguous range
/// `i..nodes[i].end`, so a walk is one forward scan that jumps to `end` to skip a dead
/// subtree (no explicit stack, memory read in order). Node 0 is the root.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trie {
    pub nodes: Vec<TrieNode>,
    /// Tokens beyond the first that end at a node (tokens with equal bytes), as
    /// `(node, token)` sorted by node.
    pub extra: Vec<(u32, u32)>,
    /// Longest token, in bytes.
    pub max_depth: usize,
}

/// One trie node, packed so that the walk reads 12 bytes per node.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TrieNode {
    /// One past the last node of this node's subtree.
    pub end: u32,
    /// The first token whose bytes end here, or [`NO_TOKEN`].
    pub token: u32,
    /// Length of the byte string that reaches this node.
    pub depth: u16,
    /// The byte on the edge into this node.
    pub byte: u8,
    /// Whether more tokens end here (listed in [`Trie::extra`]).
    pub more: bool,
}

/// [`TrieNode::token`] of a node where no token ends.
pub(crate) const NO_TOKEN: u32 = u32::MAX;

/// Tokens longer than this many bytes are left out of the trie (never allowed): no real
/// vocabulary comes near it, and it keeps a node's depth in 16 bits.
const MAX_TOKEN_BYTES: usize = u16::MAX as usize;

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
    ///
    /// # Panics
    ///
    /// If `id` is not below [`len`](Self::len).
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
        .filter(|&i| {
            let t = &tokens[i as usize];
            !is_eos[i as usize] && !t.is_empty() && t.len() <= MAX_TOKEN_BYTES
        })
        .collect();
    order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
    let mut trie = Trie {
        nodes: vec![TrieNode {
            token: NO_TOKEN,
            ..TrieNode::default()
        }],
        ..Trie::default()
    };
    // Open nodes along the current token's path, root first.
    let mut path: Vec<u32> = vec![0];
    let mut prev: &[u8] = &[];
    for &t in &order {
        let bytes = &tokens[t as usize][..];
        let common = prev.iter().zip(bytes).take_while(|(a, b)| a == b).count();
        while path.len() > common + 1 {
            let closed = path.pop().expect("path holds the root");
            trie.nodes[closed as usize].end = trie.nodes.len() as u32;
        }
        for (i, &b) in bytes.iter().enumerate().skip(common) {
            path.push(trie.nodes.len() as u32);
            trie.nodes.push(TrieNode {
                end: 0,
                token: NO_TOKEN,
                depth: i as u16 + 1,
                byte: b,
                more: false,
            });
        }
        let at = *path.last().expect("path holds the root");
        let node = &mut trie.nodes[at as usize];
        if node.token == NO_TOKEN {
            node.token = t;
        } else {
            node.more = true;
            trie.extra.push((at, t));
        }
        prev = bytes;
        trie.max_depth = trie.max_depth.max(bytes.len());
    }
    for open in path {
        trie.nodes[open as usize].end = trie.nodes.len() as u32;
    }
    trie
}
