//! Token sampling on the CPU, with llama.cpp's defaults and order of operations
//! (llama.cpp `common/sampling.cpp`, `src/llama-sampling.cpp`):
//! logit bias → penalties (repetition, frequency, presence) → top-k → top-p → min-p →
//! temperature → draw from the softmax.
//!
//! The penalties are llama.cpp's `penalties` sampler: they look at the last
//! `repeat_last_n` tokens, prompt tokens included (llama-server feeds the prompt through
//! its sampler too), and for a token seen `c > 0` times there the logit `l` becomes
//! `(l > 0 ? l / repeat : l * repeat) - c * frequency - presence`.
//!
//! Log-probabilities (OpenAI's `logprobs`) are the log-softmax of the logits the sampler
//! saw after the bias and the penalties, before temperature and truncation: the model's
//! own distribution as the request shaped it, which is what OpenAI documents ("the log
//! probability of this token"), not llama-server's post-truncation probabilities.
//!
//! A grammar ([`Constraint`]: GBNF or a JSON schema, compiled by the `grammar` crate)
//! masks the logits after the penalties, as llama.cpp's grammar sampler does: a token the
//! grammar does not allow gets `-inf`, so log-probabilities are those of the constrained
//! distribution, and an end-of-generation token is allowed only where the text is a
//! complete sentence of the grammar. The matcher advances with each token drawn.
//!
//! A temperature of 0 (or below) is greedy: the first maximum after the penalty. A seeded
//! generator makes every run reproducible. Nothing is allocated per token once the
//! candidate buffer has grown to the vocabulary size.

use std::collections::VecDeque;
use std::sync::Arc;

use grammar::{CompiledGrammar, Matcher, TokenMask, Vocab};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenizer::Tokenizer;

/// Sampling parameters; `Default` is llama.cpp's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerOptions {
    /// Logits are divided by this; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// `>= 1` keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` keeps all.
    pub min_p: f32,
    /// Logits of recently seen tokens are divided by this when positive, multiplied when
    /// negative; 1 disables it.
    pub repeat_penalty: f32,
    /// How many of the latest tokens the penalties look at; 0 disables them.
    pub repeat_last_n: usize,
    /// Subtracted from a token's logit once per time it appears in the window (OpenAI's
    /// `frequency_penalty`); 0 disables it.
    pub frequency_penalty: f32,
    /// Subtracted from the logit of any token that appears in the window (OpenAI's
    /// `presence_penalty`); 0 disables it.
    pub presence_penalty: f32,
    /// Added to the logits of these tokens before anything else; `f32::NEG_INFINITY`
    /// (what a bias of -100 maps to in the server) bans the token.
    pub logit_bias: Vec<(u32, f32)>,
    /// Report each chosen token's log-probability and this many most likely alternatives
    /// (`Sampler::take_logprob`); `None` reports nothing.
    pub logprobs: Option<usize>,
    /// Seed of the generator.
    pub seed: u64,
    /// A grammar the output must follow; `None` leaves the output free.
    pub grammar: Option<Constraint>,
}

/// A compiled grammar and the vocabulary it masks (see the module docs). Built once per
/// request (or once per schema and shared); equal when both are the same objects.
#[derive(Clone, Debug)]
pub struct Constraint {
    grammar: Arc<CompiledGrammar>,
    vocab: Arc<Vocab>,
}

impl Constraint {
    pub fn new(grammar: Arc<CompiledGrammar>, vocab: Arc<Vocab>) -> Constraint {
        Constraint { grammar, vocab }
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.grammar, &other.grammar) && Arc::ptr_eq(&self.vocab, &other.vocab)
    }
}

/// The tokenizer's vocabulary as the grammar matcher reads it: each token's bytes, control
/// and unknown tokens empty (never allowed), the end-of-generation tokens as its ends.
/// Build it once per model (a trie over the whole vocabulary; a few milliseconds).
pub fn grammar_vocab(tok: &Tokenizer) -> Vocab {
    let tokens: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
        .map(|id| {
            if tok.is_special(id) {
                Vec::new()
            } else {
                tok.token_bytes(id)
            }
        })
        .collect();
    Vocab::new(&tokens, tok.eog_ids())
}

/// A chosen token's log-probability and the most likely tokens at its position, best
/// first (ties by id), as the sampler saw them (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
            seed: 0x5EED,
            grammar: None,
        }
    }
}

impl SamplerOptions {
    /// Greedy decoding (temperature 0, no penalty).
    pub fn greedy() -> Self {
        SamplerOptions {
            temperature: 0.0,
            ..SamplerOptions::default()
        }
    }
}

/// Why a token could not be drawn.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    #[error("cannot sample from empty logits")]
    Empty,
    #[error("every logit is NaN or -inf after the penalty: nothing to sample ({n} logits)")]
    NoCandidate { n: usize },
    #[error("grammar: {0}")]
    Grammar(#[from] grammar::MatchError),
    #[error("the grammar allows no token here (the model's vocabulary cannot continue it, or ending is forbidden)")]
    GrammarStuck,
    #[error("the grammar's vocabulary has {grammar} tokens but the logits {logits}")]
    GrammarVocab { grammar: usize, logits: usize },
}

