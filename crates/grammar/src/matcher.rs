//! Per-request token matcher: which tokens may come next, and advancing by a token.

use std::collections::HashMap;
use std::sync::Arc;

use crate::automaton::{Automaton, DEAD, OVERFLOW};
use crate::compile::CompiledGrammar;
use crate::error::MatchError;
use crate::mask::TokenMask;
use crate::vocab::{Vocab, NO_TOKEN};
use crate::MAX_STACKS;

/// Bytes of cached masks kept per matcher before the cache is dropped and rebuilt.
const MASK_CACHE_BYTES: usize = 64 << 20;
/// Default for [`Matcher::set_state_limit`]: 64 Mi of transition tables.
const MAX_STATES: usize = 1 << 16;

/// Tracks one generation against a grammar, token by token.
///
/// Per step: [`fill_mask`](Matcher::fill_mask), sample among the allowed tokens, then
/// [`accept`](Matcher::accept) the sampled one.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<CompiledGrammar>,
    vocab: Arc<Vocab>,
    auto: Automaton,
    start: u32,
    state: u32,
    state_limit: usize,
    finished: bool,
    /// Mask (as bitset words, eos excluded) of each state met at a token boundary.
    masks: HashMap<u32, Box<[u64]>>,
    /// Scratch for the trie walk: the state at each depth of the current path.
    walk: Vec<u32>,
}

impl Matcher {
    /// A matcher at the start of `grammar`. Both are shared: a [`Vocab`] is built once per
    /// tokenizer, a grammar once per request or schema.
    pub fn new(grammar: Arc<CompiledGrammar>, vocab: Arc<Vocab>) -> Result<Self, MatchError> {
        let (auto, state) = Automaton::new(&grammar)?;
        Ok(Matcher {
            grammar,
            vocab,
            auto,
            start: state,
            state_limit: MAX_STATES,
            state,
            finished: false,
            masks: HashMap::new(),
            walk: Vec::new(),
        })
    }

    /// Bounds memory: once the automaton holds more than `states` states (1 KiB of
    /// transitions each; default 65,536), the next accepted token rebuilds it around the
    /// current state, dropping cached transitions and masks.
    pub fn set_state_limit(&mut self, states: usize) {
        self.state_limit = states;
    }

    /// Back to the start of the grammar, keeping the automaton and masks built so far: a
    /// matcher can serve one request after another with the same grammar.
    pub fn reset(&mut self) {
        self.state = self.start;
        self.finished = false;
    }

