//! Several conversations over one loaded model (`engine::Slots`) on the default
//! model: slots interleaved give the same ids as each alone and as the one-shot
//! generator; a second chat turn prefills only its new tokens and answers as a fresh
//! prefill of the same prompt does; the slot with the longest common prefix is picked;
//! cancel and refusals.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use common::model_path;
use engine::generate::{load, LoadOptions};
use engine::{
    BatchKernel, Completion, GenerateOptions, Generator, Request, SamplerOptions, SlotEvent, Slots,
    SlotsOptions, StopReason,
};
use tokenizer::Message;

fn open() -> Arc<gguf::GgufFile> {
    Arc::new(gguf::GgufFile::open(model_path("SmolLM2-135M-Instruct.Q8_0.gguf")).unwrap())
}

fn slots(file: &Arc<gguf::GgufFile>, n: usize, batched: bool) -> Slots {
    let opts = SlotsOptions {
        slots: n,
        ctx: engine::generate::CtxRequest::Exact(512),
        batched,
        batch_kernel: BatchKernel::MatrixMatrix,
        ..Default::default()
    };
    Slots::load(file, &opts).unwrap()
}

fn request(prompt: Vec<u32>, max_tokens: usize, sampler: SamplerOptions) -> Request {
    Request {
        prompt,
        max_tokens: Some(max_tokens),
        sampler,
        ..Default::default()
    }
}

/// Steps until no slot is busy; the completions by slot, and the text each streamed.
fn run_all(s: &mut Slots) -> (Vec<Option<Completion>>, Vec<String>) {
    let mut done: Vec<Option<Completion>> = vec![None; s.n_slots()];
    let mut text = vec![String::new(); s.n_slots()];
    let mut steps = 0;
    while s.busy() > 0 {
        s.step(&mut |e| match e {
            SlotEvent::Text { slot, text: t } => text[slot].push_str(t),
            SlotEvent::Done { slot, completion } => {
                assert!(done[slot].is_none(), "slot {slot} finished twice");
                done[slot] = Some(completion.clone());
            }
            SlotEvent::Token { .. } | SlotEvent::PromptLogprob { .. } | SlotEvent::Check { .. } => {
            }
        })
        .unwrap();
        steps += 1;
        assert!(steps < 10_000, "the slots never finished");
    }
    (done, text)
}

/// One request alone on slot `slot` (cleared first).
fn alone(s: &mut Slots, slot: usize, req: Request) -> Completion {
    s.clear(slot).unwrap();
    s.submit(slot, req).unwrap();
    let (mut done, text) = run_all(s);
    let c = done[slot].take().unwrap();
    assert_eq!(text[slot], c.text, "streamed text = completion text");
    c
}

fn prompt_a(s: &Slots) -> Vec<u32> {
    s.tokenize("The capital of France is", false).unwrap()
}

/// A prompt longer than one prefill chunk (64), so its prefill spans steps in which the
/// other slot decodes.
fn prompt_b(s: &Slots) -> Vec<u32> {
    let text = "Here is a list of fruits: apples, pears, plums, cherries, grapes, lemons, \
                limes, oranges, peaches, apricots, mangoes, papayas, kiwis, figs, dates, \
                melons, bananas, coconuts, blueberries, raspberries and strawberries. \
                The one I like best is";
    let ids = s.tokenize(text, false).unwrap();
    assert!(ids.len() > 64, "prompt B is {} tokens", ids.len());
    ids
}

