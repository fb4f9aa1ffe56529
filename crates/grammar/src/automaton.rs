//! The lazily built byte-level automaton over sets of parse stacks.
//!
//! A parse stack is a list of grammar positions: the top is the next [`Elem::Chars`] to
//! match, each entry below it is where to resume once the rule above it ends. Stacks are
//! hash-consed into an arena of `(position, parent)` nodes, so stacks that share a tail
//! share memory and a stack is one `u32`. The parser state is the *set* of live stacks
//! (several when the grammar is ambiguous so far), itself interned.
//!
//! On top of that sits a byte-level state: a stack set plus the bytes of a UTF-8
//! character read so far but not yet complete. Each such [`DState`] has a 256-entry
//! transition table filled on first use, so after warm-up a byte costs one array load.

use std::collections::HashMap;

use crate::compile::{CompiledGrammar, Elem};
use crate::error::MatchError;

/// The empty stack: the grammar has matched a complete `root`.
pub(crate) const EMPTY: u32 = u32::MAX;
/// Transition not computed yet.
const UNKNOWN: u32 = u32::MAX;
/// Transition to no live stack.
pub(crate) const DEAD: u32 = u32::MAX - 1;
/// Transition that would exceed [`MAX_STACKS`].
pub(crate) const OVERFLOW: u32 = u32::MAX - 2;

/// Most live stacks in one set; more means an ambiguous grammar is blowing up.
pub const MAX_STACKS: usize = 4096;
/// Most expansion steps for one closure, a second guard against blow-up.
const MAX_CLOSURE_STEPS: usize = 200_000;

/// Bytes of a UTF-8 character read so far: the value bits, how many continuation bytes
/// are still needed, and the encoded length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Partial {
    pub acc: u32,
    pub need: u8,
    pub len: u8,
}

#[derive(Debug, Clone)]
struct DState {
    set: u32,
    partial: Partial,
}

#[derive(Debug, Clone)]
pub(crate) struct Automaton {
    nodes: Vec<(u32, u32)>,
    node_ids: HashMap<(u32, u32), u32>,
    sets: Vec<Box<[u32]>>,
    set_ids: HashMap<Box<[u32]>, u32>,
    dstates: Vec<DState>,
    dstate_ids: HashMap<(u32, Partial), u32>,
    /// Transition table, 256 entries per state (`next[d << 8 | byte]`), [`UNKNOWN`] until
    /// first used: one flat array so the hot path of a walk is a single load.
    next: Vec<u32>,
    scratch: Vec<u32>,
    work: Vec<(u32, u32)>,
}

impl Automaton {
    /// Builds the automaton and returns it with its start state.
    pub(crate) fn new(g: &CompiledGrammar) -> Result<(Self, u32), MatchError> {
        let mut a = Automaton {
            nodes: Vec::new(),
            node_ids: HashMap::new(),
            sets: Vec::new(),
            set_ids: HashMap::new(),
            dstates: Vec::new(),
            dstate_ids: HashMap::new(),
            next: Vec::new(),
            scratch: Vec::new(),
            work: Vec::new(),
        };
        let mut out = Vec::new();
        for &start in &g.alts[g.root as usize] {
            a.closure(g, start, EMPTY, &mut out)?;
        }
        let start = match a.intern_set(out)? {
            Some(set) => a.dstate(set, Partial::default()),
            None => DEAD,
        };
        Ok((a, start))
    }

    fn node(&mut self, pos: u32, parent: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry((pos, parent)).or_insert(next);
        if id == next {
            self.nodes.push((pos, parent));
        }
        id
    }

    fn dstate(&mut self, set: u32, partial: Partial) -> u32 {
        let next = self.dstates.len() as u32;
        let id = *self.dstate_ids.entry((set, partial)).or_insert(next);
        if id == next {
            self.dstates.push(DState { set, partial });
            self.next.resize(self.next.len() + 256, UNKNOWN);
        }
        id
    }