/// A seeded sampler that remembers the last `repeat_last_n` tokens.
pub(crate) struct Sampler {
    opts: SamplerOptions,
    rng: StdRng,
    /// The latest tokens, oldest first, at most `repeat_last_n`.
    history: VecDeque<u32>,
    /// Scratch: (token, logit) candidates, reused every call.
    cand: Vec<(u32, f32)>,
    /// Scratch: the window's tokens, sorted (runs give the counts).
    seen: Vec<u32>,
    /// Scratch: the logits after bias and penalties, by id (logprob requests only).
    shaped: Vec<f32>,
    /// The last chosen token's log-probability, when asked for.
    last_logprob: Option<TokenLogprob>,
    /// The grammar's matcher (built at the first draw) and its mask.
    matcher: Option<(Matcher, TokenMask)>,
}

impl Sampler {
    pub fn new(opts: SamplerOptions) -> Sampler {
        let rng = StdRng::seed_from_u64(opts.seed);
        Sampler {
            opts,
            rng,
            history: VecDeque::new(),
            cand: Vec::new(),
            seen: Vec::new(),
            shaped: Vec::new(),
            last_logprob: None,
            matcher: None,
        }
    }

    /// True when the choice is the plain argmax of the logits, so the engine can take the
    /// argmax on the GPU and read back 4 bytes instead of the logits (not when a bias, a
    /// penalty, a grammar or log-probabilities need the logits themselves). Banned tokens
    /// (a bias of `-inf`, as `ignore_eos` bans the end-of-generation tokens) keep it
    /// greedy: when the GPU's argmax is one of them ([`Sampler::bans`]), the caller reads
    /// the logits and calls [`Sampler::sample`], which takes the first maximum of the rest
    /// (the same token masking first would give).
    pub(crate) fn is_greedy(&self) -> bool {
        self.opts.temperature <= 0.0
            && !self.penalises()
            && self
                .opts
                .logit_bias
                .iter()
                .all(|&(_, b)| b == f32::NEG_INFINITY)
            && self.opts.logprobs.is_none()
            && self.opts.grammar.is_none()
    }

    /// Whether `token` is banned (a bias of `-inf`).
    pub fn bans(&self, token: u32) -> bool {
        self.opts
            .logit_bias
            .iter()
            .any(|&(t, b)| t == token && b == f32::NEG_INFINITY)
    }

    /// Whether any token is banned: a greedy choice may then need the logits.
    pub(crate) fn has_bans(&self) -> bool {
        self.opts
            .logit_bias
            .iter()
            .any(|&(_, b)| b == f32::NEG_INFINITY)
    }

    fn penalises(&self) -> bool {
        let o = &self.opts;
        o.repeat_last_n > 0
            && (o.repeat_penalty != 1.0 || o.frequency_penalty != 0.0 || o.presence_penalty != 0.0)
    }