/// Slots interleaved give each slot's ids alone, batched (one submit per step, either
/// kernel) or not; a slot batched with `PerToken` gives the ids of the one-token decode
/// pipelines (unbatched: how the one-shot generator, one slot of this driver, decodes).
fn interleaved_vs_alone(batched: bool, kernel: BatchKernel) {
    let file = open();
    let mut s = slots(&file, 3, batched);
    s.set_batch_kernel(kernel);
    assert_eq!(s.n_slots(), 3);
    let info = s.info().clone();
    assert_eq!(info.ctx_per_slot, 512);
    assert_eq!(info.kv_bytes, 3 * info.kv_bytes_per_slot);
    // SmolLM2: 30 layers, 3 kv heads x 64, f16 keys and values
    assert_eq!(info.kv_bytes_per_slot, 2 * 30 * 512 * 192 * 2);
    let (a, b) = (prompt_a(&s), prompt_b(&s));
    let c = s.tokenize("def fibonacci(n):", false).unwrap();
    let sampled = SamplerOptions {
        temperature: 0.9,
        seed: 7,
        ..SamplerOptions::default()
    };
    for sampler in [SamplerOptions::greedy(), sampled] {
        let ra = request(a.clone(), 24, sampler.clone());
        let rb = request(b.clone(), 20, sampler.clone());
        let rc = request(c.clone(), 12, sampler.clone());
        // each alone, in a slot another one uses below
        let a_alone = alone(&mut s, 1, ra.clone());
        let b_alone = alone(&mut s, 2, rb.clone());
        let c_alone = alone(&mut s, 0, rc.clone());
        assert_eq!(a_alone.usage.generated_tokens, 24);
        assert_eq!(a_alone.ids.len(), 24);
        // together: A's tokens decode while B's prompt is still being prefilled, and C
        // finishes first (the batch shrinks from 3 to 2)
        for slot in 0..3 {
            s.clear(slot).unwrap();
        }
        s.submit(0, ra).unwrap();
        s.submit(1, rb).unwrap();
        s.submit(2, rc).unwrap();
        let (done, text) = run_all(&mut s);
        let both: Vec<Completion> = done.into_iter().map(Option::unwrap).collect();
        assert_eq!(both[0].ids, a_alone.ids, "slot A beside B, C ({sampler:?})");
        assert_eq!(both[1].ids, b_alone.ids, "slot B beside A, C ({sampler:?})");
        assert_eq!(both[2].ids, c_alone.ids, "slot C beside A, B ({sampler:?})");
        assert_eq!(text[0], a_alone.text);
        assert_eq!(text[1], b_alone.text);
        assert_eq!(both[0].finish_reason(), "length");
    }
    if !batched || kernel == BatchKernel::MatrixMatrix {
        // unbatched IS the one-token decode; the matrix-matrix step reduces differently
        // from it: it is checked against the GPU's own one-slot runs above, and against
        // the f32 reference in batched_step_matches_the_reference
        return;
    }

    // and the same ids as the one-token decode pipelines, one submit per token
    let in_batch = alone(&mut s, 1, request(a.clone(), 24, SamplerOptions::greedy()));
    s.set_batched(false);
    let one_token = alone(&mut s, 2, request(a, 24, SamplerOptions::greedy()));
    assert_eq!(in_batch.ids, one_token.ids);
    assert_eq!(in_batch.text, one_token.text);
}

#[test]
fn slots_interleaved_batched_give_the_ids_of_each_alone() {
    interleaved_vs_alone(true, BatchKernel::MatrixMatrix);
}

#[test]
fn slots_interleaved_batched_per_token_give_the_ids_of_each_alone_and_of_one_token_decode() {
    interleaved_vs_alone(true, BatchKernel::PerToken);
}

#[test]
fn slots_interleaved_unbatched_give_the_ids_of_each_alone() {
    interleaved_vs_alone(false, BatchKernel::MatrixMatrix);
}