    fn intern_set(&mut self, mut stacks: Vec<u32>) -> Result<Option<u32>, MatchError> {
        stacks.sort_unstable();
        stacks.dedup();
        if stacks.is_empty() {
            return Ok(None);
        }
        if stacks.len() > MAX_STACKS {
            return Err(MatchError::TooManyStacks { limit: MAX_STACKS });
        }
        let stacks = stacks.into_boxed_slice();
        if let Some(&id) = self.set_ids.get(&stacks) {
            return Ok(Some(id));
        }
        let id = self.sets.len() as u32;
        self.sets.push(stacks.clone());
        self.set_ids.insert(stacks, id);
        Ok(Some(id))
    }

    /// Pushes onto `out` every stack whose top is a character element, reachable from
    /// position `pos` with continuation `parent` without consuming input; [`EMPTY`] when
    /// the whole input can end here.
    fn closure(
        &mut self,
        g: &CompiledGrammar,
        pos: u32,
        parent: u32,
        out: &mut Vec<u32>,
    ) -> Result<(), MatchError> {
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.push((pos, parent));
        let mut steps = 0;
        while let Some((pos, parent)) = work.pop() {
            steps += 1;
            if steps > MAX_CLOSURE_STEPS {
                self.work = work;
                return Err(MatchError::TooManyStacks { limit: MAX_STACKS });
            }
            match g.elems[pos as usize] {
                Elem::Chars(_) => out.push(self.node(pos, parent)),
                Elem::End if parent == EMPTY => out.push(EMPTY),
                Elem::End => work.push(self.nodes[parent as usize]),
                Elem::Ref(rule) => {
                    // A reference in tail position returns straight to `parent`, so
                    // right recursion (`x*`) does not deepen the stack.
                    let cont = if g.elems[pos as usize + 1] == Elem::End {
                        parent
                    } else {
                        self.node(pos + 1, parent)
                    };
                    for &start in g.alts[rule as usize].iter().rev() {
                        work.push((start, cont));
                    }
                }
            }
        }
        self.work = work;
        Ok(())
    }

