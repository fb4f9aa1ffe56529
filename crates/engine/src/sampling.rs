//! Token sampling on the CPU, with llama.cpp's defaults and order of operations
//! (llama.cpp `common/sampling.cpp`, `src/llama-sampling.cpp`):
//! repetition penalty → top-k → top-p → min-p → temperature → draw from the softmax.
//!
//! A temperature of 0 (or below) is greedy: the first maximum after the penalty. A seeded
//! generator makes every run reproducible. Nothing is allocated per token once the
//! candidate buffer has grown to the vocabulary size.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    /// How many of the latest tokens the penalty looks at; 0 disables it.
    pub repeat_last_n: usize,
    /// Seed of the generator.
    pub seed: u64,
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
            seed: 0x5EED,
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
}

/// A seeded sampler that remembers the last `repeat_last_n` tokens.
pub struct Sampler {
    opts: SamplerOptions,
    rng: StdRng,
    /// The latest tokens, oldest first, at most `repeat_last_n`.
    history: VecDeque<u32>,
    /// Scratch: (token, logit) candidates, reused every call.
    cand: Vec<(u32, f32)>,
    /// Scratch: distinct penalised tokens.
    seen: Vec<u32>,
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
        }
    }

    pub fn options(&self) -> &SamplerOptions {
        &self.opts
    }

    /// True when the choice is the plain argmax of the logits, so the engine can take the
    /// argmax on the GPU and read back 4 bytes instead of the logits.
    pub fn is_greedy(&self) -> bool {
        self.opts.temperature <= 0.0 && !self.penalises()
    }

    fn penalises(&self) -> bool {
        self.opts.repeat_penalty != 1.0 && self.opts.repeat_last_n > 0
    }

    /// Records a token (prompt tokens included) for the repetition penalty.
    pub fn accept(&mut self, token: u32) {
        if self.opts.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.opts.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Forgets the history (a new conversation); the generator keeps its state.
    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// Draws the next token from `logits` (one per vocabulary entry). Does not call
    /// [`Sampler::accept`]; the caller records the token it keeps.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::Empty);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        self.apply_penalty();
        self.cand
            .retain(|&(_, l)| !l.is_nan() && l != f32::NEG_INFINITY);
        if self.cand.is_empty() {
            return Err(SampleError::NoCandidate { n: logits.len() });
        }
        if self.opts.temperature <= 0.0 {
            return Ok(first_max(&self.cand));
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
                return Ok(tok);
            }
        }
        Ok(self.cand[self.cand.len() - 1].0)
    }

    /// Applies the repetition penalty once per distinct token of the history (candidates
    /// are still indexed by token id here).
    fn apply_penalty(&mut self) {
        if !self.penalises() {
            return;
        }
        self.seen.clear();
        self.seen.extend(self.history.iter().copied());
        self.seen.sort_unstable();
        self.seen.dedup();
        let p = self.opts.repeat_penalty;
        for &t in &self.seen {
            if let Some(c) = self.cand.get_mut(t as usize) {
                c.1 = if c.1 > 0.0 { c.1 / p } else { c.1 * p };
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
mod tests {
    use super::*;

    fn opts(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerOptions {
        SamplerOptions {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 7,
        }
    }

    /// Frequencies of `n` draws.
    fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
        let mut h = vec![0.0; logits.len()];
        for _ in 0..n {
            h[s.sample(logits).unwrap() as usize] += 1.0 / n as f64;
        }
        h
    }

    #[test]
    fn defaults_are_llama_cpp_s() {
        let o = SamplerOptions::default();
        assert_eq!(
            (o.temperature, o.top_k, o.top_p, o.min_p),
            (0.8, 40, 0.95, 0.05)
        );
        assert_eq!((o.repeat_penalty, o.repeat_last_n), (1.0, 64));
        assert!(!Sampler::new(o).is_greedy());
        assert!(Sampler::new(SamplerOptions::greedy()).is_greedy());
    }

    #[test]
    fn greedy_is_the_first_argmax() {
        let mut s = Sampler::new(SamplerOptions::greedy());
        assert_eq!(s.sample(&[0.5, 3.0, -1.0, 3.0, 2.9]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NAN, -2.0, -1.0]).unwrap(), 2);
        assert_eq!(s.sample(&[]), Err(SampleError::Empty));
        assert_eq!(
            s.sample(&[f32::NAN, f32::NEG_INFINITY]),
            Err(SampleError::NoCandidate { n: 2 })
        );
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let mut s = Sampler::new(opts(5.0, 1, 1.0, 0.0));
        for _ in 0..200 {
            assert_eq!(s.sample(&[0.1, 0.2, 0.15, -3.0]).unwrap(), 1);
        }
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplerOptions {
                seed,
                ..opts(1.5, 0, 1.0, 0.0)
            });
            (0..64)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn draws_follow_the_softmax() {
        // probabilities 0.5, 0.3, 0.2; 40k draws: standard error < 0.0025, allow 0.015
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut s = Sampler::new(opts(1.0, 0, 1.0, 0.0));
        let h = histogram(&mut s, &logits, 40_000);
        for (f, p) in h.iter().zip([0.5, 0.3, 0.2]) {
            assert!((f - p).abs() < 0.015, "{h:?}");
        }
        // temperature 0.5 squares the odds: 25:9:4
        let mut s = Sampler::new(opts(0.5, 0, 1.0, 0.0));
        let h = histogram(&mut s, &logits, 40_000);
        for (f, p) in h.iter().zip([25.0 / 38.0, 9.0 / 38.0, 4.0 / 38.0]) {
            assert!((f - p).abs() < 0.015, "{h:?}");
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        // top_p 0.6: 0.5 < 0.6 <= 0.8, so tokens 0 and 1 remain, renormalised 5:3
        let mut s = Sampler::new(opts(1.0, 0, 0.6, 0.0));
        let h = histogram(&mut s, &logits, 20_000);
        assert_eq!((h[2], h[3]), (0.0, 0.0), "{h:?}");
        assert!((h[0] - 0.625).abs() < 0.02, "{h:?}");
        // min_p 0.25: keeps p >= 0.125, i.e. tokens 0, 1, 2
        let mut s = Sampler::new(opts(1.0, 0, 1.0, 0.25));
        let h = histogram(&mut s, &logits, 20_000);
        assert_eq!(h[3], 0.0, "{h:?}");
        assert!(h[2] > 0.1, "{h:?}");
        // top_k 2 keeps the two best
        let mut s = Sampler::new(opts(1.0, 2, 1.0, 0.0));
        let h = histogram(&mut s, &logits, 5_000);
        assert_eq!((h[2], h[3]), (0.0, 0.0), "{h:?}");
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative() {
        let mut o = SamplerOptions::greedy();
        o.repeat_penalty = 2.0;
        o.repeat_last_n = 2;
        let mut s = Sampler::new(o);
        assert!(!s.is_greedy());
        // token 0 (3.0) penalised to 1.5 < token 1 (2.0)
        s.accept(0);
        assert_eq!(s.sample(&[3.0, 2.0, -1.0]).unwrap(), 1);
        // a token seen twice is penalised once: 3.0 -> 1.5 > 1.4
        s.accept(0);
        assert_eq!(s.sample(&[3.0, 1.4, -1.0]).unwrap(), 0);
        // negative logits get more negative: -1 -> -2 < -1.5
        let mut s2 = Sampler::new(SamplerOptions {
            repeat_penalty: 2.0,
            repeat_last_n: 4,
            ..SamplerOptions::greedy()
        });
        s2.accept(0);
        assert_eq!(s2.sample(&[-1.0, -1.5]).unwrap(), 1);
        // history window: only the last 2 tokens count
        s.accept(5);
        s.accept(6);
        assert_eq!(s.sample(&[3.0, 2.0, -1.0]).unwrap(), 0);
    }
}