#[test]
fn a_second_turn_prefills_only_its_new_tokens() {
    let file = open();
    let mut s = slots(&file, 2, false);
    let user1 = Message::new("user", "What is the capital of France?");
    let p1 = s.chat_prompt(std::slice::from_ref(&user1)).unwrap();
    s.submit(0, request(p1.clone(), 32, SamplerOptions::greedy()))
        .unwrap();
    let (done, _) = run_all(&mut s);
    let t1 = done[0].clone().unwrap();
    assert_eq!(t1.usage.reused_tokens, 0);
    assert_eq!(t1.usage.prefilled_tokens, p1.len());
    assert!(!t1.text.is_empty());
    // the slot holds the prompt and every answer token it was fed (all but a last one
    // that stopped the answer unfed)
    let held = s.cached(0).to_vec();
    assert_eq!(&held[..p1.len()], &p1[..]);
    let fed = &held[p1.len()..];
    assert!(t1.ids.starts_with(fed) && fed.len() + 1 >= t1.ids.len());

    let turn2 = [
        user1,
        Message::new("assistant", t1.text.clone()),
        Message::new("user", "And of Germany?"),
    ];
    let p2 = s.chat_prompt(&turn2).unwrap();
    let lcp = held.iter().zip(&p2).take_while(|(a, b)| a == b).count();
    assert!(
        lcp >= p1.len(),
        "turn 2 extends turn 1 ({lcp} < {})",
        p1.len()
    );
    assert_eq!(
        s.pick_slot(&p2),
        Some(0),
        "the slot holding turn 1 is picked"
    );
    let adm = s
        .submit(0, request(p2.clone(), 32, SamplerOptions::greedy()))
        .unwrap();
    assert_eq!(adm.reused, lcp);
    assert_eq!(adm.to_prefill, p2.len() - lcp);
    let (done, _) = run_all(&mut s);
    let t2 = done[0].clone().unwrap();
    assert_eq!(t2.usage.prompt_tokens, p2.len());
    assert_eq!(t2.usage.reused_tokens, lcp);
    assert_eq!(t2.usage.prefilled_tokens, p2.len() - lcp);
    let c = s.counters();
    assert_eq!(c.requests, 2);
    assert_eq!(c.prefilled_tokens as usize, p1.len() + p2.len() - lcp);
    assert_eq!(c.reused_tokens as usize, lcp);

    // the same answer as the whole turn-2 prompt prefilled from scratch in another slot
    let fresh = alone(&mut s, 1, request(p2.clone(), 32, SamplerOptions::greedy()));
    assert_eq!(fresh.usage.reused_tokens, 0);
    assert_eq!(t2.ids, fresh.ids, "reused-prefix answer vs fresh prefill");

    // a prompt that diverges inside the cache: truncated to the common prefix
    let mut other = p2[..p1.len() - 3].to_vec();
    other.extend_from_slice(&s.tokenize(" Tell me a joke.", false).unwrap());
    let adm = s
        .submit(0, request(other, 4, SamplerOptions::greedy()))
        .unwrap();
    assert_eq!(adm.reused, p1.len() - 3);
    run_all(&mut s);
}

/// Several answers to one prompt (`n` > 1) share one prefill: the first slot prefills the
/// prompt, the others wait for it and copy its K/V rows on the device, then feed only the
/// last prompt token; each answer is the one its seed gives alone. A cancelled source
/// leaves the waiting slot to prefill the rest itself.
#[test]
fn answers_to_one_prompt_share_its_prefill() {
    let file = open();
    let mut s = slots(&file, 3, true);
    let p = prompt_b(&s);
    let req = |seed| {
        let sampler = SamplerOptions {
            temperature: 0.9,
            seed,
            ..SamplerOptions::default()
        };
        request(p.clone(), 12, sampler)
    };
    let solo: Vec<Completion> = (0..3).map(|k| alone(&mut s, k, req(k as u64))).collect();
    for c in &solo {
        assert_eq!(
            c.usage.reused_tokens, 0,
            "alone: no busy slot to share with"
        );
        assert_eq!(c.usage.prefilled_tokens, p.len());
    }
    assert_ne!(solo[0].ids, solo[1].ids, "the seeds draw different answers");
    for slot in 0..3 {
        s.clear(slot).unwrap();
    }
    let before = s.counters();
    let adm: Vec<_> = (0..3)
        .map(|k| s.submit(k, req(k as u64)).unwrap())
        .collect();
    assert_eq!(adm[0].shared_from, None);
    assert_eq!(adm[1].shared_from, Some(0));
    assert_eq!(adm[2].shared_from, Some(0));
    let (done, _) = run_all(&mut s);
    for (k, c) in done.into_iter().enumerate() {
        let c = c.unwrap();
        assert_eq!(c.ids, solo[k].ids, "answer {k} shared vs alone");
        let copied = if k == 0 { 0 } else { p.len() - 1 };
        assert_eq!(c.usage.reused_tokens, copied, "answer {k}");
        assert_eq!(c.usage.prefilled_tokens, p.len() - copied, "answer {k}");
    }
    let after = s.counters();
    assert_eq!(
        after.shared_tokens - before.shared_tokens,
        2 * (p.len() as u64 - 1)
    );
    assert_eq!(
        after.prefilled_tokens - before.prefilled_tokens,
        p.len() as u64 + 2
    );

    // the source is cancelled mid-prefill: the waiting slot copies what is there and
    // prefills the rest, and still gives its seed's answer
    for slot in 0..3 {
        s.clear(slot).unwrap();
    }
    s.submit(0, req(0)).unwrap();
    assert_eq!(s.submit(1, req(1)).unwrap().shared_from, Some(0));
    s.step(&mut |_| {}).unwrap();
    let part = s.cached(0).len();
    assert!(part > 0 && part < p.len(), "slot 0 is mid-prefill ({part})");
    s.cancel(0);
    let (done, _) = run_all(&mut s);
    let c = done[1].clone().unwrap();
    assert_eq!(c.ids, solo[1].ids, "answer after a cancelled source");
    assert_eq!(c.usage.reused_tokens, part);
    assert_eq!(c.usage.prefilled_tokens, p.len() - part);
}