    /// Sets exactly the tokens whose bytes keep the grammar alive (the whole token matches
    /// a prefix of some sentence of the grammar, split UTF-8 characters included), plus the
    /// end-of-generation tokens when the text so far is complete. `mask` must cover the
    /// vocabulary ([`TokenMask::new`] with [`Vocab::len`]), else [`MatchError::MaskSize`].
    pub fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), MatchError> {
        if mask.len() != self.vocab.len() {
            return Err(MatchError::MaskSize {
                mask: mask.len(),
                vocab: self.vocab.len(),
            });
        }
        mask.clear();
        if self.finished || self.state == DEAD {
            return Ok(());
        }
        if let Some(words) = self.masks.get(&self.state) {
            mask.copy_from_words(words);
        } else {
            self.walk_trie(mask)?;
            let bytes = mask.words().len() * 8;
            if (self.masks.len() + 1) * bytes > MASK_CACHE_BYTES {
                self.masks.clear();
            }
            self.masks.insert(self.state, mask.words().into());
        }
        if self.is_complete() {
            for &e in self.vocab.eos() {
                mask.set(e);
            }
        }
        Ok(())
    }

    /// Walks the vocabulary trie from the current state in one forward scan, skipping a
    /// whole subtree as soon as its prefix is dead.
    fn walk_trie(&mut self, mask: &mut TokenMask) -> Result<(), MatchError> {
        let trie = &self.vocab.trie;
        let g = &*self.grammar;
        // states[d]: the state after the first d bytes of the current path.
        self.walk.clear();
        self.walk.resize(trie.max_depth + 1, DEAD);
        self.walk[0] = self.state;
        let mut i = 1;
        while let Some(node) = trie.nodes.get(i) {
            let d = node.depth as usize;
            match self.auto.next(g, self.walk[d - 1], node.byte) {
                DEAD => i = node.end as usize,
                OVERFLOW => return Err(MatchError::TooManyStacks { limit: MAX_STACKS }),
                next => {
                    self.walk[d] = next;
                    if node.token != NO_TOKEN {
                        mask.set(node.token);
                        if node.more {
                            let from = trie.extra.partition_point(|&(n, _)| (n as usize) < i);
                            for &(_, t) in trie.extra[from..]
                                .iter()
                                .take_while(|&&(n, _)| n as usize == i)
                            {
                                mask.set(t);
                            }
                        }
                    }
                    i += 1;
                }
            }
        }
        Ok(())
    }

    /// Advances by one sampled token. A token the grammar does not allow is an error and
    /// leaves the matcher unchanged; an end-of-generation token is accepted only when the
    /// text is complete, and finishes the matcher.
    pub fn accept(&mut self, token: u32) -> Result<(), MatchError> {
        if self.finished {
            return Err(MatchError::Finished);
        }
        if token as usize >= self.vocab.len() {
            return Err(MatchError::UnknownToken(token));
        }
        if self.vocab.is_eos(token) {
            if !self.is_complete() {
                return Err(MatchError::NotComplete { token });
            }
            self.finished = true;
            return Ok(());
        }
        let vocab = Arc::clone(&self.vocab);
        let bytes = vocab.token_bytes(token);
        if bytes.is_empty() {
            return Err(MatchError::Rejected { token });
        }
        match self.advance(bytes)? {
            true => Ok(()),
            false => Err(MatchError::Rejected { token }),
        }
    }

    /// Advances by raw bytes (a prompt prefix the grammar must also cover, say). Returns
    /// false, leaving the matcher unchanged, when the bytes would kill the grammar.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> Result<bool, MatchError> {
        if self.finished {
            return Err(MatchError::Finished);
        }
        self.advance(bytes)
    }

    /// Whether `bytes` would keep the grammar alive from here, without advancing: the
    /// per-token test a mask summarises, for checks and one-off questions.
    pub fn allows_bytes(&mut self, bytes: &[u8]) -> Result<bool, MatchError> {
        if self.finished {
            return Ok(false);
        }
        Ok(self.walk_bytes(bytes)?.is_some())
    }

    fn advance(&mut self, bytes: &[u8]) -> Result<bool, MatchError> {
        let Some(state) = self.walk_bytes(bytes)? else {
            return Ok(false);
        };
        self.state = state;
        if self.auto.state_count() > self.state_limit {
            // State ids change, so cached masks and the start state go with the old one.
            let (auto, start, state) = self.auto.compacted(&self.grammar, self.state)?;
            self.auto = auto;
            self.state = state;
            self.masks.clear();
            self.start = start;
        }
        Ok(true)
    }

    fn walk_bytes(&mut self, bytes: &[u8]) -> Result<Option<u32>, MatchError> {
        let mut state = self.state;
        for &b in bytes {
            if state == DEAD {
                return Ok(None);
            }
            state = match self.auto.next(&self.grammar, state, b) {
                OVERFLOW => return Err(MatchError::TooManyStacks { limit: MAX_STACKS }),
                s => s,
            };
        }
        Ok((state != DEAD).then_some(state))
    }

    /// The text so far is a complete sentence of the grammar (no partial UTF-8 pending),
    /// so an end-of-generation token is allowed.
    pub fn is_complete(&self) -> bool {
        self.finished || (self.state != DEAD && self.auto.is_complete(self.state))
    }

    /// Nothing more can be generated: an end-of-generation token was accepted, or the
    /// grammar is complete and admits no further character (the caller should stop).
    pub fn is_dead(&self) -> bool {
        self.finished || self.state == DEAD || !self.auto.can_continue(self.state)
    }

    /// An end-of-generation token has been accepted.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Drops the cached masks (not the automaton): frees their memory, and lets a
    /// benchmark time the trie walk alone.
    pub fn clear_mask_cache(&mut self) {
        self.masks.clear();
    }

    /// Number of automaton states built so far (grows lazily as decoding explores).
    pub fn state_count(&self) -> usize {
        self.auto.state_count()
    }
}
