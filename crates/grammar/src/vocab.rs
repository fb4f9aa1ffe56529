//! The tokenizer's vocabulary as byte strings, and the byte trie the mask walk follows.

/// A node's children and the tokens that end at it, as ranges into flat arrays (CSR):
/// node `n`'s edges are `edges[edge_start[n]..edge_start[n + 1]]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trie {
    pub edge_start: Vec<u32>,
    /// (byte, child node), sorted by byte within a node.
    pub edges: Vec<(u8, u32)>,
    pub token_start: Vec<u32>,
    pub tokens: Vec<u32>,
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

/// Builds the trie in depth-first order so that a walk touches memory mostly forwards.
fn build_trie(tokens: &[Vec<u8>], is_eos: &[bool]) -> Trie {
    let mut order: Vec<u32> = (0..tokens.len() as u32)
        .filter(|&i| !is_eos[i as usize] && !tokens[i as usize].is_empty())
        .collect();
    order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
    let mut trie = Trie::default();
    // Sorted tokens make the trie a single pass: keep the path of open nodes and, for each
    // token, close nodes past the common prefix with the previous one.
    // Each open node collects its edges and tokens; node ids are assigned on creation.
    struct Open {
        id: u32,
        edges: Vec<(u8, u32)>,
        tokens: Vec<u32>,
    }
    let mut nodes_edges: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
    let mut nodes_tokens: Vec<Vec<u32>> = vec![Vec::new()];
    let mut path: Vec<Open> = vec![Open {
        id: 0,
        edges: Vec::new(),
        tokens: Vec::new(),
    }];
    let mut prev: &[u8] = &[];
    let close = |open: Open, ne: &mut Vec<Vec<(u8, u32)>>, nt: &mut Vec<Vec<u32>>| {
        ne[open.id as usize] = open.edges;
        nt[open.id as usize] = open.tokens;
    };
    for &t in &order {
        let bytes = &tokens[t as usize][..];
        let common = prev.iter().zip(bytes).take_while(|(a, b)| a == b).count();
        while path.len() > common + 1 {
            let open = path.pop().expect("path holds the root");
            close(open, &mut nodes_edges, &mut nodes_tokens);
        }
        for &b in &bytes[common..] {
            let id = nodes_edges.len() as u32;
            nodes_edges.push(Vec::new());
            nodes_tokens.push(Vec::new());
            path.last_mut()
                .expect("path holds the root")
                .edges
                .push((b, id));
            path.push(Open {
                id,
                edges: Vec::new(),
                tokens: Vec::new(),
            });
        }
        path.last_mut().expect("path holds the root").tokens.push(t);
        prev = bytes;
    }
    while let Some(open) = path.pop() {
        close(open, &mut nodes_edges, &mut nodes_tokens);
    }
    trie.edge_start.push(0);
    trie.token_start.push(0);
    for (edges, toks) in nodes_edges.into_iter().zip(nodes_tokens) {
        trie.edges.extend(edges);
        trie.tokens.extend(toks);
        trie.edge_start.push(trie.edges.len() as u32);
        trie.token_start.push(trie.tokens.len() as u32);
    }
    trie
}