#[test]
fn pick_cancel_and_refusals() {
    let file = open();
    let mut s = slots(&file, 3, true);
    let (a, b) = (prompt_a(&s), prompt_b(&s));
    alone(&mut s, 0, request(a.clone(), 4, SamplerOptions::greedy()));
    alone(&mut s, 2, request(b.clone(), 4, SamplerOptions::greedy()));
    let mut a_more = a.clone();
    a_more.extend_from_slice(&[28, 29]);
    let mut b_more = b.clone();
    b_more.push(30);
    assert_eq!(s.pick_slot(&a_more), Some(0));
    assert_eq!(s.pick_slot(&b_more), Some(2));
    // nothing shared: the least recently used slot (1 was never used)
    assert_eq!(s.pick_slot(&[17, 18]), Some(1));

    // a busy slot is refused and not picked
    s.submit(0, request(a_more.clone(), 100, SamplerOptions::greedy()))
        .unwrap();
    assert!(s
        .submit(0, request(a.clone(), 4, SamplerOptions::greedy()))
        .is_err());
    assert_ne!(s.pick_slot(&a_more), Some(0));
    // cancel: finishes at the next step, with what it had
    s.step(&mut |_| {}).unwrap();
    s.cancel(0);
    let mut reason = None;
    s.step(&mut |e| {
        if let SlotEvent::Done {
            slot: 0,
            completion,
        } = e
        {
            reason = Some((completion.stop, completion.finish_reason()));
        }
    })
    .unwrap();
    assert_eq!(reason, Some((StopReason::Cancelled, "cancelled")));
    assert_eq!(s.busy(), 0);

    // refusals: empty prompt, prompt filling the context, ids outside the vocabulary,
    // max_tokens 0, a slot that does not exist
    let greedy = SamplerOptions::greedy();
    assert!(s.submit(1, request(vec![], 4, greedy.clone())).is_err());
    assert!(s
        .submit(1, request(vec![5; 512], 4, greedy.clone()))
        .is_err());
    assert!(s
        .submit(1, request(vec![1 << 30], 4, greedy.clone()))
        .is_err());
    assert!(s.submit(1, request(a.clone(), 0, greedy.clone())).is_err());
    assert!(s.submit(3, request(a.clone(), 4, greedy.clone())).is_err());
    assert_eq!(s.busy(), 0);

    // a request that runs into the end of the slot's context stops with `length`
    let long = vec![a[0]; 500];
    let req = Request {
        ignore_eos: true,
        ..request(long, 100, greedy)
    };
    s.submit(1, req).unwrap();
    let (done, _) = run_all(&mut s);
    let c = done[1].clone().unwrap();
    assert_eq!(c.stop, StopReason::ContextFull);
    assert_eq!(c.finish_reason(), "length");
    assert!(s.cached(1).len() < 512);
}

