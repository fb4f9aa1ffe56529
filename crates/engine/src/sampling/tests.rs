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
        ..SamplerOptions::default()
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

#[test]
fn penalties_match_a_hand_computation() {
    // llama.cpp: l > 0 divided, l <= 0 multiplied, then - count * freq - presence
    assert_eq!(penalise(3.0, 2, 1.5, 0.25, 0.5), 3.0 / 1.5 - 0.5 - 0.5);
    assert_eq!(penalise(-1.0, 1, 2.0, 0.0, 0.0), -2.0);
    assert_eq!(penalise(0.0, 3, 2.0, 1.0, 0.0), -3.0);
    // token 0 seen 3 times, token 1 once, token 2 never (window of 4)
    let mut s = Sampler::new(SamplerOptions {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        repeat_last_n: 4,
        logprobs: Some(3),
        ..SamplerOptions::greedy()
    });
    assert!(!s.is_greedy());
    for t in [7, 0, 0, 1, 0] {
        s.accept(t); // the 7 falls out of the window
    }
    // 4.0 - 1.5 - 0.25 = 2.25; 2.6 - 0.5 - 0.25 = 1.85; 2.0
    assert_eq!(s.sample(&[4.0, 2.6, 2.0]).unwrap(), 0);
    let lp = s.take_logprob().unwrap();
    let shaped = [2.25f64, 1.85, 2.0];
    let lse = shaped.iter().map(|l| l.exp()).sum::<f64>().ln();
    let want: Vec<(u32, f32)> = [0usize, 2, 1]
        .iter()
        .map(|&i| (i as u32, (shaped[i] - lse) as f32))
        .collect();
    assert_eq!(lp.token, 0);
    assert!((lp.logprob - want[0].1).abs() < 1e-6, "{lp:?}");
    for (got, want) in lp.top.iter().zip(&want) {
        assert_eq!(got.0, want.0, "{lp:?}");
        assert!((got.1 - want.1).abs() < 1e-6, "{lp:?}");
    }
    // a token never seen is untouched: the window without token 0 picks it
    let mut s = Sampler::new(SamplerOptions {
        frequency_penalty: 10.0,
        repeat_last_n: 4,
        ..SamplerOptions::greedy()
    });
    s.accept(0);
    assert_eq!(s.sample(&[4.0, 2.6, 2.0]).unwrap(), 1);
}

#[test]
fn logit_bias_bans_and_forces() {
    let mut s = Sampler::new(SamplerOptions {
        logit_bias: vec![(0, f32::NEG_INFINITY)],
        ..SamplerOptions::greedy()
    });
    // a ban keeps the GPU's argmax, with the logits read when it picks the banned token
    assert!(s.is_greedy() && s.has_bans() && s.bans(0) && !s.bans(1));
    assert_eq!(s.sample(&[4.0, 2.6, 2.0]).unwrap(), 1);
    let s = Sampler::new(SamplerOptions {
        logit_bias: vec![(0, f32::NEG_INFINITY), (1, 0.5)],
        ..SamplerOptions::greedy()
    });
    assert!(!s.is_greedy(), "a finite bias needs the logits");
    let mut s = Sampler::new(SamplerOptions {
        logit_bias: vec![(2, 100.0)],
        ..SamplerOptions::default()
    });
    for _ in 0..50 {
        assert_eq!(s.sample(&[4.0, 2.6, 2.0]).unwrap(), 2);
    }
}

#[test]
fn logprobs_are_the_log_softmax_before_temperature() {
    let logits = [1.0f32, 3.0, 2.0, 3.0];
    let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
    let mut s = Sampler::new(SamplerOptions {
        temperature: 0.3,
        logprobs: Some(2),
        ..SamplerOptions::default()
    });
    for _ in 0..20 {
        let t = s.sample(&logits).unwrap();
        let lp = s.take_logprob().unwrap();
        assert_eq!(lp.token, t);
        let want = (f64::from(logits[t as usize]) - lse) as f32;
        assert!((lp.logprob - want).abs() < 1e-6);
        // ties by id: token 1 before token 3
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
        let sum: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
        assert!(sum <= 1.0);
    }
    let mut s = Sampler::new(SamplerOptions::greedy());
    s.sample(&logits).unwrap();
    assert_eq!(s.take_logprob(), None);
}

fn constraint(gbnf: &str, tokens: &[&str]) -> Constraint {
    // token 0 ends generation (no text)
    let bytes: Vec<Vec<u8>> = tokens.iter().map(|t| t.as_bytes().to_vec()).collect();
    Constraint::new(
        Arc::new(CompiledGrammar::from_gbnf(gbnf).unwrap()),
        Arc::new(Vocab::new(&bytes, &[0])),
    )
}

#[test]
fn a_grammar_masks_every_step_and_ends_only_when_complete() {
    let c = constraint(r#"root ::= "ab" "c"*"#, &["", "a", "b", "ab", "c"]);
    let mut s = Sampler::new(SamplerOptions {
        grammar: Some(c),
        logprobs: Some(5),
        ..SamplerOptions::greedy()
    });
    assert!(!s.is_greedy(), "the mask needs the logits");
    // "b" and the end are the model's favourites, but only "a" or "ab" may start
    let logits = [9.0, 1.0, 8.0, 0.5, 0.0];
    assert_eq!(s.sample(&logits).unwrap(), 1);
    let lp = s.take_logprob().unwrap();
    // the log-softmax of what the mask let through: "a" and "ab"
    let lse = (1.0f64.exp() + 0.5f64.exp()).ln();
    assert!((lp.logprob - (1.0 - lse) as f32).abs() < 1e-6, "{lp:?}");
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
    // after "a": only "b"
    assert_eq!(s.sample(&logits).unwrap(), 2);
    // complete: the end (or more "c")
    assert_eq!(s.sample(&logits).unwrap(), 0);
    // greedy on other logits picks "c" and the grammar goes on
    let mut s = Sampler::new(SamplerOptions {
        grammar: Some(constraint(
            r#"root ::= "ab" "c"*"#,
            &["", "a", "b", "ab", "c"],
        )),
        ..SamplerOptions::greedy()
    });
    let prefer_c = [0.0, 1.0, 0.0, 2.0, 5.0];
    assert_eq!(s.sample(&prefer_c).unwrap(), 3);
    assert_eq!(s.sample(&prefer_c).unwrap(), 4);
    assert_eq!(s.sample(&prefer_c).unwrap(), 4);
}

#[test]
fn a_grammar_the_logits_cannot_follow_is_an_error_not_a_free_token() {
    // the end is banned by the bias, and the grammar allows nothing else
    let mut s = Sampler::new(SamplerOptions {
        grammar: Some(constraint(r#"root ::= "a""#, &["", "a", "b"])),
        logit_bias: vec![(0, f32::NEG_INFINITY)],
        ..SamplerOptions::default()
    });
    assert_eq!(s.sample(&[0.0, 0.0, 5.0]).unwrap(), 1);
    assert_eq!(s.sample(&[0.0, 0.0, 5.0]), Err(SampleError::GrammarStuck));
    // logits from another vocabulary
    let mut s = Sampler::new(SamplerOptions {
        grammar: Some(constraint(r#"root ::= "a""#, &["", "a", "b"])),
        ..SamplerOptions::greedy()
    });
    assert_eq!(
        s.sample(&[0.0, 1.0]),
        Err(SampleError::GrammarVocab {
            grammar: 3,
            logits: 2
        })
    );
}