    /// The log-probability of the token the last [`Sampler::sample`] chose, when the
    /// options ask for them.
    pub(crate) fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.last_logprob.take()
    }

    /// Records a token (prompt tokens included) for the repetition penalty. (The grammar
    /// advances when [`Sampler::sample`] draws a token, not here: the prompt is outside
    /// it.)
    pub fn accept(&mut self, token: u32) {
        if self.opts.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.opts.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Draws the next token from `logits` (one per vocabulary entry) and advances the
    /// grammar by it. Does not call [`Sampler::accept`]; the caller records the token it
    /// keeps.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::Empty);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(t, b) in &self.opts.logit_bias {
            if let Some(c) = self.cand.get_mut(t as usize) {
                c.1 += b;
            }
        }
        self.apply_penalty();
        self.apply_grammar(logits.len())?;
        if self.opts.logprobs.is_some() {
            self.shaped.clear();
            self.shaped.extend(self.cand.iter().map(|c| c.1));
        }
        self.cand
            .retain(|&(_, l)| !l.is_nan() && l != f32::NEG_INFINITY);
        if self.cand.is_empty() {
            return Err(match self.matcher {
                Some(_) => SampleError::GrammarStuck,
                None => SampleError::NoCandidate { n: logits.len() },
            });
        }
        let top = self.opts.logprobs.map(|n| log_softmax_top(&self.cand, n));
        let tok = self.draw();
        if let Some((m, _)) = &mut self.matcher {
            m.accept(tok)?;
        }
        if let Some((lse, top)) = top {
            self.last_logprob = Some(TokenLogprob {
                token: tok,
                logprob: (f64::from(self.shaped[tok as usize]) - lse) as f32,
                top,
            });
        }
        Ok(tok)
    }

    /// Truncates and draws from the candidates (in id order, bias and penalties applied).
    fn draw(&mut self) -> u32 {
        if self.opts.temperature <= 0.0 {
            return first_max(&self.cand);
        }
        self.top_k();
        self.top_p();
        self.min_p();
        let inv_t = 1.0 / self.opts.temperature;
        let max = self.cand[0].1; // sorted descending by top_k
        let mut sum = 0.0f64;
        for c in self.cand.iter_mut() {
            c.1 = ((c.1 - max) * inv_t).exp();
            sum += f64::from(c.1);
        }
        let mut r = self.rng.gen::<f64>() * sum;
        for &(tok, p) in &self.cand {
            r -= f64::from(p);
            if r < 0.0 {
                return tok;
            }
        }
        self.cand[self.cand.len() - 1].0
    }

    /// Sets the logit of every token the grammar does not allow here to `-inf`
    /// (candidates still indexed by token id).
    fn apply_grammar(&mut self, n_logits: usize) -> Result<(), SampleError> {
        let Some(c) = &self.opts.grammar else {
            return Ok(());
        };
        if c.vocab.len() != n_logits {
            return Err(SampleError::GrammarVocab {
                grammar: c.vocab.len(),
                logits: n_logits,
            });
        }
        if self.matcher.is_none() {
            let m = Matcher::new(c.grammar.clone(), c.vocab.clone())?;
            self.matcher = Some((m, TokenMask::new(c.vocab.len())));
        }
        let Some((m, mask)) = &mut self.matcher else {
            return Ok(());
        };
        m.fill_mask(mask)?;
        for c in self.cand.iter_mut() {
            if !mask.is_allowed(c.0) {
                c.1 = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Applies the penalties once per distinct token of the history, with its count there
    /// (candidates are still indexed by token id here).
    fn apply_penalty(&mut self) {
        if !self.penalises() {
            return;
        }
        self.seen.clear();
        self.seen.extend(self.history.iter().copied());
        self.seen.sort_unstable();
        let o = &self.opts;
        for run in self.seen.chunk_by(|a, b| a == b) {
            if let Some(c) = self.cand.get_mut(run[0] as usize) {
                c.1 = penalise(
                    c.1,
                    run.len(),
                    o.repeat_penalty,
                    o.frequency_penalty,
                    o.presence_penalty,
                );
            }
        }
    }

    /// Keeps the `top_k` best and sorts the candidates by descending logit (ties by id).
    fn top_k(&mut self) {
        let k = self.opts.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(by_logit_desc);
    }

    fn top_p(&mut self) {
        let p = self.opts.top_p;
        if p >= 1.0 {
            return;
        }
        let max = self.cand[0].1;
        let total: f64 = self.cand.iter().map(|c| f64::from((c.1 - max).exp())).sum();
        let mut cum = 0.0f64;
        let mut keep = self.cand.len();
        for (i, c) in self.cand.iter().enumerate() {
            cum += f64::from((c.1 - max).exp()) / total;
            if cum >= f64::from(p) {
                keep = i + 1;
                break;
            }
        }
        self.cand.truncate(keep.max(1));
    }

    fn min_p(&mut self) {
        let p = self.opts.min_p;
        if p <= 0.0 {
            return;
        }
        // prob_i >= p * prob_max  <=>  logit_i >= logit_max + ln p
        let threshold = self.cand[0].1 + p.ln();
        let keep = self.cand.iter().take_while(|c| c.1 >= threshold).count();
        self.cand.truncate(keep.max(1));
    }
}

/// llama.cpp's penalty of a logit `l` whose token appears `count > 0` times in the window.
pub(crate) fn penalise(l: f32, count: usize, repeat: f32, frequency: f32, presence: f32) -> f32 {
    let l = if l > 0.0 { l / repeat } else { l * repeat };
    l - count as f32 * frequency - presence
}

/// The model's own log-probability of `token` under `logits` and the `n` most likely
/// tokens (no bias, penalty or grammar: a prompt token's score, as OpenAI's `echo` with
/// `logprobs` reports it).
pub(crate) fn logprob_of(logits: &[f32], token: u32, n: usize) -> TokenLogprob {
    let cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .filter(|c| !c.1.is_nan() && c.1 != f32::NEG_INFINITY)
        .collect();
    let (lse, top) = log_softmax_top(&cand, n);
    let l = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    TokenLogprob {
        token,
        logprob: (f64::from(l) - lse) as f32,
        top,
    }
}

/// The log-sum-exp of the candidates' logits and the `n` best as (id, logprob), best
/// first, ties by id.
fn log_softmax_top(cand: &[(u32, f32)], n: usize) -> (f64, Vec<(u32, f32)>) {
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    let sum: f64 = cand
        .iter()
        .map(|c| (f64::from(c.1) - f64::from(max)).exp())
        .sum();
    let lse = f64::from(max) + sum.ln();
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for &c in cand {
        if top.len() == n && (n == 0 || by_logit_desc(&c, &top[n - 1]).is_ge()) {
            continue;
        }
        let at = top.partition_point(|t| by_logit_desc(t, &c).is_lt());
        top.insert(at, c);
        top.truncate(n);
    }
    let top = top
        .into_iter()
        .map(|(t, l)| (t, (f64::from(l) - lse) as f32))
        .collect();
    (lse, top)
}

fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Token of the first maximum (candidates in id order, NaNs already removed).
fn first_max(cand: &[(u32, f32)]) -> u32 {
    let mut best = cand[0];
    for &c in &cand[1..] {
        if c.1 > best.1 {
            best = c;
        }
    }
    best.0
}

#[cfg(test)]
mod tests;