/// Largest |gpu - reference| logit allowed (`common::LOGIT_TOL`).
const TOL: f32 = common::LOGIT_TOL;

/// Two slots at different positions advanced by `Session::decode_batch` (one submit per
/// step, per-token positions and cache rows), with either matmul kernel, on a validating
/// context: every slot's logits against the f32 reference's for its own sequence.
#[test]
fn batched_step_matches_the_reference() {
    let Some(ctx) = common::ctx() else { return };
    let file = open();
    let opts = engine::SessionOptions {
        ctx_len: 64,
        slots: 2,
        ..Default::default()
    };
    let mut s = engine::Session::new(ctx.clone(), file.clone(), &opts).unwrap();
    let model = reference::Model::load(&file).unwrap();
    for mm in [true, false] {
        reference_run(&mut s, &model, mm);
    }
    common::assert_no_validation_errors(&ctx);
}

fn reference_run(s: &mut engine::Session, model: &reference::Model, mm: bool) {
    let prompts: [&[u32]; 2] = [
        &[504, 3575, 282, 4649, 314],
        &[1604, 3987, 46477, 24, 94, 727, 28],
    ];
    let mut states: Vec<reference::State> = (0..2)
        .map(|_| reference::State::new(model.config(), 64))
        .collect();
    let mut next = [0u32; 2];
    for (slot, p) in prompts.iter().enumerate() {
        s.select_slot(slot).unwrap();
        s.reset();
        s.prefill(p).unwrap();
        for (pos, &t) in p.iter().enumerate() {
            reference::forward(model, &mut states[slot], t, pos, &mut |_, _| {}).unwrap();
        }
        next[slot] = s.last_argmax().unwrap();
    }
    let mut worst = 0.0f32;
    let mut pos = [prompts[0].len(), prompts[1].len()];
    for _ in 0..4 {
        let items = [(0usize, next[0]), (1usize, next[1])];
        s.decode_batch(&items, true, mm).unwrap();
        for (k, &(slot, token)) in items.iter().enumerate() {
            let at = pos[slot];
            pos[slot] += 1;
            let want = reference::forward(model, &mut states[slot], token, at, &mut |_, _| {})
                .unwrap()
                .to_vec();
            let got = s.batch_logits(k).unwrap().to_vec();
            let d = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            worst = worst.max(d);
            assert!(
                d < TOL,
                "slot {slot} at position {at}: max |gpu - ref| = {d}"
            );
            next[slot] = s.batch_argmax(k, slot).unwrap();
        }
    }
    println!("batched step (matrix-matrix: {mm}): max |gpu - reference| logit = {worst}");
}