    /// The set reached from `set` by matching code point `c`.
    fn step_char(
        &mut self,
        g: &CompiledGrammar,
        set: u32,
        c: u32,
    ) -> Result<Option<u32>, MatchError> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        for i in 0..self.sets[set as usize].len() {
            let s = self.sets[set as usize][i];
            if s == EMPTY {
                continue;
            }
            let (pos, parent) = self.nodes[s as usize];
            if let Elem::Chars(cs) = g.elems[pos as usize] {
                if g.charsets[cs as usize].contains(c) {
                    self.closure(g, pos + 1, parent, &mut out)?;
                }
            }
        }
        let result = self.intern_set(out.clone());
        self.scratch = out;
        result
    }

    /// Whether some stack in `set` can match a code point in `lo..=hi`.
    fn can_match_range(&self, g: &CompiledGrammar, set: u32, lo: u32, hi: u32) -> bool {
        self.sets[set as usize].iter().any(|&s| {
            s != EMPTY
                && match g.elems[self.nodes[s as usize].0 as usize] {
                    Elem::Chars(cs) => g.charsets[cs as usize].intersects(lo, hi),
                    _ => false,
                }
        })
    }

    /// The state after byte `b`, or [`DEAD`] / [`OVERFLOW`].
    #[inline]
    pub(crate) fn next(&mut self, g: &CompiledGrammar, d: u32, b: u8) -> u32 {
        let slot = (d as usize) << 8 | b as usize;
        let t = self.next[slot];
        if t != UNKNOWN {
            return t;
        }
        self.next_slow(g, d, b)
    }

    #[cold]
    fn next_slow(&mut self, g: &CompiledGrammar, d: u32, b: u8) -> u32 {
        let t = match self.compute_next(g, d, b) {
            Ok(Some(t)) => t,
            Ok(None) => DEAD,
            Err(_) => OVERFLOW,
        };
        self.next[(d as usize) << 8 | b as usize] = t;
        t
    }

    fn compute_next(
        &mut self,
        g: &CompiledGrammar,
        d: u32,
        b: u8,
    ) -> Result<Option<u32>, MatchError> {
        let DState { set, partial, .. } = self.dstates[d as usize];
        let p = if partial.need == 0 {
            match b {
                0x00..=0x7F => return self.complete(g, set, b as u32),
                0xC2..=0xDF => Partial {
                    acc: (b & 0x1F) as u32,
                    need: 1,
                    len: 2,
                },
                0xE0..=0xEF => Partial {
                    acc: (b & 0x0F) as u32,
                    need: 2,
                    len: 3,
                },
                0xF0..=0xF4 => Partial {
                    acc: (b & 0x07) as u32,
                    need: 3,
                    len: 4,
                },
                _ => return Ok(None),
            }
        } else {
            if b & 0xC0 != 0x80 {
                return Ok(None);
            }
            let acc = partial.acc << 6 | (b & 0x3F) as u32;
            if partial.need == 1 {
                let min = [0, 0, 0x80, 0x800, 0x10000][partial.len as usize];
                if acc < min || acc > 0x10FFFF || (0xD800..=0xDFFF).contains(&acc) {
                    return Ok(None);
                }
                return self.complete(g, set, acc);
            }
            Partial {
                acc,
                need: partial.need - 1,
                len: partial.len,
            }
        };
        // Keep a partial character only if some code point it may still become is allowed.
        let shift = 6 * p.need as u32;
        let min = [0, 0, 0x80, 0x800, 0x10000][p.len as usize];
        let lo = (p.acc << shift).max(min);
        let hi = (p.acc << shift | ((1 << shift) - 1)).min(0x10FFFF);
        let viable = lo <= hi
            && [(lo, hi.min(0xD7FF)), (lo.max(0xE000), hi)]
                .iter()
                .any(|&(l, h)| l <= h && self.can_match_range(g, set, l, h));
        Ok(viable.then(|| self.dstate(set, p)))
    }

    fn complete(
        &mut self,
        g: &CompiledGrammar,
        set: u32,
        c: u32,
    ) -> Result<Option<u32>, MatchError> {
        Ok(self
            .step_char(g, set, c)?
            .map(|s| self.dstate(s, Partial::default())))
    }

    /// Whether the input so far is a complete sentence of the grammar.
    pub(crate) fn is_complete(&self, d: u32) -> bool {
        let ds = &self.dstates[d as usize];
        // EMPTY is u32::MAX, so it sorts last in a set.
        ds.partial.need == 0 && self.sets[ds.set as usize].last() == Some(&EMPTY)
    }

    /// Whether any further character can be matched.
    pub(crate) fn can_continue(&self, d: u32) -> bool {
        let ds = &self.dstates[d as usize];
        self.sets[ds.set as usize].iter().any(|&s| s != EMPTY)
    }

    /// A fresh automaton holding only state `d` (its stacks, set and partial character),
    /// returned with its start state and `d`'s id in it: bounds memory on long generations, since every
    /// state costs a 1 KiB transition table and the old ones are rarely revisited.
    pub(crate) fn compacted(
        &self,
        g: &CompiledGrammar,
        d: u32,
    ) -> Result<(Self, u32, u32), MatchError> {
        let (mut fresh, start) = Automaton::new(g)?;
        let ds = &self.dstates[d as usize];
        let mut map: HashMap<u32, u32> = HashMap::new();
        let mut stacks = Vec::new();
        for &s in self.sets[ds.set as usize].iter() {
            stacks.push(fresh.copy_stack(self, s, &mut map));
        }
        let set = fresh.intern_set(stacks)?.expect("a live state has stacks");
        let id = fresh.dstate(set, ds.partial);
        Ok((fresh, start, id))
    }

    fn copy_stack(&mut self, from: &Automaton, s: u32, map: &mut HashMap<u32, u32>) -> u32 {
        // Walk down to the first node already copied (or the bottom), then rebuild upwards.
        let mut chain = Vec::new();
        let mut at = s;
        while at != EMPTY && !map.contains_key(&at) {
            chain.push(at);
            at = from.nodes[at as usize].1;
        }
        let mut parent = if at == EMPTY { EMPTY } else { map[&at] };
        for &n in chain.iter().rev() {
            parent = self.node(from.nodes[n as usize].0, parent);
            map.insert(n, parent);
        }
        parent
    }

    /// Number of interned states, for tests and diagnostics.
    pub(crate) fn state_count(&self) -> usize {
        self.dstates.len()
    }
}
