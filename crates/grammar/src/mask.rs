//! The set of allowed tokens for one decoding step, as a bitset.

/// One bit per token id: set when the token may be sampled next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u64>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` tokens, all disallowed.
    pub fn new(len: usize) -> Self {
        TokenMask {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Number of token ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the mask covers no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether token `id` is allowed.
    pub fn is_allowed(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 64] >> (i % 64) & 1 == 1
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed token ids, ascending.
    pub fn allowed(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    (w * 64) as u32 + b
                })
            })
        })
    }

    /// Sets every disallowed token's logit to minus infinity.
    pub fn apply_to_logits(&self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if !self.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Writes the mask into a slice of flags, one per token.
    pub fn write_bools(&self, out: &mut [bool]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.is_allowed(i as u32);
        }
    }

    pub(crate) fn set(&mut self, id: u32) {
        let i = id as usize;
        self.words[i / 64] |= 1 << (i % 64);
    }

    pub(crate) fn clear(&mut self) {
        self.words.fill(0);
    }

    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    pub(crate) fn copy_from_words(&mut self, words: &[u64]) {
        self.words.copy_from_slice(words);
    }
}