/// A JSON schema holds the output to it: greedy decoding of a chat prompt, through the
/// slots and through the one-shot generator (one slot of the same driver, fed
/// `GenerateOptions`), gives the same ids, and the text is JSON that follows the
/// schema, properties in the schema's order. Unconstrained, the model answers in prose.
#[test]
fn a_json_schema_holds_slots_and_generator_to_it() {
    let file = open();
    let mut s = slots(&file, 1, false);
    let tok = Arc::new(tokenizer::Tokenizer::from_gguf(file.gguf()).unwrap());
    let template = tokenizer::ChatTemplate::from_gguf(file.gguf())
        .unwrap()
        .unwrap();
    let messages = [Message::new(
        "user",
        "Give the name, the country and the population in millions of the capital of France.",
    )];
    let prompt = engine::generate::chat_prompt_ids(&tok, &template, &messages, false).unwrap();
    let schema = r#"{
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "country": {"enum": ["France", "Germany", "Italy"]},
            "population": {"type": "integer", "minimum": 0, "maximum": 100}
        },
        "required": ["name", "country", "population"],
        "additionalProperties": false
    }"#;
    let grammar = Arc::new(grammar::CompiledGrammar::from_json_schema(schema).unwrap());
    let vocab = Arc::new(engine::grammar_vocab(&tok));
    let constrained = SamplerOptions {
        grammar: Some(engine::Constraint::new(grammar, vocab)),
        ..SamplerOptions::greedy()
    };
    let free = alone(
        &mut s,
        0,
        request(prompt.clone(), 60, SamplerOptions::greedy()),
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(free.text.trim()).is_err(),
        "the free answer is already JSON, the test shows nothing: {}",
        free.text
    );
    let held = alone(&mut s, 0, request(prompt.clone(), 60, constrained.clone()));
    assert_eq!(held.finish_reason(), "stop", "{}", held.text);
    let v: serde_json::Value = serde_json::from_str(&held.text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", held.text));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 3, "{v}");
    let order: Vec<usize> = ["\"name\"", "\"country\"", "\"population\""]
        .iter()
        .map(|k| held.text.find(k).unwrap())
        .collect();
    assert!(
        order.is_sorted(),
        "properties in the schema's order: {}",
        held.text
    );
    assert!(
        v["name"].as_str().is_some_and(|n| n.chars().count() <= 20),
        "{v}"
    );
    assert!(["France", "Germany", "Italy"].contains(&v["country"].as_str().unwrap()));
    assert!(
        v["population"]
            .as_i64()
            .is_some_and(|p| (0..=100).contains(&p)),
        "{v}"
    );

    let loaded = load(&file, &LoadOptions::default()).unwrap();
    let mut gen = Generator::new(Box::new(loaded.session), tok);
    let opts = GenerateOptions {
        max_tokens: Some(60),
        sampler: constrained,
        ..Default::default()
    };
    let one_shot = gen
        .generate(&prompt, &opts, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(one_shot.ids, held.ids);
    assert_eq!(one_shot.stop, StopReason::Eog);
}

/// `ignore_eos` bans the end-of-generation tokens: batched, unbatched and the one-shot
/// generator give the same ids, none of them an end token, for a chat prompt whose free
/// greedy answer ends early.
#[test]
fn ignore_eos_bans_the_end_tokens_on_every_path() {
    let file = open();
    let tok = Arc::new(tokenizer::Tokenizer::from_gguf(file.gguf()).unwrap());
    let template = tokenizer::ChatTemplate::from_gguf(file.gguf())
        .unwrap()
        .unwrap();
    let prompt = engine::generate::chat_prompt_ids(
        &tok,
        &template,
        &[Message::new("user", "Say hi.")],
        false,
    )
    .unwrap();
    let n = 40;
    let mut unbatched = slots(&file, 1, false);
    let free = alone(
        &mut unbatched,
        0,
        request(prompt.clone(), n, SamplerOptions::greedy()),
    );
    assert!(
        free.ids.len() < n,
        "the free answer does not end: {}",
        free.text
    );
    let banned = Request {
        ignore_eos: true,
        ..request(prompt.clone(), n, SamplerOptions::greedy())
    };
    let a = alone(&mut unbatched, 0, banned.clone());
    assert_eq!(a.ids.len(), n);
    assert!(a.ids.iter().all(|&t| !tok.is_eog(t)), "{:?}", a.ids);
    assert!(!a.text.contains("<|im_end|>"), "{}", a.text);
    // the ids up to where the free answer ended are the free answer's
    assert_eq!(a.ids[..free.ids.len()], free.ids[..]);
    let mut batched = slots(&file, 2, true);
    batched.set_batch_kernel(BatchKernel::PerToken);
    let b = alone(&mut batched, 1, banned);
    assert_eq!(b.ids, a.ids);
    let loaded = load(&file, &LoadOptions::default()).unwrap();
    let mut gen = Generator::new(Box::new(loaded.session), tok);
    let opts = GenerateOptions {
        max_tokens: Some(n),
        ignore_eos: true,
        sampler: SamplerOptions::greedy(),
        ..Default::default()
    };
    let g = gen
        .generate(&prompt, &opts, &mut |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(g.ids, a.ids);
}
